"""A fresh process meets a lease (issue 35): it takes over a crashed holder's object-store lease after
watching it unrenewed for the stale window, says so while it waits, and stops waiting the moment the
holder renews; a damaged lease folder is one clear error, a damaged informational record is harmless.
Fake clocks, one per party, as in test_lease.py."""

from __future__ import annotations

import os
import time

import fsspec
import pytest

from marin_assets.store import FakeClock, Lease, LeaseConfig, LeaseLost
from marin_assets.store.lease import LeaseDamaged

CONFIG = LeaseConfig(heartbeat_s=10, stale_after_s=30)
POLL_S = CONFIG.heartbeat_s / 4


def _lease(directory: str, fs=None, clock: FakeClock | None = None, owner: str = "new-run") -> Lease:
    return Lease(
        fs or fsspec.filesystem("memory"), directory, CONFIG, owner=owner, clock=clock or FakeClock(), heartbeat_thread=False
    )


def _dir(name: str) -> str:
    return f"/takeover-{name}-{time.time_ns()}"


def test_a_fresh_process_takes_over_a_crashed_holders_lease_after_the_window_saying_so():
    directory = _dir("crashed")
    crashed = _lease(directory, owner="host:123:crashed")
    assert crashed.acquire()  # ...and then the process was killed: no more renewals, no release
    fresh = _lease(directory, clock=FakeClock(start=7_000.0))
    said: list[str] = []
    assert fresh.acquire_waiting(said.append, progress_s=10)
    waited = fresh.clock.monotonic() - 7_000.0
    assert CONFIG.stale_after_s <= waited < CONFIG.stale_after_s + POLL_S
    assert fresh._generation == 2 and fresh.held()
    assert said[0].startswith(
        f"the lease memory://{directory} is held by host:123:crashed, whose record has not "
        "changed in the 0s this process has watched it; taking it over if it stays unchanged "
        "for 30s (a live holder renews it every 10s)"
    )
    assert [line.split("changed in the ")[1].split("s ")[0] for line in said[1:-1]] == ["10", "20"]
    assert said[-1] == (f"took over the lease memory://{directory}: its record did not change for 30s, so its holder is gone")
    with pytest.raises(LeaseLost, match="taken over"):
        crashed.check()


class _HolderBeatsWhileWeSleep(FakeClock):
    """The waiting process's clock; while it sleeps, the live holder renews every heartbeat."""

    def __init__(self, holder: Lease):
        super().__init__(start=7_000.0)
        self.holder, self.next_beat = holder, self.now + CONFIG.heartbeat_s

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        if self.now >= self.next_beat:
            self.holder.clock.advance(CONFIG.heartbeat_s)
            assert self.holder.renew()
            self.next_beat += CONFIG.heartbeat_s


def test_a_live_holder_is_recognised_at_its_first_renewal_and_keeps_the_lease():
    directory = _dir("live")
    holder = _lease(directory, owner="host:1:live")
    assert holder.acquire()
    fresh = _lease(directory)
    fresh.clock = _HolderBeatsWhileWeSleep(holder)
    said: list[str] = []
    assert not fresh.acquire_waiting(said.append)
    assert fresh.clock.monotonic() - 7_000.0 == CONFIG.heartbeat_s  # one heartbeat, not the stale window
    assert len(said) == 1 and "held by host:1:live" in said[0]
    holder.check()
    assert holder._generation == 1


def test_a_released_lease_is_taken_at_once_without_waiting():
    directory = _dir("released")
    holder = _lease(directory)
    assert holder.acquire()
    holder.release()
    fresh = _lease(directory)
    said: list[str] = []
    assert fresh.acquire_waiting(said.append) and said == [] and fresh.clock.monotonic() == 1000.0


def test_a_local_flock_refusal_means_a_live_holder_and_does_not_wait(tmp_path):
    fs = fsspec.filesystem("file")
    holder = _lease(str(tmp_path), fs=fs)
    assert holder.acquire()
    fresh = _lease(str(tmp_path), fs=fs)
    said: list[str] = []
    assert not fresh.acquire_waiting(said.append) and said == [] and fresh.clock.monotonic() == 1000.0
    holder.release()
    assert fresh.acquire_waiting(said.append)
    fresh.release()


def test_a_garbage_newest_record_is_taken_over_after_the_window_naming_it_unreadable():
    fs = fsspec.filesystem("memory")
    directory = _dir("garbage")
    fs.pipe_file(f"{directory}/.lease/00000001.json", b"\xff\x00 not json")
    fresh = _lease(directory, fs=fs)
    said: list[str] = []
    assert fresh.acquire_waiting(said.append) and fresh._generation == 2
    assert "held by an unreadable record" in said[0]


def test_a_file_where_the_lease_folder_should_be_is_one_clear_error(tmp_path):
    (tmp_path / ".datakit.lease").write_text("x")
    lease = _lease(str(tmp_path / ".datakit.lease"), fs=fsspec.filesystem("file"))
    with pytest.raises(
        LeaseDamaged, match=f"^lease {tmp_path}/.datakit.lease is a file, not a folder; remove it if no run is using it$"
    ):
        lease.acquire()


def test_a_folder_where_the_lock_file_should_be_is_one_clear_error(tmp_path):
    (tmp_path / ".lock").mkdir()
    lease = _lease(str(tmp_path), fs=fsspec.filesystem("file"))
    with pytest.raises(LeaseDamaged, match=f"^lease {tmp_path}: {tmp_path}/.lock is a folder, not the lock file"):
        lease.acquire()


@pytest.mark.parametrize("damage", ["garbage record", "folder record", "garbage lock"])
def test_damage_to_what_a_flock_does_not_need_is_harmless(tmp_path, damage):
    if damage == "garbage record":
        (tmp_path / ".lease.json").write_bytes(b"\xff\x00 not json")
    elif damage == "folder record":
        (tmp_path / ".lease.json").mkdir()
    else:
        (tmp_path / ".lock").write_bytes(b"\xff\x00 not a lock")
    lease = _lease(str(tmp_path), fs=fsspec.filesystem("file"))
    assert lease.acquire() and lease.held()
    lease.renew()
    assert sorted(os.listdir(tmp_path)) == [".lease.json", ".lock"]  # no temp files left by failed record writes
    other = _lease(str(tmp_path), fs=fsspec.filesystem("file"))
    assert not other.acquire()  # still a lock
    lease.release()
    assert other.acquire()
    other.release()
