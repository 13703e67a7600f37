import hashlib
import json
import os
import shutil
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
    assert first.ref.manifest["files"] == [{"path": "out.txt", "bytes": 5, "sha256": hashlib.sha256(b"hello").hexdigest()}]
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
    assert ref is not None and ref.manifest["files"] == [
        {"path": "payload.bin", "bytes": 10_000, "sha256": hashlib.sha256(b"x" * 10_000).hexdigest()}
    ]
    assert not list(prefix.rglob(".staging-*"))


def test_two_processes_same_version_exactly_one_computes(tmp_path):
    log = tmp_path / "log.txt"
    prefix = tmp_path / "prefix"
    procs = [
        subprocess.Popen([sys.executable, WORKER, str(prefix), str(log), "1.5"], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outcomes = sorted(p.communicate(timeout=120)[0].strip().splitlines()[-1] for p in procs)
    assert outcomes == ["computed", "hit"]
    assert log.read_text().splitlines() == ["computed"]


def test_local_lease_is_exclusive_and_released_on_process_death(tmp_path):
    fs = fsspec.filesystem("file")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl,os,sys,time; fd=os.open(sys.argv[1],os.O_RDWR|os.O_CREAT); fcntl.flock(fd,fcntl.LOCK_EX); print('locked',flush=True); time.sleep(60)",
            str(tmp_path / ".lock"),
        ],
        stdout=subprocess.PIPE,
        text=True,
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


def _colliding_versions() -> tuple[str, str]:
    """Two full versions that share the 16-character directory name."""
    a = compute_version("c/x", "1", {"n": 1})
    return a, a[:16] + ("0" if a[16] != "0" else "1") + a[17:]


@pytest.mark.parametrize("prefix_kind", ["local", "memory"])
def test_short_hash_collision_is_refused_not_served_or_overwritten(prefix_kind, tmp_path):
    prefix = str(tmp_path) if prefix_kind == "local" else f"memory://collide-{tmp_path.name}"
    store = ArtifactStore(prefix)
    first, second = _colliding_versions()
    assert first != second and store.version_dir("c/x", None, first) == store.version_dir("c/x", None, second)
    store.materialize("c/x", None, first, _writer("first"), {})
    calls = []

    def compute(out_dir):
        calls.append(out_dir)
        return _writer("second")(out_dir)

    with pytest.raises(RuntimeError, match=r"holds version .*, not .*collision of the 16-character short hash"):
        store.materialize("c/x", None, second, compute, {})
    with pytest.raises(RuntimeError, match="collision"):
        store.status("c/x", None, second)
    assert calls == []
    ref = store.load("c/x", None, first)  # the committed artifact is untouched
    with fsspec.open(ref.files(".txt")[0], "r") as f:
        assert f.read() == "first"


def test_failed_leftover_of_a_colliding_version_is_not_reported_as_ours(tmp_path):
    store = ArtifactStore(str(tmp_path))
    first, second = _colliding_versions()

    def broken(out_dir):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        store.materialize("c/x", None, first, broken, {})
    assert store.status("c/x", None, first) == FAILED
    assert store.status("c/x", None, second) is None
    assert not store.materialize("c/x", None, second, _writer("second"), {}).cache_hit


_COMMIT_STEPS = ["rename", "manifest.json", "provenance.json"]


@pytest.mark.parametrize("prefix_kind", ["local", "memory"])
@pytest.mark.parametrize("step", _COMMIT_STEPS)
def test_commit_fails_between_steps_leaves_no_success_and_reruns(step, prefix_kind, tmp_path, monkeypatch):
    """Fail each commit step in turn: SUCCESS must not exist when the step runs, nor after it failed."""
    import marin_assets.store.artifact as artifact_module

    prefix = str(tmp_path) if prefix_kind == "local" else f"memory://commit-{step}-{tmp_path.name}"
    store = ArtifactStore(prefix)
    version = compute_version("c/order", "1", {})
    status_when_step_ran = []

    def fail_here(what):
        status_when_step_ran.append(store.status("c/order", None, version))
        raise OSError(f"injected failure at {what}")

    if step == "rename":
        monkeypatch.setattr(artifact_module.os, "rename", lambda src, dst: fail_here("rename"))
        monkeypatch.setattr(type(store.fs), "mv", lambda self, *a, **k: fail_here("rename"))
    else:
        real_write = artifact_module.write_json_atomic

        def write(fs, path, value, durable=True):
            if path.endswith("/" + step):
                fail_here(step)
            real_write(fs, path, value, durable)

        monkeypatch.setattr(artifact_module, "write_json_atomic", write)
    with pytest.raises(OSError, match=f"injected failure at {step}"):
        store.materialize("c/order", None, version, _writer("x"), {})
    assert status_when_step_ran == ["RUNNING"]
    assert store.status("c/order", None, version) == FAILED
    assert store.load("c/order", None, version) is None
    monkeypatch.undo()
    rerun = store.materialize("c/order", None, version, _writer("x"), {})
    assert not rerun.cache_hit and store.status("c/order", None, version) == SUCCESS


def test_process_dying_at_the_data_rename_leaves_no_success(tmp_path):
    """No exception handler runs on a real death: only the order of the writes protects us."""
    prefix = tmp_path / "prefix"
    script = (
        "import os, sys\n"
        "from marin_assets.store import ArtifactStore, compute_version\n"
        "os.rename = lambda src, dst: os._exit(137)\n"
        "store = ArtifactStore(sys.argv[1])\n"
        "def compute(out):\n"
        "    open(out + '/f.txt', 'w').write('x')\n"
        "store.materialize('c/die', None, compute_version('c/die', '1', {}), compute, {})\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(prefix)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 137, proc.stderr
    store = ArtifactStore(str(prefix))
    version = compute_version("c/die", "1", {})
    assert store.status("c/die", None, version) == "RUNNING"
    assert store.load("c/die", None, version) is None
    assert not list(prefix.rglob("manifest.json"))


def test_a_commit_fsyncs_what_success_vouches_for_and_not_the_advisory_records(tmp_path, monkeypatch):
    """manifest, provenance, SUCCESS and the pointer survive a machine crash; RUNNING and the
    lease record are advisory (a lost one just means "not complete"), so they skip the fsync."""
    from marin_assets.store import fsutil

    synced = []
    real_fsync = fsutil.os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}").rsplit("/", 1)[-1].split(".tmp-")[0])
        real_fsync(fd)

    monkeypatch.setattr(fsutil.os, "fsync", fsync)
    store = ArtifactStore(str(tmp_path))
    version = compute_version("c/durable", "1", {})
    ref = store.materialize("c/durable", None, version, _writer("x"), {}).ref
    store.write_pointer(ref)
    assert synced == ["manifest.json", "provenance.json", "STATUS.json", "LATEST.json"]
    assert store.status("c/durable", None, version) == SUCCESS


@pytest.mark.parametrize("prefix_kind", ["local", "memory"])
def test_a_stage_that_writes_no_files_commits_an_empty_artifact(prefix_kind, tmp_path):
    """The gs:// case (no staging "dir" at all) is in tests/gcs/test_gcs_store.py."""
    prefix = str(tmp_path) if prefix_kind == "local" else f"memory://empty-{tmp_path.name}"
    store = ArtifactStore(prefix)
    version = compute_version("quality_model", "1", {"threshold": 0})
    first = store.materialize("quality_model", None, version, lambda out_dir: {"model": 0}, {})
    assert first.ref.manifest == {"files": [], "total_bytes": 0, "counts": {"model": 0}}
    assert store.load("quality_model", None, version) == first.ref
    fs, vdir = fsspec.core.url_to_fs(first.ref.path)
    assert not [p for p in fs.ls(vdir, detail=False) if ".staging-" in p]


def _committed(store, text="hello world"):
    version = compute_version("a/b", "1", {"text": text})
    calls = []

    def compute(out_dir):
        calls.append(out_dir)
        return _writer(text)(out_dir)

    return version, calls, compute, store.materialize("a/b", "p0", version, compute, {}).ref


@pytest.mark.parametrize(
    "damage,reason",
    [
        (lambda path: path.unlink(), "out.txt: missing (the manifest lists it, 11 bytes)"),
        (lambda path: path.write_text("hello"), "out.txt: 5 bytes, the manifest says 11"),
        (
            lambda path: path.write_text("HELLO WORLD"),
            "out.txt: its sha256 differs from the manifest's (rewritten after the commit)",
        ),
    ],
)
def test_a_committed_artifact_whose_files_changed_is_recomputed_not_served(tmp_path, damage, reason, caplog):
    # A file deleted, cut or rewritten (same size) after the commit: before, load served it as a cache hit.
    store = ArtifactStore(str(tmp_path))
    version, calls, compute, ref = _committed(store)
    assert store.damage(ref) is None
    damage(Path(ref.data_path) / "out.txt")
    assert store.damage(ref) == reason
    assert store.load("a/b", "p0", version) is None and reason in caplog.text
    again = store.materialize("a/b", "p0", version, compute, {})
    assert not again.cache_hit and len(calls) == 2
    assert (Path(ref.data_path) / "out.txt").read_text() == "hello world" and store.damage(again.ref) is None


def test_files_over_the_digest_size_are_checked_by_size(tmp_path, monkeypatch):
    from marin_assets.store import artifact

    monkeypatch.setattr(artifact, "DIGEST_MAX_BYTES", 4)
    store = ArtifactStore(str(tmp_path))
    version, _, _, ref = _committed(store)
    assert ref.manifest["files"] == [{"path": "out.txt", "bytes": 11}]
    (Path(ref.data_path) / "out.txt").write_text("HELLO WORLD")  # same size: not seen, by design
    assert store.load("a/b", "p0", version) is not None


def test_pointers_are_relative_so_a_copied_store_reads_only_itself(tmp_path):
    original, copy = tmp_path / "P", tmp_path / "Q"
    store = ArtifactStore(str(original))
    version, _, _, ref = _committed(store)
    store.write_pointer(ref)
    record = json.loads((original / "a" / "b" / "p0" / "LATEST.json").read_text())
    assert record["path"] == f"a/b/p0/{version[:16]}"
    shutil.copytree(original, copy)
    # An older pointer holds an absolute path into the original: it is read as this store's version too.
    (copy / "a" / "b" / "p0" / "LATEST.json").write_text(json.dumps({**record, "path": str(original / "a/b/p0" / version[:16])}))
    shutil.rmtree(original)
    copied = ArtifactStore(str(copy))
    pointer = copied.read_pointer("a/b", "p0")
    assert pointer.path == str(copy / "a/b/p0" / version[:16]) and pointer.version == version
    assert copied.load("a/b", "p0", version) == pointer and copied.damage(pointer) is None
