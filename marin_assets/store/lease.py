"""A lease lock so two runs never compute the same artifact version at once.

Locally it is an ``flock`` (released by the kernel when the holder dies, even on
``kill -9``). On object stores, which have no locks, it is a compare-and-swap built on
exclusive creation (``pipe_file(mode="create")``: one multipart upload with
ifGenerationMatch=0 on GCS, If-None-Match on S3, ``xb`` on memory://). Not
``open(path, "xb")``: gcsfs makes that a resumable upload, whose precondition the GCS
emulator ignores, so the race test could not tell a broken CAS from a working one. Lease
*generations* ``.lease/00000001.json``, ``00000002.json``... The holder is the newest
generation and rewrites it every ``heartbeat_s`` with a new beat number.

Staleness is judged by the contender alone, on its own monotonic clock: the newest record
must stay byte-for-byte unchanged for ``stale_after_s`` *as observed by the contender*
before it creates the next generation (which only one contender can win). Wall clocks of
different hosts are never compared, so a holder whose clock is behind keeps its lease. So a
fresh process cannot tell a crashed holder's record from a live one at first sight:
``acquire_waiting`` watches it for the stale window (saying so) and takes over, or gives up at
the holder's next renewal. A run that looks once (``acquire``) must poll, or it would be refused
forever by a run killed with ``kill -9``.

The holder is just as careful from its side: a failed heartbeat write is logged and
retried, and a holder that has not renewed for ``stale_after_s`` on its own clock (when a
contender may have taken over) considers the lease lost. ``check()`` then raises
``LeaseLost`` saying why, and the store refuses to commit.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import fsspec

from marin_assets.store.fsutil import is_local, join, read_bytes, unstrip, write_json_atomic

log = logging.getLogger(__name__)


def try_flock(fd: int) -> bool:
    """An exclusive, non-blocking flock on ``fd``: True once held; False, with ``fd`` closed, when another
    process holds it (the kernel frees a dead holder's lock, even after ``kill -9``)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        os.close(fd)
        if err.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


class LeaseLost(RuntimeError):
    """The holder can no longer be sure the lease is its own."""


class LeaseDamaged(RuntimeError):
    """The lease folder or its lock file is not what a lease is made of (a file where the folder
    should be, a folder where the lock file should be): nobody can take it until a person looks."""


class SystemClock:
    """The real clock. Tests pass a fake with the same two methods."""

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class FakeClock:
    """A clock that moves only when told to (``advance``) or when something sleeps on it."""

    def __init__(self, start: float = 1000.0):
        self.now = start
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        with self._lock:
            return self.now

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


@dataclass
class LeaseConfig:
    heartbeat_s: float = 30.0
    stale_after_s: float = 90.0

    def __post_init__(self) -> None:
        for name in ("heartbeat_s", "stale_after_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"lease {name} must be a finite number of seconds, got {value!r}")
        if not 0 < self.heartbeat_s < self.stale_after_s:
            raise ValueError(
                f"lease heartbeat ({self.heartbeat_s}s) must be positive and shorter than "
                f"the stale timeout ({self.stale_after_s}s)"
            )


@dataclass
class _Observation:
    """What a contender last saw of the newest generation, and since when (its clock)."""

    generation: int
    record: bytes | None
    since: float


@dataclass
class Lease:
    """Try-acquire lease on one directory; use ``acquire()`` then ``release()``.

    Keep one Lease object per contender across retries: it remembers what it observed,
    which is how it judges staleness without trusting anyone else's clock.
    """

    fs: fsspec.AbstractFileSystem
    directory: str
    config: LeaseConfig = field(default_factory=LeaseConfig)
    owner: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}")
    clock: SystemClock | FakeClock = field(default_factory=SystemClock)
    heartbeat_thread: bool = True  # tests drive ``renew()`` by hand instead
    _fd: int | None = None
    _generation: int | None = None
    _beat: int = 0
    _renewed_at: float | None = None  # holder's clock: start of the last successful renewal
    _lost: str | None = None
    _observed: _Observation | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    # ---- public -------------------------------------------------------------
    def acquire(self) -> bool:
        """Take the lease if it is free; False if someone holds it. LeaseDamaged (naming the path
        and what is wrong) when the lease folder or lock file is something else."""
        started = self.clock.monotonic()
        if is_local(self.fs):
            self._make_local_directory()
            won = self._acquire_flock()
        else:
            self.fs.makedirs(self.directory, exist_ok=True)
            won = self._acquire_cas()
        if won:
            self._renewed_at, self._lost, self._beat = started, None, 0
            self._stop.clear()
            if self.heartbeat_thread:
                self._thread = threading.Thread(target=self._heartbeat_loop, daemon=True, name=f"lease-{self.owner}")
                self._thread.start()
        return won

    def acquire_waiting(self, say: Callable[[str], None], progress_s: float = 15.0) -> bool:
        """``acquire``, waiting out a holder that stopped renewing (a run killed with ``kill -9``):
        True once held; False as soon as the holder shows it is alive (its record changes).

        A process judges an object-store record stale only after watching it unchanged for
        ``stale_after_s`` on its own clock (no two hosts' clocks are compared), so a fresh process
        that finds a crashed run's lease waits that long, saying so every ``progress_s`` through
        ``say``. A live holder rewrites its record every ``heartbeat_s``, so it is recognised within
        one heartbeat. A local flock is freed by the kernel when its holder dies: a refusal there
        means a live holder, and no waiting."""
        if self.acquire():
            return True
        if is_local(self.fs):
            return False
        watched, said_at = self._observed, None
        if watched is None:
            return False  # another contender created the next generation first: it is alive
        while True:
            now = self.clock.monotonic()
            if said_at is None or now - said_at >= progress_s:
                said_at = now
                say(
                    f"the lease {unstrip(self.fs, self.directory)} is held by {_owner(watched.record)}, whose record "
                    f"has not changed in the {now - watched.since:.0f}s this process has watched it; taking it over "
                    f"if it stays unchanged for {self.config.stale_after_s:.0f}s (a live holder renews it every "
                    f"{self.config.heartbeat_s:.0f}s)"
                )
            self.clock.sleep(min(self.config.heartbeat_s / 4, progress_s))
            if self.acquire():
                say(
                    f"took over the lease {unstrip(self.fs, self.directory)}: its record did not change for "
                    f"{self.config.stale_after_s:.0f}s, so its holder is gone"
                )
                return True
            if self._observed is not watched:
                return False  # renewed, or released and retaken: someone alive holds it

    def held(self) -> bool:
        """Still ours? False once renewals failed for the stale window or a takeover happened."""
        return self._lost_reason() is None

    def check(self) -> None:
        """Raise ``LeaseLost`` with the reason if this holder can no longer rely on the lease."""
        reason = self._lost_reason()
        if reason is not None:
            raise LeaseLost(f"lease on {self.directory}: {reason}")

    def renew(self) -> bool:
        """One heartbeat: rewrite our record. A failure is logged and left for the next try."""
        if self._fd is None and self._generation is None:
            return False
        if self._lost_reason() is not None:
            return False
        started = self.clock.monotonic()
        self._beat += 1
        try:
            write_json_atomic(self.fs, self._record_path(), self._record(), durable=False)
        except Exception as err:  # noqa: BLE001 - any storage error; the next beat retries
            log.warning(
                "lease heartbeat on %s failed (%s: %s); retrying, last renewal %.1fs ago (stale after %ss)",
                self.directory,
                type(err).__name__,
                err,
                started - (self._renewed_at or started),
                self.config.stale_after_s,
            )
            return False
        self._renewed_at = started
        return True

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
            if self._lost_reason() is None:  # never write over a generation we no longer own
                try:
                    write_json_atomic(self.fs, self._gen_path(self._generation), self._record(released=True))
                except Exception as err:  # noqa: BLE001 - the lease then goes stale on its own
                    log.warning("could not mark the lease on %s released (%s); it will go stale", self.directory, err)
            self._generation = None

    # ---- holder side -----------------------------------------------------------
    def _lost_reason(self) -> str | None:
        if self._fd is None and self._generation is None:
            return "not held"
        if self._lost is not None:
            return self._lost
        if self._fd is not None:
            return None  # a kernel flock cannot be taken over; its record is informational
        silent = self.clock.monotonic() - (self._renewed_at or 0.0)
        if silent >= self.config.stale_after_s:
            self._lost = (
                f"not renewed for {silent:.1f}s (stale_after_s={self.config.stale_after_s}); another run may have taken it over"
            )
        else:
            newest = self._newest_generation()
            if newest != self._generation:
                self._lost = f"taken over: generation {newest} replaced ours ({self._generation})"
        return self._lost

    def _record_path(self) -> str:
        return self._gen_path(self._generation) if self._generation is not None else join(self.directory, ".lease.json")

    def _record(self, released: bool = False) -> dict:
        # "heartbeat" (wall time) is for people reading the file; no one compares it.
        return {"owner": self.owner, "beat": self._beat, "heartbeat": time.time(), "released": released}

    def _heartbeat_loop(self) -> None:
        retry_s = self.config.heartbeat_s / 4
        wait_s = self.config.heartbeat_s
        while not self._stop.wait(wait_s):
            if self._lost_reason() is not None:
                log.error("%s; stopping heartbeats", self._lost)
                return
            # a flock holds whatever happens to its informational record: no quick retries for it
            wait_s = self.config.heartbeat_s if self.renew() or self._fd is not None else retry_s

    # ---- local: flock --------------------------------------------------------
    def _make_local_directory(self) -> None:
        try:
            self.fs.makedirs(self.directory, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as err:
            where = "" if err.filename in (None, self.directory) else f" cannot be made: {err.filename}"
            raise LeaseDamaged(f"lease {self.directory}{where} is a file, not a folder; remove it if no run is using it") from err

    def _acquire_flock(self) -> bool:
        lock_path = join(self.directory, ".lock")
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except IsADirectoryError as err:
            raise LeaseDamaged(
                f"lease {self.directory}: {lock_path} is a folder, not the lock file; remove it if no run is using it"
            ) from err
        if not try_flock(fd):
            return False
        self._fd = fd
        try:  # the record only tells people who holds the lock; the flock is the lock
            write_json_atomic(self.fs, join(self.directory, ".lease.json"), self._record(), durable=False)
        except OSError as err:
            log.warning("could not write the lease record in %s (%s); the lock is held anyway", self.directory, err)
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

    def _read_raw(self, generation: int) -> bytes | None:
        try:
            return read_bytes(self.fs, self._gen_path(generation))
        except FileNotFoundError:
            return None

    def _is_free(self, newest: int) -> bool:
        """Free if there is no generation, the newest says released, or it sat unchanged
        for ``stale_after_s`` on this contender's clock."""
        if newest == 0:
            return True
        raw = self._read_raw(newest)
        try:
            if raw is not None and json.loads(raw.decode("utf-8")).get("released") is True:
                return True
        except (UnicodeDecodeError, ValueError, AttributeError):
            pass  # a half-written or foreign record: judged by staleness like any other
        now = self.clock.monotonic()
        seen = self._observed
        if seen is None or seen.generation != newest or seen.record != raw:
            self._observed = _Observation(newest, raw, now)
            return False
        return now - seen.since >= self.config.stale_after_s

    def _acquire_cas(self) -> bool:
        newest = self._newest_generation()
        if not self._is_free(newest):
            return False
        candidate = newest + 1
        self._beat = 0
        try:  # one atomic create-only PUT; open(path, "xb") is a resumable upload on gcsfs (see the module doc)
            self.fs.pipe_file(self._gen_path(candidate), json.dumps(self._record()).encode(), mode="create")
        except FileExistsError:
            return False  # another contender created this generation first
        self._generation, self._observed = candidate, None
        return True


def _owner(record: bytes | None) -> str:
    """Who a lease record names as its holder, for messages; a damaged record says so."""
    try:
        owner = json.loads((record or b"").decode("utf-8")).get("owner")
    except (UnicodeDecodeError, ValueError, AttributeError):
        owner = None
    return str(owner) if owner else "an unreadable record"
