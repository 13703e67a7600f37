"""Run one function over many partition keys on a pool of local worker processes.

A range run of a versioned asset computes each partition of its range here. Stage bodies
are closures built by factories (not importable by name), so the workers are *forked*:
each inherits the work from the module-level table ``_WORK`` and receives only partition
keys over its pipe. Forking is safe for what the bodies do: the run process has no jax
backend (definitions.py does not import jax; a body that needs it imports it in the
worker), the parent holds no store lease while it forks, and each worker first adopts the
gcsfs instances it inherited (fsutil.adopt_inherited_filesystems: its own loop and
connections). Workers start once per range and take keys one at a time, so a slow partition
does not hold up the others.

A worker that dies (SIGKILL, the OOM killer) fails only the partition it was computing,
named in the error; the others still run, and each one the store committed stays
committed, so a rerun recomputes only what is missing.

How many processes: the artifact store resource's ``local_workers``, else $MARIN_LOCAL_WORKERS,
else os.cpu_count(); 1 = in this process.
"""

from __future__ import annotations

import multiprocessing
import signal
import sys
import threading
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from marin_assets.compat import xla_backends_started

# Re-exported: ranges.py, the experiments and the tests read the worker count from here.
from marin_assets.local_workers import WORKERS_ENV as WORKERS_ENV
from marin_assets.local_workers import local_workers as local_workers
from marin_assets.store.fsutil import adopt_inherited_filesystems

Log = Callable[[str], None]
Task = Callable[[str, Log], Any]  # (partition key, log) -> a picklable result

_WORK: dict[int, Task] = {}  # job id -> task; forked workers inherit it
_next_job = iter(range(1 << 62))


@dataclass(frozen=True)
class Failure:
    key: str
    message: str  # one line: what failed
    detail: str = ""  # the worker's traceback, when there is one
    error: BaseException | None = None  # the exception itself, for in-process failures


