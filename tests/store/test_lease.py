"""Leases on object stores, driven by injected fake clocks: no real sleeps, no timing luck.

Each party gets its own FakeClock, as separate hosts would; a contender's staleness verdict
may depend only on its own clock and on what it observed in the lease record.
"""

import logging
import time

import fsspec
import pytest

import marin_assets.store.lease as lease_module
from marin_assets.store import ArtifactStore, FakeClock, Lease, LeaseConfig, LeaseLost, compute_version

CONFIG = LeaseConfig(heartbeat_s=10, stale_after_s=30)


def _dir(name: str) -> str:
    return f"/lease-{name}-{time.time_ns()}"


def _pair(directory: str, config: LeaseConfig = CONFIG):
    fs = fsspec.filesystem("memory")
    holder = Lease(fs, directory, config, clock=FakeClock(), heartbeat_thread=False)
    contender = Lease(fs, directory, config, clock=FakeClock(start=5_000.0), heartbeat_thread=False)
    return holder, contender


def test_takeover_needs_the_record_unchanged_for_the_whole_window_on_the_contenders_clock():
    holder, contender = _pair(_dir("window"))
    assert holder.acquire()
    assert not contender.acquire()  # first sight of the record: never stale
    contender.clock.advance(29.9)
    assert not contender.acquire()  # 29.9 s unchanged < 30 s
    contender.clock.advance(0.1)
    assert contender.acquire()  # exactly 30 s unchanged: stale
    assert contender.held()
    assert not holder.held()
    with pytest.raises(LeaseLost, match="taken over: generation 2 replaced ours"):
        holder.check()


def test_renewals_keep_the_lease_however_long_the_holder_computes():
    holder, contender = _pair(_dir("renew"))
    assert holder.acquire()
    for _ in range(20):  # 20 x 25 s = 500 s, far beyond the 30 s window
        assert not contender.acquire()
        contender.clock.advance(25)
        holder.clock.advance(25)
        assert holder.renew()
    assert holder.held() and not contender.acquire()


def test_a_holder_whose_wall_clock_is_far_behind_keeps_its_lease(monkeypatch):
    holder, contender = _pair(_dir("skew"))
    real_time = time.time
    monkeypatch.setattr(lease_module.time, "time", lambda: real_time() - 100.0)  # holder's host is 100 s behind
    assert holder.acquire()
    monkeypatch.setattr(lease_module.time, "time", real_time)
    assert not contender.acquire()
    contender.clock.advance(1.0)
    assert not contender.acquire()  # before: taken over here, the record's wall time looked 101 s old
    assert holder.held()


def test_released_lease_is_free_at_once():
    holder, contender = _pair(_dir("released"))
    assert holder.acquire()
    holder.release()
    assert contender.acquire()
    contender.release()


def test_a_failed_heartbeat_write_is_logged_and_retried(monkeypatch, caplog):
    holder, contender = _pair(_dir("retry"))
    assert holder.acquire()
    real_write = lease_module.write_json_atomic
    failures = {"left": 2}

    def flaky(fs, path, value, durable=True):
        if failures["left"]:
            failures["left"] -= 1
            raise OSError("503 Service Unavailable")
        real_write(fs, path, value, durable)

    monkeypatch.setattr(lease_module, "write_json_atomic", flaky)
    holder.clock.advance(10)
    with caplog.at_level(logging.WARNING, logger="marin_assets.store.lease"):
        assert not holder.renew()
        holder.clock.advance(5)
        assert not holder.renew()
    assert [r.getMessage().count("503 Service Unavailable") for r in caplog.records] == [1, 1]
    assert holder.held()  # 15 s without renewal < 30 s
    holder.clock.advance(5)
    assert holder.renew()  # the third try goes through
    holder.clock.advance(25)  # 45 s after acquiring, 25 s after the last renewal
    assert holder.held()


def test_a_holder_that_cannot_renew_before_staleness_stops_and_says_so(monkeypatch):
    holder, _ = _pair(_dir("cannot"))
    assert holder.acquire()

    def down(fs, path, value, durable=True):
        raise OSError("bucket unreachable")

    monkeypatch.setattr(lease_module, "write_json_atomic", down)
    for _ in range(5):
        holder.clock.advance(5.9)
        assert not holder.renew()
    assert holder.held()  # 29.5 s: still inside the window
    holder.clock.advance(0.5)
    assert not holder.held()  # 30 s: a contender may take over now
    with pytest.raises(LeaseLost, match=r"not renewed for 30.0s \(stale_after_s=30\)"):
        holder.check()
    assert not holder.renew()  # a lost lease is not renewed behind anyone's back


def test_heartbeat_thread_survives_failed_writes(monkeypatch):
    """The real thread with real time: before the fix one exception ended it for good."""
    fs = fsspec.filesystem("memory")
    directory = _dir("thread")
    lease = Lease(fs, directory, LeaseConfig(heartbeat_s=0.01, stale_after_s=3600))
    real_write = lease_module.write_json_atomic
    failures = {"left": 3}

    def flaky(fs_, path, value, durable=True):
        if failures["left"]:
            failures["left"] -= 1
            raise OSError("transient")
        real_write(fs_, path, value, durable)

    monkeypatch.setattr(lease_module, "write_json_atomic", flaky)
    assert lease.acquire()
    deadline = time.monotonic() + 20  # generous: only a dead thread runs into it
    while lease._beat < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    beat = lease._beat
    lease.release()
    assert failures["left"] == 0 and beat >= 6


