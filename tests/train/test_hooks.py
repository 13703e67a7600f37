"""Training hooks: a caller's ``add_hook(fn, every=N)`` runs at the global steps divisible by N
(across a kill and resume, and a warm start), ``at_end`` once at the phase's end, and a hook
reads the step's metrics row; the built-in emitter hook flushes the first row to telemetry at once."""

import os
import signal

import pytest

from marin_assets.telemetry import TelemetryStore
from marin_assets.train.checkpoints import checkpoint as ckpt
from marin_assets.train.config import replace
from marin_assets.train.hooks import Hooks, StepInfo
from marin_assets.train.loop import train
from marin_assets.train.metrics import read_metrics


def recording(every: int | None, at_end: bool = False) -> tuple[Hooks, list]:
    """A registry with one hook that records (step, final, stopped_by) of each call."""
    seen, hooks = [], Hooks()
    hooks.add_hook(lambda info: seen.append((info.step, info.final, info.stopped_by)), every=every, at_end=at_end)
    return hooks, seen


def steps(seen: list) -> list[int]:
    return [step for step, _, _ in seen]


@pytest.mark.slow
def test_every_n_runs_at_the_global_steps_divisible_by_n_across_a_kill_and_a_resume(caches, tiny_config, tmp_path):
    every3, seen3 = recording(every=3)
    every5_end, seen5 = recording(every=5, at_end=True)
    both = Hooks()
    both.extend(every3)
    both.extend(every5_end)
    # 12 steps, checkpoints every 4; abandoned after step 10 (before any caller hook ran at 10)
    train(tiny_config, caches, tmp_path / "run", stop_at_step=10, hooks=both)
    assert steps(seen3) == [3, 6, 9] and steps(seen5) == [5]  # no end hook on an abandoned loop
    seen3.clear(), seen5.clear()
    # resumes from the step-8 checkpoint: steps 9-12 again, so 9 runs again (it is redone)
    train(tiny_config, caches, tmp_path / "run", hooks=both)
    assert steps(seen3) == [9, 12]
    assert seen5 == [(10, False, None), (12, True, None)]  # at_end: the last step, once
    seen3.clear(), seen5.clear()
    # a resume of the finished phase runs no step: only the end hook, at step 12
    train(tiny_config, caches, tmp_path / "run", hooks=both)
    assert seen3 == [] and seen5 == [(12, True, None)]


def test_every_n_counts_global_steps_after_a_warm_start_and_at_end_sees_a_stop(caches, tiny_config, tmp_path):
    def sigterm_at_row(step):
        def log_fn(row):
            if row["step"] == step:
                os.kill(os.getpid(), signal.SIGTERM)

        return log_fn

    end_hooks, ends = recording(every=None, at_end=True)
    # row 3 is written while step 4 runs: the loop stops after step 4 (a step that every=2 also ran at)
    hooks, seen = recording(every=2, at_end=True)
    hooks.extend(end_hooks)
    first = train(replace(tiny_config, num_steps=9), caches, tmp_path / "a", log_fn=sigterm_at_row(3), hooks=hooks)
    assert (first.stopped_by, first.final_step) == ("SIGTERM", 4)
    assert seen == [(2, False, None), (4, True, "SIGTERM")]  # not twice at 4
    assert ends == [(4, True, "SIGTERM")]
    # a phase of 4 steps from global step 4: steps 5-8, so every=3 runs at 6 only
    every3, seen3 = recording(every=3)
    second = train(replace(tiny_config, num_steps=4, phase="b"), caches, tmp_path / "b", warm_start=tmp_path / "a", hooks=every3)
    assert second.phase_start_step == 4 and second.final_step == 8 and steps(seen3) == [6]


def test_a_hook_reads_each_steps_metrics_after_its_checkpoint(caches, tiny_config, tmp_path):
    config = replace(tiny_config, num_steps=6)
    rows, checkpoints = [], []

    def look(info: StepInfo) -> None:
        metrics = info.metrics
        rows.append(dict(metrics))
        checkpoints.append(ckpt.latest_valid(tmp_path / "run" / "checkpoints"))
        metrics["loss"] = -1.0  # a copy: what is logged is not the hook's to change

    hooks = Hooks()
    hooks.add_hook(look, every=1)
    result = train(config, caches, tmp_path / "run", hooks=hooks)
    logged = read_metrics(result.metrics_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert rows == logged
    assert all(r["loss"] > 0 for r in logged) and result.last_loss == rows[-1]["loss"]
    # the checkpoint hook runs before a caller's: at step 4 its checkpoint is committed
    assert [c.name if c else None for c in checkpoints] == [None, None, None] + ["step-000000004"] * 2 + ["step-000000006"]


def test_the_first_row_reaches_the_telemetry_store_before_the_next_step(caches, tiny_config, tmp_path, monkeypatch):
    """The phase controller reads the store to see a phase is live: row 1 is flushed as it is
    written, not after TELEMETRY_FLUSH_SECONDS (set out of reach here) or at the first checkpoint."""
    import marin_assets.train.loop as loop

    monkeypatch.setattr(loop, "TELEMETRY_FLUSH_SECONDS", 3600.0)
    store = TelemetryStore(str(tmp_path / "t"))
    seen = {}

    def log_fn(row):
        if row["step"] in (1, 2):
            seen[row["step"]] = sorted(set(store.query(run="live", metric="loss")["step"]))

    train(
        replace(tiny_config, num_steps=3),
        caches,
        tmp_path / "run",
        log_fn=log_fn,
        telemetry_root=str(tmp_path / "t"),
        telemetry_run="live",
    )
    assert seen == {1: [1], 2: [1]}  # row 2 waits for the next flush


def test_add_hook_checks_its_cadence_and_works_as_a_decorator():
    hooks = Hooks()
    for every in (0, -1, True, 2.0, "3"):
        with pytest.raises(ValueError, match="hook every must be a positive integer"):
            hooks.add_hook(print, every=every)
    with pytest.raises(ValueError, match="runs only at the end: pass at_end=True"):
        hooks.add_hook(print, every=None)
    with pytest.raises(ValueError, match="a hook must be callable"):
        hooks.add_hook("not a function", every=1)
    assert len(hooks) == 0
    calls = []

    @hooks.add_hook(every=2, at_end=True)
    def on_step(info):
        calls.append(info.step)

    assert on_step.__name__ == "on_step" and len(hooks) == 1
    for step in range(1, 6):
        hooks.run(StepInfo(step, None, end_step=5))
    hooks.run_end(StepInfo(5, None, end_step=5), stepped=True)
    assert calls == [2, 4, 5]
    hooks.run_end(StepInfo(4, None, end_step=5), stepped=True)  # it already ran at 4
    hooks.run_end(StepInfo(4, None, end_step=5), stepped=False)  # no step ran in this call
    assert calls == [2, 4, 5, 4]
