"""One writer per training work dir: the lease ``train``, necromancy and transplant hold on their out dir.

Two trainers on one out dir corrupt it: the second deletes the first's in-progress checkpoint
folder as a leftover, and both append to metrics.jsonl. So whoever writes a work dir holds its
lease from before the first write to the end:

- on a local disk, an exclusive ``flock`` on the folder itself (released by the kernel when the
  holder dies, even on ``kill -9``). Locking the folder, not a file in it, leaves nothing behind:
  a phase's work dir becomes its artifact as it is;
- on an object store (``gs://``), the store's generation lease (``store.lease.Lease``, a
  compare-and-swap on exclusive creation) in ``<out>/.train.lease``, renewed by a heartbeat.

With several processes (one ``jax.distributed`` job), process 0 holds it for the job: it alone
writes the metrics and commits checkpoints.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator

from marin_assets.store.fsutil import filesystem, is_local, join
from marin_assets.store.lease import Lease, LeaseConfig, try_flock

log = logging.getLogger(__name__)
LEASE_ENTRY = ".train.lease"  # the object-store lease's folder inside the work dir


class WorkDirBusy(ValueError):
    """Another run holds the work dir (a ValueError: the CLIs say it in one line and exit 2)."""


def busy_message(out: str, tool: str) -> str:
    return (
        f"another run is writing {out} (it holds the folder's lease); {tool} refuses to share a work dir: "
        f"wait for that run to end, or give this one another out dir"
    )


def check_is_folder(out: str | os.PathLike) -> None:
    """A work dir that exists must be a folder (``--out`` naming a file is a one-line error, not a traceback)."""
    fs, root = filesystem(os.fspath(out))
    if fs.exists(root) and not fs.isdir(root):
        raise ValueError(f"{os.fspath(out)} is a file, not a folder: give an out dir (a folder, made if missing)")


@contextlib.contextmanager
def work_dir_lease(
    out: str | os.PathLike,
    tool: str = "marin train",
    holder: bool = True,
    agree: Callable[[bool], bool] = bool,
    config: LeaseConfig | None = None,
) -> Iterator[None]:
    """Hold ``out``'s lease (making the folder) for the ``with`` block; ``WorkDirBusy`` if another run
    holds it. In a job of several processes only the ``holder`` (process 0) takes it, and ``agree``
    (``distributed.agree``: process 0's value everywhere) makes every process refuse together. ``config``: the
    object-store lease's heartbeat and stale window (default ``LeaseConfig()``)."""
    out = os.fspath(out)
    release = _acquire(out, config or LeaseConfig()) if holder else _nothing
    if not agree(release is not None):
        raise WorkDirBusy(busy_message(out, tool))
    try:
        yield
    finally:
        if release is not None:
            release()


def _nothing() -> None:
    """What a process that holds no lease releases."""


def _acquire(out: str, config: LeaseConfig) -> Callable[[], None] | None:
    """Take ``out``'s lease; its release, or None when another run holds it."""
    fs, root = filesystem(out)
    check_is_folder(out)
    fs.makedirs(root, exist_ok=True)
    if is_local(fs):
        return _folder_flock(root)
    lease = Lease(fs, join(root, LEASE_ENTRY), config)
    # A crashed trainer's record goes unrenewed: wait out the stale window (saying so), then take over.
    return lease.release if lease.acquire_waiting(log.warning) else None


def _folder_flock(root: str) -> Callable[[], None] | None:
    """An exclusive flock on the folder itself; its release (closing the descriptor), or None if held."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    return (lambda: os.close(fd)) if try_flock(fd) else None
