"""Checkpoint retention (issue 34 item 1, marin_assets/train/checkpoints/retention.py): keep the last N, the newest
valid, each phase's final and pinned steps; delete only valid checkpoints nothing else keeps, uncommitted
first; ``marin train prune`` holds the work dir's lease, says what it did, and a resume still continues."""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
from pathlib import Path

import fsspec
import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marin_assets.cli import main as marin
from marin_assets.store.fsutil import filesystem, join
from marin_assets.train.checkpoints import checkpoint as ckpt
from marin_assets.train.checkpoints import retention
from marin_assets.train.checkpoints.retention import RetentionPlan, apply_retention, plan_retention
from marin_assets.train.checkpoints.work_dir import work_dir_lease
from marin_assets.train.metrics import read_metrics
from tests.support.configs import TINY_TRAIN

_RUNS = itertools.count()


def _save(run: str | Path, step: int, phase: str = "main", phase_start: int = 0) -> None:
    state = {"w": np.full(3, float(step), np.float32)}
    ckpt.save(f"{run}/checkpoints", step, state, {"phase": phase, "phase_start_step": phase_start})


def _break(run: str | Path, step: int, how: str) -> None:
    """Make a checkpoint invalid: no marker (in flight, or killed before its commit) or a damaged file."""
    fs, path = filesystem(f"{run}/checkpoints/step-{step:09d}")
    if how == "no marker":
        fs.rm_file(join(path, ckpt.MARKER))
    else:
        fs.pipe_file(join(path, "state.npz"), b"damaged")


def _snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


# ---- the plan's rules ----------------------------------------------------------------------------

_CHECKPOINTS = st.lists(
    st.tuples(st.integers(1, 4), st.booleans(), st.sampled_from(["valid", "valid", "no marker", "damaged"])),
    min_size=1,
    max_size=8,
)  # (gap to the previous step, a new phase starts, state)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(checkpoints=_CHECKPOINTS, keep_last=st.integers(1, 4), pin=st.lists(st.integers(0, 7), max_size=3), finals=st.booleans())
def test_every_folder_is_kept_with_one_reason_or_deleted_and_only_valid_ones_go(checkpoints, keep_last, pin, finals):
    run = f"memory://retention/{next(_RUNS)}"
    steps, phase_of, states, phase, start = [], {}, {}, 0, 0
    for gap, new_phase, state in checkpoints:
        step = (steps[-1] if steps else 0) + gap
        if new_phase and steps:
            phase, start = phase + 1, steps[-1]
        _save(run, step, f"phase{phase}", start)
        steps.append(step)
        phase_of[step], states[step] = phase, state
    for step, state in states.items():
        if state != "valid":
            _break(run, step, state)
    pinned = sorted({steps[i % len(steps)] for i in pin})

    plan = plan_retention(run, keep_last, pinned, keep_phase_finals=finals)

    kept = dict(plan.keep)
    assert sorted([*kept, *plan.delete]) == steps and len(kept) + len(plan.delete) == len(steps)
    valid = [s for s in steps if states[s] == "valid"]
    assert all(kept[s] == "not committed" for s in steps if states[s] != "valid")
    assert set(plan.problems) == {s for s in steps if states[s] != "valid"}
    if valid:
        assert kept[valid[-1]] == "newest valid"
    expected = set(valid[-1:]) | set(valid[-keep_last:]) | {s for s in pinned if s in valid}
    if finals:
        expected |= {max(s for s in valid if phase_of[s] == p) for p in {phase_of[s] for s in valid}}
    assert {s for s in valid if s in kept} == expected  # kept for a reason, and nothing else kept
    before = {s: _files(run, s) for s in steps}
    deleted = apply_retention(run, plan)
    assert [d["step"] for d in deleted] == plan.delete and all(d["bytes"] > 0 for d in deleted)
    assert all(_files(run, s) == before[s] for s in kept)
    assert all(not _files(run, s) for s in plan.delete)


