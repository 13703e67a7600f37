import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import fsspec
import pytest

from marin_assets.store import FAILED, SUCCESS, ArtifactStore, Lease, LeaseConfig, compute_version

WORKER = str(Path(__file__).with_name("_worker.py"))


def _writer(text: str):
    def compute(out_dir: str) -> dict:
        with fsspec.open(f"{out_dir}/out.txt", "w") as f:
            f.write(text)
        return {"chars": len(text)}

    return compute


@pytest.mark.parametrize("prefix_kind", ["local", "memory"])
def test_commit_then_cache_hit(prefix_kind, tmp_path):
    prefix = str(tmp_path) if prefix_kind == "local" else f"memory://store-{tmp_path.name}"
    store = ArtifactStore(prefix)
    version = compute_version("a/b", "1", {"k": 1})
    calls = []

    def compute(out_dir):
        calls.append(out_dir)
        return _writer("hello")(out_dir)

    first = store.materialize("a/b", "p0", version, compute, {"why": "test"})
    second = store.materialize("a/b", "p0", version, compute, {"why": "test"})
    assert (first.cache_hit, second.cache_hit) == (False, True)
    assert len(calls) == 1
    assert first.ref == second.ref
    assert store.status("a/b", "p0", version) == SUCCESS
    with fsspec.open(first.ref.files(".txt")[0], "r") as f:
        assert f.read() == "hello"
    assert first.ref.manifest["counts"] == {"chars": 5}
    assert first.ref.manifest["files"] == [{"path": "out.txt", "bytes": 5}]
    fs, _ = fsspec.core.url_to_fs(first.ref.path)
    with fs.open(f"{first.ref.path}/provenance.json") as f:
        provenance = json.load(f)
    assert provenance["version"] == version and provenance["counts"] == {"chars": 5}
    assert str(tmp_path) not in json.dumps(provenance)  # host-independent
    leftovers = [p for p in fs.ls(first.ref.path, detail=False) if ".staging-" in p]
    assert leftovers == []


def test_failure_marks_failed_and_next_run_recomputes(tmp_path):
    store = ArtifactStore(str(tmp_path))
    version = compute_version("a", "1", {})

    def broken(out_dir):
        Path(out_dir, "half.txt").write_text("partial")
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        store.materialize("a", None, version, broken, {})
    assert store.status("a", None, version) == FAILED
    assert store.load("a", None, version) is None
    result = store.materialize("a", None, version, _writer("ok"), {})
    assert not result.cache_hit
    assert sorted(f["path"] for f in result.ref.manifest["files"]) == ["out.txt"]  # no 'half.txt'


def test_kill_9_mid_write_leaves_nothing_complete_and_rerun_gives_same_result(tmp_path):
    log = tmp_path / "log.txt"
    prefix = tmp_path / "prefix"
    proc = subprocess.Popen([sys.executable, WORKER, str(prefix), str(log), "20"], stdout=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not list(prefix.rglob("payload.bin")) and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # a few chunks written
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    store = ArtifactStore(str(prefix))
    version = compute_version("test/shared", "1", {"n": 1})
    assert store.status("test/shared", None, version) != SUCCESS
    assert store.load("test/shared", None, version) is None
    assert not list(prefix.rglob("manifest.json"))
    rerun = subprocess.run([sys.executable, WORKER, str(prefix), str(log), "0.1"], capture_output=True, text=True, timeout=120)
    assert rerun.stdout.strip().splitlines()[-1] == "computed", rerun.stderr
    ref = store.load("test/shared", None, version)
    assert ref is not None and ref.manifest["files"] == [{"path": "payload.bin", "bytes": 10_000}]
    assert not list(prefix.rglob(".staging-*"))


def test_two_processes_same_version_exactly_one_computes(tmp_path):
    log = tmp_path / "log.txt"
    prefix = tmp_path / "prefix"
    procs = [subprocess.Popen([sys.executable, WORKER, str(prefix), str(log), "1.5"], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outcomes = sorted(p.communicate(timeout=120)[0].strip().splitlines()[-1] for p in procs)
    assert outcomes == ["computed", "hit"]
    assert log.read_text().splitlines() == ["computed"]


def test_object_store_lease_is_compare_and_swap_with_stale_takeover():
    fs = fsspec.filesystem("memory")
    directory = f"/lease-test-{time.time_ns()}"
    fast = LeaseConfig(heartbeat_s=0.05, stale_after_s=0.3)
    first, second = Lease(fs, directory, fast), Lease(fs, directory, fast)
    assert first.acquire()
    assert not second.acquire()  # held and heartbeating
    time.sleep(0.4)
    assert not second.acquire()  # heartbeat keeps it fresh
    first._stop.set()  # simulate a holder that hangs: heartbeats stop
    first._thread.join()
    time.sleep(0.4)
    assert second.acquire()  # stale -> taken over by creating the next generation
    assert second.held() and not first.held()  # the old holder sees that it lost the lease
    second.release()
    third = Lease(fs, directory, fast)
    assert third.acquire()  # released leases are free at once
    third.release()


def test_object_store_holder_that_lost_the_lease_does_not_commit(monkeypatch):
    store = ArtifactStore(f"memory://lost-{time.time_ns()}", LeaseConfig(heartbeat_s=0.05, stale_after_s=0.2))
    version = compute_version("x", "1", {})
    monkeypatch.setattr(Lease, "held", lambda self: False)
    with pytest.raises(RuntimeError, match="lost the lease"):
        store.materialize("x", None, version, _writer("late"), {})
    assert store.load("x", None, version) is None


def test_local_lease_is_exclusive_and_released_on_process_death(tmp_path):
    fs = fsspec.filesystem("file")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl,os,sys,time; fd=os.open(sys.argv[1],os.O_RDWR|os.O_CREAT); fcntl.flock(fd,fcntl.LOCK_EX); print('locked',flush=True); time.sleep(60)", str(tmp_path / ".lock")],
        stdout=subprocess.PIPE, text=True,
    )
    assert holder.stdout.readline().strip() == "locked"
    lease = Lease(fs, str(tmp_path))
    assert not lease.acquire()
    holder.kill()
    holder.wait()
    assert lease.acquire()
    lease.release()


def test_lease_config_is_validated():
    with pytest.raises(ValueError, match="heartbeat"):
        LeaseConfig(heartbeat_s=100, stale_after_s=90)