def test_store_takes_over_a_stale_holder_after_the_window_and_only_then():
    prefix = f"memory://takeover-{time.time_ns()}"
    clock = FakeClock()
    store = ArtifactStore(prefix, CONFIG, poll_s=1.0, clock=clock)
    version = compute_version("t/x", "1", {})
    vdir = store.version_dir("t/x", None, version)
    hung = Lease(store.fs, vdir, CONFIG, clock=FakeClock(), heartbeat_thread=False)
    assert hung.acquire()  # a holder that hangs: it never renews
    started = clock.monotonic()
    computed_at = []

    def compute(out_dir):
        computed_at.append(clock.monotonic() - started)
        with fsspec.open(f"{out_dir}/out.txt", "w") as f:
            f.write("ok")
        return {}

    result = store.materialize("t/x", None, version, compute, {})
    assert not result.cache_hit and len(computed_at) == 1
    assert 30.0 <= computed_at[0] <= 31.0  # first sight at t=0, stale at t=30, one poll granularity
    assert not hung.held()
    with pytest.raises(LeaseLost, match="taken over"):
        hung.check()


def test_store_refuses_to_commit_when_the_lease_could_not_be_renewed(monkeypatch):
    clock = FakeClock()
    store = ArtifactStore(f"memory://norenew-{time.time_ns()}", CONFIG, clock=clock)
    version = compute_version("t/y", "1", {})

    def slow_compute(out_dir):
        monkeypatch.setattr(lease_module, "write_json_atomic", lambda *a: (_ for _ in ()).throw(OSError("down")))
        clock.advance(31)  # computing for 31 s while no heartbeat gets through
        with fsspec.open(f"{out_dir}/out.txt", "w") as f:
            f.write("late")
        return {}

    with pytest.raises(LeaseLost, match="not renewed for 31.0s.*not committing"):
        store.materialize("t/y", None, version, slow_compute, {})
    assert store.load("t/y", None, version) is None
    assert store.status("t/y", None, version) == "RUNNING"  # not ours to mark FAILED any more


def test_local_flock_holder_survives_failed_record_writes(tmp_path, monkeypatch):
    clock = FakeClock()
    lease = Lease(fsspec.filesystem("file"), str(tmp_path), CONFIG, clock=clock, heartbeat_thread=False)
    assert lease.acquire()
    monkeypatch.setattr(lease_module, "write_json_atomic", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
    clock.advance(300)
    assert not lease.renew()
    assert lease.held()  # the kernel lock is what counts; nobody can take it over
    lease.release()


@pytest.mark.parametrize(
    "bad",
    [
        dict(heartbeat_s=float("nan")),
        dict(stale_after_s=float("inf")),
        dict(heartbeat_s=0),
        dict(heartbeat_s=100, stale_after_s=90),
    ],
)
def test_lease_config_rejects_non_finite_and_inverted_windows(bad):
    with pytest.raises(ValueError, match="heartbeat|stale"):
        LeaseConfig(**bad)


class _SteppedWallClock:
    """``time.time`` that can be stepped like an NTP correction; everything else keeps real time."""

    def __init__(self) -> None:
        self.offset = 0.0
        self._real = time.time

    def __call__(self) -> float:
        return self._real() + self.offset


def test_the_default_clock_ignores_wall_clock_steps(monkeypatch):
    """Every test above injects a FakeClock; this one uses the real default clock, so a lease
    built on wall time (which NTP may step by hours) would fail here."""
    wall = _SteppedWallClock()
    monkeypatch.setattr(lease_module.time, "time", wall)
    fs = fsspec.filesystem("memory")
    directory = _dir("wall-step")
    holder = Lease(fs, directory, CONFIG, heartbeat_thread=False)
    contender = Lease(fs, directory, CONFIG, heartbeat_thread=False)
    assert holder.acquire()
    assert not contender.acquire()  # first sight of the record
    wall.offset = 3600.0  # the wall clock jumps an hour ahead; not a second of real time has passed
    assert not contender.acquire()  # the record has been unchanged for well under 30 s: not stale
    assert holder.held() and holder.renew()
    holder.check()
    holder.release()


def test_the_default_clock_judges_staleness_after_a_backward_wall_step(monkeypatch):
    wall = _SteppedWallClock()
    monkeypatch.setattr(lease_module.time, "time", wall)
    config = LeaseConfig(heartbeat_s=0.01, stale_after_s=0.05)
    fs = fsspec.filesystem("memory")
    directory = _dir("wall-back")
    hung = Lease(fs, directory, config, heartbeat_thread=False)  # never renews
    contender = Lease(fs, directory, config, heartbeat_thread=False)
    assert hung.acquire()
    assert not contender.acquire()
    wall.offset = -3600.0  # the wall clock steps an hour back
    time.sleep(0.1)  # twice the stale window of real (monotonic) time
    assert contender.acquire()  # stale on the contender's monotonic clock, whatever the wall says
    assert not hung.held()
    contender.release()