def _files(run: str, step: int) -> dict:
    fs, path = filesystem(f"{run}/checkpoints/step-{step:09d}")
    return {p: fs.cat_file(p) for p in fs.find(path)} if fs.exists(path) else {}


def test_the_reasons_of_a_two_phase_run(tmp_path):
    run = tmp_path / "run"
    for step in (2, 4, 6):
        _save(run, step, "warmup", 0)
    for step in (8, 10, 12, 14, 16):
        _save(run, step, "main", 6)
    _break(run, 16, "no marker")  # in flight when the plan was made

    plan = plan_retention(run, keep_last=2, keep_steps=[4])

    assert plan.keep == [(4, "pinned"), (6, "phase final"), (12, "last N"), (14, "newest valid"), (16, "not committed")]
    assert plan.delete == [2, 8, 10]
    assert "COMMITTED" in plan.problems[16]
    assert plan_retention(run, keep_last=2, keep_phase_finals=False).delete == [2, 4, 6, 8, 10]


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2", None])
def test_keep_last_must_be_a_positive_int(tmp_path, bad):
    _save(tmp_path, 1)
    with pytest.raises(ValueError, match=r"^keep_last must be an integer >= 1"):
        plan_retention(tmp_path, bad)


def test_a_pinned_step_that_does_not_exist_is_named(tmp_path):
    _save(tmp_path, 4)
    with pytest.raises(ValueError, match=r"keep step\(s\) \[5, 7\]: no such checkpoint"):
        plan_retention(tmp_path, 1, [4, 5, 7])


def test_no_run_dir_or_no_checkpoints_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such run dir"):
        plan_retention(tmp_path / "missing", 1)
    with pytest.raises(ValueError, match="has no checkpoints"):
        plan_retention(tmp_path, 1)


def test_a_plan_that_keeps_and_deletes_a_step_is_refused():
    with pytest.raises(ValueError, match=r"both keeps and deletes step\(s\) \[3\]"):
        RetentionPlan(keep=[(3, "last N")], delete=[3])


# ---- deleting ----------------------------------------------------------------------------------


def test_a_delete_interrupted_after_the_marker_leaves_a_folder_is_valid_rejects(tmp_path, monkeypatch):
    for step in (1, 2, 3):
        _save(tmp_path, step)
    plan = plan_retention(tmp_path, 1, keep_phase_finals=False)
    assert plan.delete == [1, 2]
    real = retention.uncommit

    def power_cut(fs, path):
        real(fs, path)
        raise KeyboardInterrupt("killed after the marker went")

    monkeypatch.setattr(retention, "uncommit", power_cut)
    with pytest.raises(KeyboardInterrupt):
        apply_retention(tmp_path, plan)
    folder = tmp_path / "checkpoints" / "step-000000001"
    assert (folder / "state.npz").exists() and not ckpt.is_valid(folder)
    assert ckpt.latest_valid(tmp_path / "checkpoints") == tmp_path / "checkpoints" / "step-000000003"
    monkeypatch.undo()
    again = plan_retention(tmp_path, 1, keep_phase_finals=False)  # the half-deleted one is never touched
    assert (1, "not committed") in again.keep and again.delete == [2]


# ---- marin train prune, on a real run ------------------------------------------------------------

_SHORT = dict(TINY_TRAIN, num_steps=6, checkpoint_every_steps=2)  # checkpoints at 2, 4 and 6


