"""Local worker processes forming one ``jax.distributed`` job: the environment a manifest
would set, the launch, the watch (the first failure stops the rest)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from marin_assets.orchestration.training_backends.base import TrainingFailed


def _tail(path: Path, lines: int) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(deque(f, maxlen=lines)).rstrip()
    except OSError as err:
        return f"(no log: {err})"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop_all(procs: Sequence[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM the processes still running, then SIGKILL whatever outlives the grace period."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def worker_env(index: int, processes: int, coordinator: str, devices_per_process: int | None = None) -> dict[str, str]:
    """What a manifest sets for worker ``index`` of a ``processes``-process job (see train/distributed/mesh.py)."""
    env = {
        "JAX_COORDINATOR_ADDRESS": coordinator,
        "JAX_NUM_PROCESSES": str(processes),
        "JOB_COMPLETION_INDEX": str(index),
        "MARIN_PROCESS_OFFSET": "0",
    }
    if devices_per_process is not None:
        env["MARIN_DEVICES_PER_PROCESS"] = str(devices_per_process)
    return env


def launch_workers(
    argv: list[str],
    processes: int,
    devices_per_process: int | None,
    logs: Path,
    *,
    env: Mapping[str, str] | None = None,
    log: Callable[[str], None] | None = None,
    timeout_s: float | None = None,
    kill_grace_s: float = 10.0,
    log_tail_lines: int = 40,
    poll_interval_s: float = 0.2,
) -> None:
    """Run ``processes`` copies of ``argv`` as one ``jax.distributed`` job on this host and wait.

    Each gets ``worker_env`` (coordinator on a free local port) on top of this process's
    environment and ``env``; its output goes to ``logs/process-<i>.log``. The first to fail
    stops the rest and raises TrainingFailed with its last log lines (the ``processes``
    backend and ``marin train --processes`` both launch through here).
    """
    coordinator = f"127.0.0.1:{_free_port()}"
    procs: list[subprocess.Popen] = []
    try:
        for i in range(processes):
            proc_env = {**os.environ, **(env or {}), **worker_env(i, processes, coordinator, devices_per_process)}
            with open(logs / f"process-{i}.log", "wb") as out:
                procs.append(subprocess.Popen(argv, env=proc_env, stdout=out, stderr=subprocess.STDOUT))
        if log is not None:
            log(f"started {processes} worker processes (coordinator {coordinator})")
        _watch(procs, logs, timeout_s, kill_grace_s, log_tail_lines, poll_interval_s)
    finally:
        _stop_all(procs, kill_grace_s)


def _watch(
    procs: list[subprocess.Popen],
    logs: Path,
    timeout_s: float | None,
    kill_grace_s: float,
    log_tail_lines: int,
    poll_interval_s: float,
) -> None:
    started = time.monotonic()
    while True:
        codes = [p.poll() for p in procs]
        for i, code in enumerate(codes):
            if code not in (None, 0):
                # One dead process would leave the others blocked in a collective: stop them now.
                _stop_all(procs, kill_grace_s)
                raise TrainingFailed(
                    f"worker process {i} exited with code {code}; its last lines:\n"
                    f"{_tail(logs / f'process-{i}.log', log_tail_lines)}"
                )
        if all(code == 0 for code in codes):
            return
        if timeout_s is not None and time.monotonic() - started > timeout_s:
            raise TrainingFailed(f"worker processes still running after {timeout_s:.0f}s; stopped them")
        time.sleep(poll_interval_s)
