"""The object-store lease (generation CAS) on gs://, each contender with its own filesystem instance,
as two processes would have."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import fsspec
import pytest

from marin_assets.store import FakeClock, Lease, LeaseConfig, LeaseLost
from tests.gcs.gcs_emulator import emulator_env

CONFIG = LeaseConfig(heartbeat_s=1, stale_after_s=3)


def _contender(directory_url: str, owner: str, clock: FakeClock | None = None) -> Lease:
    fs, directory = fsspec.core.url_to_fs(directory_url, skip_instance_cache=True)
    return Lease(fs, directory, CONFIG, owner=owner, clock=clock or FakeClock(), heartbeat_thread=False)


def test_two_contenders_that_both_listed_before_either_created_only_one_wins(gcs_prefix):
    """The race the CAS exists for: both saw no generation, both try to create generation 1."""
    contenders = [_contender(f"{gcs_prefix}/v", owner) for owner in ("A", "B")]
    both_listed = threading.Barrier(2, timeout=30)
    for lease in contenders:
        list_newest = lease._newest_generation

        def newest_then_wait(list_newest=list_newest) -> int:
            newest = list_newest()
            both_listed.wait()
            return newest

        lease._newest_generation = newest_then_wait  # type: ignore[method-assign]
    with ThreadPoolExecutor(2) as pool:
        won = list(pool.map(Lease.acquire, contenders))
    assert sorted(won) == [False, True]
    fs, directory = fsspec.core.url_to_fs(f"{gcs_prefix}/v")
    records = fs.ls(f"{directory}/.lease", detail=False)
    assert [r.rsplit("/", 1)[-1] for r in records] == ["00000001.json"]
    winner = contenders[won.index(True)]
    assert json.loads(fs.cat(records[0]))["owner"] == winner.owner


def test_a_held_lease_is_refused_then_free_at_once_when_released(gcs_prefix):
    holder, other = _contender(f"{gcs_prefix}/v", "A"), _contender(f"{gcs_prefix}/v", "B")
    assert holder.acquire() and not other.acquire()
    holder.check()
    assert holder.renew()
    holder.release()
    assert other.acquire()
    assert other._generation == 2
    other.release()


def test_a_stale_holder_is_taken_over_after_the_window_and_then_knows_it(gcs_prefix):
    holder_clock, contender_clock = FakeClock(), FakeClock()
    holder = _contender(f"{gcs_prefix}/v", "A", holder_clock)
    contender = _contender(f"{gcs_prefix}/v", "B", contender_clock)
    assert holder.acquire()
    assert not contender.acquire()  # first sight of generation 1 starts its stale window
    contender_clock.advance(CONFIG.stale_after_s - 0.5)
    assert not contender.acquire()
    contender_clock.advance(1.0)
    assert contender.acquire() and contender._generation == 2
    with pytest.raises(LeaseLost, match="taken over: generation 2 replaced ours"):
        holder.check()
    holder.release()  # must not write over generation 2
    contender.check()


def test_a_datakit_run_takes_over_the_prefix_lease_of_a_run_killed_with_kill_9(gcs_prefix, capsys):
    """Issue 35: the killed run's lease record never changes again, yet every later run was refused
    (a fresh process looked once). Now it watches for the stale window, saying so, and takes over."""
    from assets.datakit.run import hold_prefix
    from marin_assets.datakit.run_spec import LEASE_ENTRY, RunSpec

    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_AND_HANG, f"{gcs_prefix}/{LEASE_ENTRY}"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **emulator_env()},
    )
    try:
        assert holder.stdout.readline().strip() == "held"
    finally:
        holder.kill()  # SIGKILL: no release, no more heartbeats
        holder.wait()
    clock = FakeClock()
    lease = hold_prefix(RunSpec((), (), gcs_prefix), clock=clock)
    try:
        assert lease.held() and lease._generation == 2
        assert 90 <= clock.monotonic() - 1000.0 < 90 + 30 / 4  # the default window, on this process's clock
        lines = capsys.readouterr().err.splitlines()
        assert lines[0].startswith(f"marin datakit run: the lease {gcs_prefix}/{LEASE_ENTRY} is held by ")
        assert "has not changed in the 0s this process has watched it; taking it over if it stays unchanged for 90s" in lines[0]
        assert lines[-1] == (
            f"marin datakit run: took over the lease {gcs_prefix}/{LEASE_ENTRY}: its record did not "
            "change for 90s, so its holder is gone"
        )
    finally:
        lease.release()


_HOLD_AND_HANG = """
import sys, time
from marin_assets.store.fsutil import filesystem
from marin_assets.store.lease import Lease
fs, directory = filesystem(sys.argv[1])
assert Lease(fs, directory).acquire()
print("held", flush=True)
time.sleep(600)
"""


def test_a_telemetry_compaction_takes_over_the_lease_of_a_crashed_one(gcs_prefix, monkeypatch, caplog):
    """The sibling of the datakit lease: `marin telemetry compact --root gs://...` after a crashed
    compaction said "try again later", and later never came."""
    import functools

    import marin_assets.telemetry.compaction as compaction
    from marin_assets.telemetry import TelemetryStore, TelemetryWriter

    root = f"{gcs_prefix}/telemetry"
    for part in range(2):
        with TelemetryWriter(root, "r1", flush_rows=10**6, flush_seconds=1e9) as writer:
            writer.log(part, {"loss": float(part)}, time=1000.0 + part, phase="p")
    store = TelemetryStore(root)
    crashed = Lease(store.fs, store._abs("_compact"), heartbeat_thread=False)
    assert crashed.acquire()  # and never renewed or released
    clock = FakeClock()
    monkeypatch.setattr(compaction, "Lease", functools.partial(Lease, clock=clock, heartbeat_thread=False))
    with caplog.at_level("WARNING", logger=compaction.__name__):
        report = store.compact(grace_s=0)
    assert report.merged == 2 and report.live_segments == 1
    assert 90 <= clock.monotonic() - 1000.0 < 90 + 30 / 4
    assert caplog.messages[-1].startswith(f"took over the lease {root}/_compact")
