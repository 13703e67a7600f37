"""Sweep planner: every candidate spends its budget within tolerance and lands in its bucket."""

from __future__ import annotations

import pytest

from marin_assets.model import ModelConfig, flops_per_token
from marin_assets.scaling.data import bucket_flops
from marin_assets.scaling.planner import ModelFamily, plan_sweep

FAMILY = ModelFamily(
    widths=(32, 64, 96, 128), vocab_size=256, seq_len=64, head_dim=16, aspect_ratio=32, batch_sizes=(4, 8, 16, 32), min_steps=20
)


def test_bucket_flops_is_nearest_power_of_base():
    assert bucket_flops(1.1**400) == pytest.approx(1.1**400)
    assert bucket_flops(1.1**400 * 1.04) == pytest.approx(1.1**400)
    assert bucket_flops(1.1**400 * 1.06) == pytest.approx(1.1**401)
    with pytest.raises(ValueError):
        bucket_flops(0.0)


def test_candidates_hit_budget_with_real_flop_counter():
    plan = plan_sweep([3e12, 1e13, 3e13], FAMILY, tolerance=0.04)
    assert plan.skipped == []
    assert len(plan.candidates) == 12
    for cand in plan.candidates:
        assert isinstance(cand.config, ModelConfig)
        assert cand.config.d_model == cand.width and cand.config.n_layers == cand.depth
        assert cand.width == cand.heads * 16
        assert cand.tokens == cand.batch_size * FAMILY.seq_len * cand.steps
        assert cand.flops == pytest.approx(flops_per_token(cand.config, FAMILY.seq_len) * cand.tokens)
        assert abs(cand.flops / cand.budget - 1) <= 0.04
        assert bucket_flops(cand.flops) == pytest.approx(cand.budget)
        assert cand.steps >= FAMILY.min_steps
    # Bigger models get fewer tokens at the same budget.
    per_budget = plan.by_budget()
    for cands in per_budget.values():
        toks = [c.tokens for c in sorted(cands, key=lambda c: c.params)]
        assert toks == sorted(toks, reverse=True)


def test_injected_flop_counter_and_skips_with_reasons():
    # 6N with N = width^2 * 12 (a toy counter), to show the planner works on any family.
    fpt = lambda cfg, seq: 6.0 * 12 * cfg[0] ** 2  # noqa: E731
    plan = plan_sweep(
        [1e9], FAMILY, flops_per_token=fpt, param_count=lambda cfg: 12 * cfg[0] ** 2, build_config=lambda w, d, h: (w, d, h)
    )
    kept = {c.width for c in plan.candidates}
    skipped = {s["width"]: s["reason"] for s in plan.skipped}
    assert kept | set(skipped) == set(FAMILY.widths)
    assert skipped, "a 1e9 budget is too small for the widest models at >= 20 steps"
    for reason in skipped.values():
        assert "min_steps" in reason
    for c in plan.candidates:
        assert c.flops == pytest.approx(fpt((c.width,), 64) * c.tokens)


def test_tolerance_must_fit_inside_a_bucket():
    with pytest.raises(ValueError, match="tolerance"):
        plan_sweep([1e13], FAMILY, tolerance=0.06)


def test_family_validation():
    with pytest.raises(ValueError, match="multiple of head_dim"):
        ModelFamily(widths=(30,), vocab_size=256, seq_len=64, head_dim=16)
    # The default recipe is v1: the LR halves from width 1024 to 2048 and ignores the steps.
    assert FAMILY.learning_rate(2048, 100) == pytest.approx(FAMILY.recipe.lr_base / 2) == FAMILY.learning_rate(2048, 10**4)
