"""Helpers for the UI end-to-end test: a real `dagster dev`, its GraphQL API, headless Chromium.

Everything here talks to real processes over real sockets; nothing is mocked. Every wait is
bounded and every process is started in its own session so it can be torn down as a group.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

LOCATION = "marin_assets"  # workspace.yaml's location_name
REPOSITORY = "__repository__"  # the implicit repository of a Definitions object
TERMINAL = ("SUCCESS", "FAILURE", "CANCELED")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "<no log>"


def kill_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGINT the leader (graceful shutdown of its children), then SIGKILL whatever is left."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=grace_s)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the group id is the leader's pid (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def graphql(url: str, query: str, variables: dict | None = None, timeout: float = 60) -> dict:
    """One GraphQL request to the webserver at ``url`` (what the UI sends); errors raise."""
    body = json.dumps({"query": query, "variables": variables or {}}).encode()
    req = urllib.request.Request(f"{url}/graphql", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        out = json.load(resp)
    if out.get("errors"):
        raise AssertionError(f"GraphQL errors: {out['errors']}")
    return out["data"]


def wait_location_loaded(url: str, proc: subprocess.Popen, log_path: Path, location: str, timeout_s: float) -> float:
    """Wait until the webserver at ``url`` answers and ``location`` is loaded; return seconds waited."""
    start = time.monotonic()
    last = "no answer yet"
    while time.monotonic() - start < timeout_s:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args[0]} exited with {proc.returncode}:\n{tail(log_path)}")
        try:
            data = graphql(
                url,
                """{ workspaceOrError { __typename ... on Workspace {
                locationEntries { name loadStatus
                  locationOrLoadError { __typename ... on PythonError { message } } } } } }""",
                timeout=15,
            )
            entries = data["workspaceOrError"].get("locationEntries", [])
            entry = next((e for e in entries if e["name"] == location), None)
            if entry and entry["loadStatus"] == "LOADED":
                loaded = entry["locationOrLoadError"]
                if loaded["__typename"] == "PythonError":
                    raise AssertionError(f"code location failed to load: {loaded['message']}")
                return time.monotonic() - start
            last = f"location entries: {entries}"
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as err:
            last = repr(err)
        time.sleep(2)
    raise AssertionError(f"{location} not loaded after {timeout_s:.0f}s ({last}):\n{tail(log_path)}")


def start_process(argv: list[str], cwd: Path, env: dict[str, str], log_path: Path) -> subprocess.Popen:
    """A Dagster process in its own session (``kill_group`` tears it down with its children), output to ``log_path``."""
    with open(log_path, "ab") as log:  # the child holds its own descriptor
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # SIGINT is a graceful stop for dagster; a backgrounded shell may have ignored it.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.default_int_handler),
        )


class DagsterDev:
    """`dagster dev` (webserver + daemon + code server) on 127.0.0.1:<port> in its own session."""

    def __init__(
        self, repo: Path, home: Path, prefix: Path, log_path: Path, dagster_bin: str, extra_env: dict[str, str] | None = None
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.home, self.prefix, self.log_path = home, prefix, log_path
        home.mkdir(parents=True, exist_ok=True)
        # The instance config under test is the repo's own dagster.yaml (the routing launcher).
        (home / "dagster.yaml").write_text((repo / "dagster.yaml").read_text())
        self.env = {
            **os.environ,
            "DAGSTER_HOME": str(home),
            "MARIN_PREFIX": str(prefix),
            "JAX_PLATFORMS": "cpu",
            "WANDB_MODE": "offline",
            "PYTHONUNBUFFERED": "1",
            **(extra_env or {}),
        }
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            [dagster_bin, "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(self.port)],
            cwd=repo,
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # A shell that backgrounds pytest ignores SIGINT, and dagster maps SIGTERM onto the
            # SIGINT handler: restore the default so stop() can shut it down gracefully.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.default_int_handler),
        )

    def gql(self, query: str, variables: dict | None = None, timeout: float = 60) -> dict:
        return graphql(self.url, query, variables, timeout)

    def wait_ready(self, timeout_s: float) -> float:
        """Wait until the webserver answers and the code location is loaded; return seconds waited."""
        return wait_location_loaded(self.url, self.proc, self.log_path, LOCATION, timeout_s)

    def run_info(self, run_id: str) -> dict:
        data = self.gql(
            """query($id: ID!) { runOrError(runId: $id) { __typename
            ... on Run { runId status jobName stepKeysToExecute tags { key value }
              eventConnection { events { __typename ... on MessageEvent { message } } } }
            ... on RunNotFoundError { message } } }""",
            {"id": run_id},
        )
        return data["runOrError"]

    def wait_for_run(self, run_id: str, timeout_s: float) -> dict:
        start, status = time.monotonic(), "unknown"
        while time.monotonic() - start < timeout_s:
            run = self.run_info(run_id)
            if run["__typename"] == "Run":
                status = run["status"]
                if status in TERMINAL:
                    return run
            time.sleep(2)
        raise AssertionError(f"run {run_id} still {status} after {timeout_s:.0f}s:\n{tail(self.log_path)}")

    def stop(self) -> None:
        kill_group(self.proc, grace_s=30)
        self._log.close()


def run_tags(run: dict) -> dict[str, str]:
    return {t["key"]: t["value"] for t in run["tags"]}


def run_messages(run: dict) -> list[str]:
    return [e.get("message") or "" for e in run["eventConnection"]["events"]]


# ---- headless Chromium ------------------------------------------------------------------------


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None


def chromium(binary: str, profile: Path, url: str, *, mode: list[str], budget_ms: int, timeout_s: float) -> str:
    """Run headless Chromium once on ``url`` and return its stdout (the DOM for --dump-dom).

    --virtual-time-budget lets the JS app render: virtual time is paused while fetches are
    pending, so a slow server only costs wall time, not a half-rendered page.
    """
    args = [
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--disable-extensions",
        "--mute-audio",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        "--window-size=1600,1000",
        f"--virtual-time-budget={budget_ms}",
        *mode,
        url,
    ]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(proc, grace_s=5)
        raise AssertionError(f"chromium did not finish {url} in {timeout_s:.0f}s") from None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # stray renderer/zygote processes
        except (ProcessLookupError, PermissionError):
            pass
    if proc.returncode != 0:
        raise AssertionError(f"chromium exited {proc.returncode} on {url}:\n{err.decode(errors='replace')[-3000:]}")
    return out.decode(errors="replace")


_ASSET_NAME = re.compile(r'<div class="[^"]*\bAssetNode_assetName__\w+[^"]*">([^<]+)</div>')


def asset_node_names(dom: str) -> list[str]:
    """Labels of the asset nodes drawn in the lineage graph (Dagster shows the key's last part)."""
    return [html.unescape(m.group(1)).strip() for m in _ASSET_NAME.finditer(dom)]


def visible_text(dom: str) -> str:
    text = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S)
    text = re.sub(r"<[^>]+>", " ", text)
    return " ".join(html.unescape(text).split())