def _train_args(caches, cfg: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--cache", f"license={caches['license']}", "--config", str(cfg), "--out", str(out), *extra]


@pytest.fixture(scope="module")
def short_run(caches, jax_cache, tmp_path_factory) -> tuple[Path, Path]:
    """A 6-step run trained by ``marin train`` (sharded checkpoints at 2, 4, 6) and its config file;
    tests prune copies of it."""
    root = tmp_path_factory.mktemp("short_run")
    cfg = root / "short.yaml"
    cfg.write_text(yaml.safe_dump(_SHORT))
    assert marin(_train_args(caches, cfg, root / "run")) == 0
    return root / "run", cfg


@pytest.fixture
def run_copy(short_run, tmp_path) -> Path:
    shutil.copytree(short_run[0], tmp_path / "run")
    return tmp_path / "run"


def _prune(out, *extra: str) -> list[str]:
    return ["train", "prune", "--out", str(out), *extra]


def test_prune_then_resume_continues_from_the_newest_checkpoint(caches, short_run, run_copy, capsys):
    capsys.readouterr()
    assert marin(_prune(run_copy, "--keep-last", "1", "--json")) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kept"] == [{"step": 6, "reason": "newest valid"}]
    assert [d["step"] for d in report["deleted"]] == [2, 4]
    assert report["bytes_freed"] == sum(d["bytes"] for d in report["deleted"]) > 0
    assert [p.name for p in (run_copy / "checkpoints").iterdir()] == ["step-000000006"]

    assert marin(_train_args(caches, short_run[1], run_copy, "--resume", "--steps", "8")) == 0
    assert "resumed from" in (err := capsys.readouterr().err) and "step-000000006 at step 6" in err, err
    assert [r["step"] for r in read_metrics(run_copy / "metrics.jsonl")] == list(range(1, 9))
    assert ckpt.latest_valid(run_copy / "checkpoints") == run_copy / "checkpoints" / "step-000000008"


def test_prune_refuses_while_a_trainer_holds_the_run_dir(run_copy, capsys):
    before = _snapshot(run_copy)
    with work_dir_lease(run_copy):  # as a running trainer holds it
        assert marin(_prune(run_copy, "--keep-last", "1")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "another run is writing" in err[0] and "marin train prune" in err[0]
    assert _snapshot(run_copy) == before


def test_a_dry_run_changes_no_byte_and_says_what_it_would_delete(run_copy, capsys):
    (run_copy / "checkpoints" / "step-000000004" / ckpt.MARKER).unlink()  # a damaged one: named, kept
    before = _snapshot(run_copy)
    assert marin(_prune(run_copy, "--keep-last", "1", "--dry-run")) == 0
    out = capsys.readouterr().out.splitlines()
    assert _snapshot(run_copy) == before
    assert out[0].startswith("keep    step 4: not committed (unreadable COMMITTED")
    assert out[1] == "keep    step 6: newest valid"
    assert out[2].startswith("would delete  step 2: ") and " bytes (" in out[2]
    assert out[3].startswith("marin train prune: would delete 1 checkpoint(s), ")


def test_an_unknown_keep_step_is_one_line_and_exit_2(run_copy, capsys):
    before = _snapshot(run_copy)
    assert marin(_prune(run_copy, "--keep-last", "1", "--keep-step", "5")) == 2
    assert (
        capsys.readouterr().err
        == f"marin train prune: keep step(s) [5]: no such checkpoint in {run_copy} (its steps: [2, 4, 6])\n"
    )
    assert _snapshot(run_copy) == before


def test_a_missing_or_empty_run_dir_is_one_line_and_exit_2(tmp_path, capsys):
    assert marin(_prune(tmp_path / "missing", "--keep-last", "1")) == 2
    assert (
        capsys.readouterr().err
        == f"marin train prune: {tmp_path / 'missing'}: no such run dir (give the --out of a training run)\n"
    )
    assert not (tmp_path / "missing").exists()  # not made by the lease
    (tmp_path / "empty").mkdir()
    assert marin(_prune(tmp_path / "empty", "--keep-last", "1")) == 2
    assert "has no checkpoints" in capsys.readouterr().err


def test_a_bad_keep_last_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        marin(_prune(tmp_path, "--keep-last", "0"))
    assert exit_.value.code == 2
    assert "argument --keep-last: must be a positive integer, got '0'" in capsys.readouterr().err


def test_the_memory_store_prunes_too():
    run = "memory://retention/prune-cli"
    for step in (1, 2):
        _save(run, step)
    assert marin(_prune(run, "--keep-last", "1")) == 0
    assert [p.rsplit("/", 1)[-1] for p in fsspec.filesystem("memory").ls("/retention/prune-cli/checkpoints", detail=False)] == [
        "step-000000002"
    ]
