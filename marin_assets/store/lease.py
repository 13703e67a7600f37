"""A lease lock so two runs never compute the same artifact version at once.

Locally it is an ``flock`` (released by the kernel when the holder dies, even on
``kill -9``). On object stores, which have no locks, it is a compare-and-swap built on
exclusive creation (``xb``: If-None-Match / if_generation_match=0 on S3/GCS): lease
*generations* ``.lease/00000001.json``, ``00000002.json``... The holder is the newest
generation; a stale holder (no heartbeat for ``stale_after_s``) is taken over by creating
the next generation, which only one contender can win.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field

import fsspec

from marin_assets.store.fsutil import is_local, join, read_json, write_json_atomic


@dataclass
class LeaseConfig:
    heartbeat_s: float = 30.0
    stale_after_s: float = 90.0

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat_s < self.stale_after_s:
            raise ValueError(
                f"lease heartbeat ({self.heartbeat_s}s) must be positive and shorter than "
                f"the stale timeout ({self.stale_after_s}s)"
            )


@dataclass
class Lease:
    """Try-acquire lease on one directory; use ``acquire()`` then ``release()``."""

    fs: fsspec.AbstractFileSystem
    directory: str
    config: LeaseConfig = field(default_factory=LeaseConfig)
    owner: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}")
    _fd: int | None = None
    _generation: int | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    # ---- public -------------------------------------------------------------
    def acquire(self) -> bool:
        self.fs.makedirs(self.directory, exist_ok=True)
        won = self._acquire_flock() if is_local(self.fs) else self._acquire_cas()
        if won:
            self._stop.clear()
            self._thread = threading.Thread(target=self._heartbeat_loop, daemon=True)
            self._thread.start()
        return won

    def held(self) -> bool:
        """Still ours? (On object stores a takeover means we lost it.)"""
        if is_local(self.fs):
            return self._fd is not None
        return self._generation is not None and self._newest_generation() == self._generation

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        if self._generation is not None:
            write_json_atomic(self.fs, self._gen_path(self._generation), self._record(released=True))
            self._generation = None

    # ---- local: flock --------------------------------------------------------
    def _acquire_flock(self) -> bool:
        fd = os.open(join(self.directory, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise
        self._fd = fd
        write_json_atomic(self.fs, join(self.directory, ".lease.json"), self._record())
        return True

    # ---- object stores: generation CAS ---------------------------------------
    def _gen_path(self, generation: int) -> str:
        return join(self.directory, ".lease", f"{generation:08d}.json")

    def _newest_generation(self) -> int:
        lease_dir = join(self.directory, ".lease")
        if not self.fs.exists(lease_dir):
            return 0
        names = [p.rsplit("/", 1)[-1] for p in self.fs.ls(lease_dir, detail=False)]
        gens = [int(n.split(".")[0]) for n in names if n.endswith(".json") and n.split(".")[0].isdigit()]
        return max(gens, default=0)

    def _acquire_cas(self) -> bool:
        newest = self._newest_generation()
        if newest:
            record = read_json(self.fs, self._gen_path(newest)) or {}
            fresh = time.time() - float(record.get("heartbeat", 0)) < self.config.stale_after_s
            if fresh and not record.get("released"):
                return False
        candidate = newest + 1
        try:
            with self.fs.open(self._gen_path(candidate), "xb") as f:
                f.write(json.dumps(self._record()).encode())
        except FileExistsError:
            return False  # another contender created this generation first
        self._generation = candidate
        return True

    # ---- shared ---------------------------------------------------------------
    def _record(self, released: bool = False) -> dict:
        return {"owner": self.owner, "heartbeat": time.time(), "released": released}

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.config.heartbeat_s):
            if self._generation is not None and self.held():
                write_json_atomic(self.fs, self._gen_path(self._generation), self._record())
            elif self._fd is not None:
                write_json_atomic(self.fs, join(self.directory, ".lease.json"), self._record())
