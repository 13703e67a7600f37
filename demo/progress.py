"""What a person sees while the demo runs: one line per asset as it finishes, with a bar.

Dagster's event stream (DEBUG and up, from this process and every step subprocess) goes to a
log file instead of the terminal (``stderr_to``), whose path the summary names.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

import dagster as dg

COUNT_PREFIX = "count/"
SHOWN_COUNTS = 4  # scalar counts per line; the rest are in the asset's metadata


# How a driver runs one job run: ``execute(run, tags)`` calls ``run(final_tags)``; the demo's
# reports the run's assets while it runs, tests run it directly.
Execute = Callable[[Callable[[dict[str, str]], Any], dict[str, str]], Any]


def run_directly(run: Callable[[dict[str, str]], Any], tags: dict[str, str]) -> Any:
    return run(tags)


def key_counts(metadata: dict[str, Any]) -> str:
    """'docs_in=1,234 docs_out=1,200' from an asset's count/* metadata (scalars only)."""
    shown = []
    for name, value in metadata.items():
        value = getattr(value, "value", value)
        if name.startswith(COUNT_PREFIX) and isinstance(value, (int, float)) and not isinstance(value, bool):
            shown.append(
                f"{name[len(COUNT_PREFIX) :]}={value:,}" if isinstance(value, int) else f"{name[len(COUNT_PREFIX) :]}={value:.4g}"
            )
    return " ".join(shown[:SHOWN_COUNTS])


class Progress:
    """Counts finished assets against ``total`` and prints a line for each one."""

    def __init__(self, total: int | None, out: TextIO = sys.stdout, bar_width: int = 20):
        self.total, self.done, self.out, self.bar_width = total, 0, out, bar_width
        self.lock = threading.Lock()

    def bar(self) -> str:
        """'[#####...............]  10/40', or just the count when the total is not known."""
        if not self.total:
            return f"{'':{self.bar_width + 2}s} {self.done:>3}"
        filled = min(self.bar_width, self.done * self.bar_width // self.total)
        return f"[{'#' * filled}{'.' * (self.bar_width - filled)}] {self.done:>3}/{self.total}"

    def line(self, text: str) -> None:
        with self.lock:
            print(text, file=self.out, flush=True)

    def asset(self, label: str, metadata: dict[str, Any]) -> None:
        value = lambda k: getattr(metadata.get(k), "value", metadata.get(k))
        with self.lock:
            self.done += 1
        state = "cache hit" if value("cache_hit") else "computed "
        seconds = value("duration_s")
        self.line(f"{self.bar()}  {label:36s} {state} {seconds if seconds is not None else 0:7.1f}s  {key_counts(metadata)}")

    def failure(self, step: str, message: str) -> None:
        self.line(f"{self.bar()}  {step:36s} FAILED     {message.splitlines()[0] if message else ''}")


@contextmanager
def stderr_to(path: Path) -> Iterator[TextIO]:
    """Point file descriptor 2 - of this process and of every step subprocess it starts - at
    ``path`` (Dagster's console logger writes its DEBUG event stream there, as do JAX and
    Python warnings); yield a stream on the terminal's stderr for what a person should see."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(target, 2)
    os.close(target)
    terminal = os.fdopen(os.dup(saved), "w", buffering=1)
    try:
        yield terminal
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        terminal.close()


def watched(
    instance: dg.DagsterInstance, progress: Progress, tags: dict[str, str], execute: Callable[[], Any], poll_s: float = 0.5
) -> Any:
    """Run ``execute()`` (a job run tagged with ``tags``) on this thread while a watcher thread
    reports each materialisation and step failure of that run as it lands in the event log."""
    stop = threading.Event()
    cursors: dict[str, int] = {}

    def poll() -> None:
        for record in instance.get_run_records(dg.RunsFilter(tags=tags)):
            run_id = record.dagster_run.run_id
            events = instance.all_logs(
                run_id, of_type={dg.DagsterEventType.ASSET_MATERIALIZATION, dg.DagsterEventType.STEP_FAILURE}
            )
            for entry in events[cursors.get(run_id, 0) :]:
                report(entry)
            cursors[run_id] = len(events)

    def report(entry) -> None:
        event = entry.dagster_event
        if event.event_type == dg.DagsterEventType.ASSET_MATERIALIZATION:
            mat = event.event_specific_data.materialization
            label = mat.asset_key.to_user_string() + (f"[{mat.partition}]" if mat.partition else "")
            progress.asset(label, dict(mat.metadata))
        else:
            error = event.event_specific_data.error
            while error is not None and error.cause is not None:  # the user code's own exception
                error = error.cause
            progress.failure(entry.step_key or "?", f"{error.cls_name}: {error.message.strip()}" if error else "")

    def loop() -> None:
        while not stop.wait(poll_s):
            poll()

    watcher = threading.Thread(target=loop, daemon=True)
    watcher.start()
    try:
        return execute()
    finally:
        stop.set()
        watcher.join()
        poll()  # what landed after the last tick
