"""The budget file read by the trainer: a cut ends the phase at the first permanent checkpoint step
it no longer covers, within one checkpoint interval of the step it was written at."""

import pytest

from marin_assets.train.budget import Budget, BudgetStop, budget_cut, write_budget
from marin_assets.train.checkpoints import checkpoint as ckpt
from marin_assets.train.config import replace
from marin_assets.train.hooks import Hooks, hooks_in_this_context
from marin_assets.train.loop import train
from marin_assets.train.metrics import read_metrics
from marin_assets.train.spec import TrainSpec


def test_budget_cut_says_why_only_when_the_budget_no_longer_covers_the_phase():
    assert budget_cut(100, 60, "phoenix", 40) is None  # exactly covered
    assert budget_cut(100, 60, "phoenix", 0) is None  # the phase is done
    assert budget_cut(99, 60, "phoenix", 40, step=8) == "budget cut at step 8 to 99 tokens: 39 left but phoenix needs 40 more"
    assert budget_cut(50, 60, "phoenix", 40) == "budget cut to 50 tokens: 0 left but phoenix needs 40 more"


def test_the_spec_carries_the_budget_file_and_builds_its_check(tmp_path, tiny_config):
    spec = TrainSpec(tiny_config, {"docs": "/caches/docs"}, str(tmp_path), budget_file=tmp_path / "budget.yaml")
    assert spec.budget_file == str(tmp_path / "budget.yaml")
    assert TrainSpec.from_json_dict(spec.to_json_dict()) == spec
    assert spec.stop_check() == BudgetStop(str(tmp_path / "budget.yaml"))
    assert TrainSpec(tiny_config, {"docs": "/caches/docs"}, str(tmp_path)).stop_check() is None
    with pytest.raises(ValueError, match="spec.budget_file must be a non-empty string or null"):
        TrainSpec(tiny_config, {"docs": "/caches/docs"}, str(tmp_path), budget_file="")


def _cut_at(step: int, budget_file, budget_tokens: int) -> Hooks:
    """A person who cuts the budget after global ``step`` (a hook of the running phase)."""
    hooks = Hooks()
    hooks.add_hook(lambda info: write_budget(budget_file, Budget(budget_tokens)) if info.step == step else None)
    return hooks


@pytest.mark.slow  # two short trainings
def test_a_cut_ends_the_phase_at_its_next_permanent_checkpoint_and_a_covering_budget_does_not(caches, tiny_config, tmp_path):
    config = replace(tiny_config, phase="phoenix")  # 12 steps, permanent checkpoints every 4
    per_step = config.tokens_per_step
    budget = tmp_path / "budget.yaml"
    write_budget(budget, Budget(budget_tokens=12 * per_step))
    # After step 5 the budget is cut to 7 steps: the check at step 4 had passed, the one at 8 finds 5 steps missing.
    with hooks_in_this_context(_cut_at(5, budget, 7 * per_step)):
        result = train(config, caches, tmp_path / "cut", stop_check=BudgetStop(str(budget)))
    assert result.final_step == 8 and 8 - 5 <= config.checkpoint_every_steps
    assert result.stopped_by == f"budget cut at step 8 to {7 * per_step:,} tokens: 0 left but phoenix needs {4 * per_step:,} more"
    assert result.stop_message.startswith("stopped at step 8 by budget cut")
    assert ckpt.latest_valid(tmp_path / "cut" / "checkpoints").name == "step-000000008"
    assert [r["step"] for r in read_metrics(result.metrics_path)] == list(range(1, 9))

    # A cut that still covers the phase (and a budget never cut) let it run its course.
    write_budget(budget, Budget(budget_tokens=12 * per_step))
    with hooks_in_this_context(_cut_at(5, budget, 12 * per_step)):
        whole = train(config, caches, tmp_path / "covered", stop_check=BudgetStop(str(budget)))
    assert whole.final_step == 12 and whole.stopped_by is None


def test_a_budget_file_that_cannot_be_read_fails_the_phase_rather_than_being_ignored(tmp_path):
    with pytest.raises(FileNotFoundError, match="budget file .* does not exist"):
        BudgetStop(str(tmp_path / "missing.yaml"))("phoenix", 4, 100, 200)