def fan_out(task: Task, keys: Sequence[str], workers: int, log: Log, on_done: Callable[[str, Any], None]) -> list[Failure]:
    """``task(key, log)`` for every key; ``on_done(key, result)`` in this process as each
    finishes. Returns the failures (the other keys still ran). Worker logs reach ``log``."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if workers == 1 or not keys:
        return _in_process(task, keys, log, on_done)
    unsafe = fork_unsafe_state()
    if unsafe:
        log(
            f"note: this process has {unsafe}, whose threads do not survive fork(); computing the {len(keys)} "
            f"partition(s) in this process instead of on {workers} workers"
        )
        return _in_process(task, keys, log, on_done)
    # Even one key goes to a worker: the body's imports (levanter, tensorstore) stay out of
    # this process, so the next range in the same run can still fork.
    return _Pool(task, min(workers, len(keys)), log, on_done).run(keys)


def run_forked(work: Callable[[], Any], log: Log) -> Any:
    """``work()`` in one forked worker, its (picklable) result returned here; RuntimeError naming
    the failure (with the worker's traceback) if it raised or the worker died.

    For work that would leave this process unsafe to fork (it loads tensorstore or starts a jax
    backend) in a process that must fork workers afterwards: ``marin demo`` runs the DataKit so,
    then fans the scaling sweep out. In this process when it is already unsafe to fork."""
    if fork_unsafe_state():
        return work()
    results: dict[str, Any] = {}
    # Not a daemon: the work may fan out workers of its own (the DataKit's shard steps do).
    failures = _Pool(lambda _key, _log: work(), 1, log, results.__setitem__, daemon=False).run(["work"])
    if failures:
        raise RuntimeError(f"forked worker failed: {failures[0].message}\n{failures[0].detail}".rstrip())
    return results["work"]


def fork_unsafe_state() -> str | None:
    """Why forking this process is unsafe, or None: a started XLA backend (threads and locks
    a child must not call) or tensorstore, which aborts a forked child ("fork() use detected")."""
    if xla_backends_started():
        return "a started jax backend"
    if "tensorstore" in sys.modules:
        return "tensorstore loaded (levanter's cache writer)"
    return None


def _in_process(task: Task, keys: Sequence[str], log: Log, on_done) -> list[Failure]:
    failures = []
    for key in keys:
        try:
            result = task(key, log)
        except Exception as err:  # interrupts (BaseException) stop the run, as in one step
            failures.append(Failure(key, f"{type(err).__name__}: {err}", traceback.format_exc(), err))
            continue
        on_done(key, result)
    return failures


def _signal_name(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


def _worker_main(job: int, conn: Connection) -> None:
    """Forked worker: compute keys from the pipe until told to stop (None) or the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # the parent's handlers (Dagster's) are not ours
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent()
    adopt_inherited_filesystems()  # the parent's gcsfs instances (a store's) refuse a forked child otherwise
    task = _WORK[job]
    lock = threading.Lock()  # a body may log from its own threads

    def send(message: tuple) -> None:
        with lock:
            conn.send(message)

    while True:
        try:
            key = conn.recv()
        except (EOFError, OSError):
            return
        if key is None:
            return
        try:
            result = task(key, lambda text, key=key: send(("log", key, str(text))))
            send(("done", key, result))
        except BaseException as err:  # report everything, including a result that won't pickle
            send(("failed", key, f"{type(err).__name__}: {err}", traceback.format_exc()))


def _die_with_parent() -> None:
    """Linux: SIGKILL this worker if the run process dies (no orphans computing on)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class _Worker:
    def __init__(self, job: int, context, daemon: bool) -> None:
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_worker_main, args=(job, child), daemon=daemon)
        self.process.start()
        child.close()
        self.key: str | None = None  # what it is computing now


class _Pool:
    def __init__(self, task: Task, size: int, log: Log, on_done, daemon: bool = True) -> None:
        """``daemon``: multiprocessing ends the workers with this process; a daemon may not start its own."""
        self.task, self.size, self.log, self.on_done, self.daemon = task, size, log, on_done, daemon
        self.failures: list[Failure] = []

    def run(self, keys: Sequence[str]) -> list[Failure]:
        job = next(_next_job)
        _WORK[job] = self.task
        context = multiprocessing.get_context("fork")
        pending = deque(keys)
        workers: list[_Worker] = []
        try:
            workers = [_Worker(job, context, self.daemon) for _ in range(self.size)]
            self._refill(workers, pending, job, context)
            while pending or any(w.key is not None for w in workers):
                busy = [w for w in workers if w.key is not None]
                ready = set(wait([w.conn for w in busy] + [w.process.sentinel for w in busy]))
                for worker in busy:
                    if worker.conn in ready or worker.process.sentinel in ready:
                        self._drain(worker)
                self._refill(workers, pending, job, context)
            for worker in workers:
                _send(worker, None)
            for worker in workers:
                worker.process.join(timeout=10)
        finally:
            _WORK.pop(job, None)
            for worker in workers:
                _stop(worker)
        return self.failures

    def _refill(self, workers: list[_Worker], pending: deque, job: int, context) -> None:
        """Give every idle worker the next key; a dead worker is replaced while keys remain."""
        for i, worker in enumerate(workers):
            if worker.key is not None:
                continue
            if not worker.process.is_alive():  # died (its key, if any, already failed) or idle and killed
                _stop(worker)
                if not pending:
                    continue
                workers[i] = worker = _Worker(job, context, self.daemon)
            if pending:
                worker.key = pending.popleft()
                if not _send(worker, worker.key):  # died just now: the key waits for the next refill
                    pending.appendleft(worker.key)
                    worker.key = None
        workers[:] = [w for w in workers if w.process.is_alive() or w.key is not None]

    def _drain(self, worker: _Worker) -> None:
        """Handle what the worker sent; if it has died, the key it was computing failed."""
        try:
            while worker.conn.poll():
                self._handle(worker, worker.conn.recv())
        except (EOFError, OSError):
            worker.process.join()  # its end of the pipe closed: it is exiting
        if worker.process.is_alive():
            return
        worker.process.join()
        if worker.key is not None:
            reason = _signal_name(worker.process.exitcode)
            self.failures.append(
                Failure(worker.key, f"worker pid {worker.process.pid} {reason} while computing partition {worker.key!r}")
            )
            worker.key = None

    def _handle(self, worker: _Worker, message: tuple) -> None:
        kind, key = message[0], message[1]
        if kind == "log":
            self.log(message[2])
            return
        worker.key = None
        if kind == "done":
            self.on_done(key, message[2])
        else:
            self.failures.append(Failure(key, message[2], message[3]))


def _send(worker: _Worker, message: str | None) -> bool:
    try:
        worker.conn.send(message)
        return True
    except OSError:  # BrokenPipeError: the worker is gone
        return False


def _stop(worker: _Worker) -> None:
    if worker.process.is_alive():
        worker.process.terminate()
        worker.process.join(timeout=5)
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join()
    worker.conn.close()
