"""A training work dir is never lost: a resume with no valid checkpoint refuses and changes nothing,
two trainers never share one out dir, a failed write mid-run is one line, and ``--out`` naming a file
is refused (issue 35)."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from marin_assets.cli import main as marin
from marin_assets.train.checkpoints import checkpoint as ckpt
from marin_assets.train.checkpoints.work_dir import WorkDirBusy, work_dir_lease
from marin_assets.train.loop import train
from marin_assets.train.metrics import read_metrics
from marin_assets.train.restore import NoValidCheckpoint
from tests.support.configs import TINY_TRAIN

MARIN = shutil.which("marin", path=str(Path(sys.executable).parent)) or "marin"


def _snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` and its sha256: what 'nothing changed' means."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def _cli_args(caches, cfg_path: Path, out: Path, *extra: str) -> list[str]:
    return [
        "train",
        "--cache",
        f"license={caches['license']}",
        "--cache",
        f"docs={caches['docs']}",
        "--config",
        str(cfg_path),
        "--out",
        str(out),
        *extra,
    ]


@pytest.fixture(scope="module")
def trained_once(caches, jax_cache, tmp_path_factory) -> Path:
    """A 12-step run (checkpoints at 4, 8 and 12), trained once for the file: a run's folder holds no
    absolute path, so a copy of it is the same run in another folder."""
    from marin_assets.train.config import config_from_dict

    out = tmp_path_factory.mktemp("trained_once") / "run"
    train(config_from_dict(TINY_TRAIN), {"license": caches["license"], "docs": caches["docs"]}, out)
    return out


@pytest.fixture
def trained(trained_once, tmp_path):
    """This test's own copy of the 12-step run (tests break its checkpoints), and its config file."""
    out = tmp_path / "run"
    shutil.copytree(trained_once, out)
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(TINY_TRAIN))
    return out, cfg


def test_resume_with_no_valid_checkpoint_refuses_and_changes_nothing(caches, trained, capsys):
    out, cfg = trained
    assert len(read_metrics(out / "metrics.jsonl")) == 12
    for marker in (out / "checkpoints").glob(f"step-*/{ckpt.MARKER}"):
        marker.unlink()  # an interrupted copy: every array there, no commit markers
    before = _snapshot(out)

    code = marin(_cli_args(caches, cfg, out, "--resume"))

    err = capsys.readouterr().err
    assert code == 2
    refusal = [line for line in err.splitlines() if "--resume:" in line]
    assert len(refusal) == 1, err
    assert "3 checkpoint folder(s)" in refusal[0] and "none is valid" in refusal[0]
    assert "step-000000012" in refusal[0] and ckpt.MARKER in refusal[0]  # the first problem, named
    assert "to start over on purpose" in refusal[0]
    assert _snapshot(out) == before  # no checkpoint deleted, metrics.jsonl not cut


def test_the_library_refuses_the_same_resume(caches, tiny_config, trained):
    out, _ = trained
    for marker in (out / "checkpoints").glob(f"step-*/{ckpt.MARKER}"):
        marker.unlink()
    with pytest.raises(NoValidCheckpoint, match="none is valid"):
        train(tiny_config, {"license": caches["license"], "docs": caches["docs"]}, out, resume=True)
    assert len(read_metrics(out / "metrics.jsonl")) == 12


def test_a_resume_with_an_older_valid_checkpoint_still_continues(caches, tiny_config, trained):
    """The crash case stays a resume: the newest checkpoint unfinished, an older one valid."""
    out, _ = trained
    (out / "checkpoints" / "step-000000012" / ckpt.MARKER).unlink()
    result = train(tiny_config, {"license": caches["license"], "docs": caches["docs"]}, out, resume=True)
    assert result.final_step == 12
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == list(range(1, 13))
    assert ckpt.is_valid(out / "checkpoints" / "step-000000012")


def test_a_held_work_dir_refuses_a_second_trainer_before_it_writes(caches, tiny_config, trained, capsys):
    out, cfg = trained
    before = _snapshot(out)
    with work_dir_lease(out):  # as the first trainer holds it
        with pytest.raises(WorkDirBusy, match="another run is writing"):
            train(tiny_config, {"license": caches["license"], "docs": caches["docs"]}, out, resume=True)
        assert marin(_cli_args(caches, cfg, out, "--resume")) == 2
    assert "another run is writing" in capsys.readouterr().err
    assert _snapshot(out) == before
    with work_dir_lease(out):  # released by the holder: the next one takes it
        pass