def chromium_poll(binary: str, profile: Path, url: str, script: str, *, timeout_s: float) -> object:
    """Open ``url`` in headless Chromium and evaluate the JS expression ``script`` in the page
    (over the DevTools protocol) once a second until it returns something other than null;
    return that value. For pages that need a click (e.g. a metadata dialog) before they
    show what a test looks for: the script may click, then return null to be asked again.
    """

    profile.mkdir(parents=True, exist_ok=True)
    port_file = profile / "DevToolsActivePort"
    port_file.unlink(missing_ok=True)
    args = [
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-sync",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-dev-shm-usage",
        "--disable-extensions",
        "--mute-audio",
        f"--user-data-dir={profile}",
        "--window-size=1600,1000",
        "--remote-debugging-address=127.0.0.1",
        "--remote-debugging-port=0",
        url,
    ]
    log = open(profile / "chromium.log", "wb")  # a file, not a pipe nobody drains while we poll
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    last: object = "chromium not reachable yet"
    try:
        ws = _devtools_page(proc, port_file, url, deadline)
        try:
            for call in range(1, 1_000_000):
                ws.send(
                    json.dumps(
                        {"id": call, "method": "Runtime.evaluate", "params": {"expression": script, "returnByValue": True}}
                    )
                )
                while True:  # responses only: no protocol domain is enabled, so no events
                    reply = json.loads(ws.recv())
                    if reply.get("id") == call:
                        break
                result = reply.get("result", {})
                if "exceptionDetails" in result or "error" in reply:
                    raise AssertionError(f"script failed on {url}: {reply}")
                last = result.get("result", {}).get("value")
                if last is not None:
                    return last
                if time.monotonic() > deadline:
                    break
                time.sleep(1)
        finally:
            ws.close()
    finally:
        kill_group(proc, grace_s=5)
        log.close()
    raise AssertionError(f"the script found nothing on {url} within {timeout_s:.0f}s (last: {last!r})")


def _devtools_page(proc: subprocess.Popen, port_file: Path, url: str, deadline: float):
    """A websocket to the page target Chromium opened for ``url``."""
    import websocket

    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"chromium exited {proc.returncode}: {tail(port_file.parent / 'chromium.log', 3000)}")
        if port_file.exists() and port_file.read_text().strip():
            port = int(port_file.read_text().split()[0])
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as resp:
                pages = [t for t in json.load(resp) if t.get("type") == "page"]
            if pages:
                return websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
        time.sleep(0.5)
    raise AssertionError(f"chromium opened no DevTools page for {url}")