@pytest.mark.slow
def test_two_trainers_on_one_out_dir_the_second_is_refused_and_the_first_is_whole(caches, jax_cache, tmp_path, capsys):
    """The first trainer, a real process, is stopped (SIGSTOP) once it has logged a step, so it is
    certainly mid-run, holding its out dir, while the second tries; it then finishes. (A timing margin of
    300 steps did the same before, at ~20 s of training per run, and still raced on a loaded host.)"""
    data = dict(TINY_TRAIN, num_steps=40, checkpoint_every_steps=10)
    cfg = tmp_path / "long.yaml"
    cfg.write_text(yaml.safe_dump(data))
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(jax_cache), JAX_PLATFORMS="cpu")
    out = tmp_path / "run"
    first = subprocess.Popen([MARIN, *_cli_args(caches, cfg, out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and first.poll() is None and not (out / "metrics.jsonl").exists():
            time.sleep(0.05)
        first.send_signal(signal.SIGSTOP)
        assert first.poll() is None, f"the first run ended before the second started: {first.stderr.read().decode()[-2000:]}"
        # The second in this process: the lease is a flock, so it conflicts across processes all the same.
        code = marin(_cli_args(caches, cfg, out, "--resume"))
    finally:
        first.send_signal(signal.SIGCONT)
    err = capsys.readouterr().err
    first.wait(timeout=400)

    assert code == 2 and "another run is writing" in err, err[-2000:]
    assert first.returncode == 0, first.stderr.read().decode()[-2000:]
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == list(range(1, 41))
    assert all(ckpt.is_valid(folder) for folder in ckpt.list_checkpoints(out / "checkpoints"))


def test_a_full_disk_mid_save_is_one_line_and_the_resume_is_exact(caches, trained, tmp_path, monkeypatch, capsys):
    _, cfg = trained
    out = tmp_path / "full"
    real = ckpt.write_durable
    calls = {"n": 0}

    def fills_up(fs, path, data):  # the disk fills while the second checkpoint (step 8) is written
        calls["n"] += 1
        if "step-000000008" in path:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return real(fs, path, data)

    monkeypatch.setattr(ckpt, "write_durable", fills_up)
    code = marin(_cli_args(caches, cfg, out))
    err = capsys.readouterr().err
    assert code == 1
    assert "Traceback" not in err
    failure = [line for line in err.splitlines() if "No space left on device" in line]
    assert len(failure) == 1 and "--resume continues from" in failure[0] and "step-000000004" in failure[0], err
    assert not ckpt.is_valid(out / "checkpoints" / "step-000000008")

    monkeypatch.setattr(ckpt, "write_durable", real)
    assert marin(_cli_args(caches, cfg, out, "--resume")) == 0
    straight = read_metrics(trained[0] / "metrics.jsonl")
    resumed = read_metrics(out / "metrics.jsonl")
    assert [(r["step"], r["loss"]) for r in resumed] == [(r["step"], r["loss"]) for r in straight]


def test_out_naming_a_file_is_one_line(caches, tmp_path, capsys):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(TINY_TRAIN))
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    assert marin(_cli_args(caches, cfg, a_file)) == 2
    err = capsys.readouterr().err
    assert "is a file, not a folder" in err and "Traceback" not in err
    assert a_file.read_text() == "mine"
    assert (
        marin(
            [
                "train",
                "necromancy",
                "--checkpoint",
                str(tmp_path),
                "--cache",
                str(caches["license"]),
                "--steps",
                "1",
                "--out",
                str(a_file),
            ]
        )
        == 2
    )
    assert "is a file, not a folder" in capsys.readouterr().err


def test_an_object_store_work_dir_refuses_a_live_holder_and_takes_over_a_crashed_ones():
    """On an object store the lease is the store's generation lease: a holder that renews keeps it; one that
    stopped renewing (killed) is taken over once its record sat unchanged for the stale window."""
    import fsspec

    from marin_assets.store.lease import Lease, LeaseConfig
    from marin_assets.train.checkpoints.work_dir import LEASE_ENTRY

    out = "memory://work-dir-lease/run"
    fs = fsspec.filesystem("memory")
    fast = LeaseConfig(heartbeat_s=0.05, stale_after_s=0.6)
    live = Lease(fs, f"/work-dir-lease/run/{LEASE_ENTRY}", fast)
    assert live.acquire()
    try:
        with pytest.raises(WorkDirBusy, match="another run is writing memory://work-dir-lease/run"):
            with work_dir_lease(out, config=fast):
                pass
    finally:
        live.release()

    crashed = Lease(fs, f"/work-dir-lease/run/{LEASE_ENTRY}", fast, heartbeat_thread=False)
    assert crashed.acquire()  # and never renews nor releases, as after kill -9
    started = time.monotonic()
    with work_dir_lease(out, config=fast):
        assert time.monotonic() - started >= fast.stale_after_s
