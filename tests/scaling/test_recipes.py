"""Recipes as data: v1 is the planner's old rule unchanged, v2 is AdamH with an LR that falls
with width and with run length, no weight decay, and the fan-in init."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from marin_assets.scaling.planner import ModelFamily, plan_sweep
from marin_assets.scaling.recipes import RECIPES, V1, V2, Recipe, get_recipe

widths = st.integers(min_value=8, max_value=4096)
steps = st.integers(min_value=1, max_value=10**6)


@given(widths, steps)
def test_v2_lowers_the_lr_at_4x_the_tokens_and_v1_does_not(width, n):
    # Same width and batch, four times the tokens = four times the steps.
    assert V2.learning_rate(width, 4 * n) == pytest.approx(V2.learning_rate(width, n) / 2)  # steps^-1/2
    assert V1.learning_rate(width, 4 * n) == V1.learning_rate(width, n)


@given(widths, steps)
def test_v1_keeps_the_old_numbers(width, n):
    # Before recipes: lr = lr_base * min(1, lr_ref_width / width) with the sweep's 1e-2 and 1024.
    assert V1.learning_rate(width, n) == pytest.approx(1e-2 * min(1.0, 1024 / width))
    assert V1.optimizer_config().name == "adamw" and V1.optimizer_config().weight_decay == 0.1
    assert V1.model_fields(width) == {}  # the model's default init


@given(widths, steps)
def test_v2_falls_as_the_square_root_of_width(width, n):
    assert V2.learning_rate(4 * width, n) == pytest.approx(V2.learning_rate(width, n) / 2)
    assert V2.learning_rate(V2.lr_ref_width, V2.lr_ref_steps) == pytest.approx(V2.lr_base)
    assert V2.model_fields(width) == {"init_std": pytest.approx(width**-0.5)}


def test_v2_is_adamh_with_no_weight_decay():
    config = V2.optimizer_config()
    assert config.name == "adamh" and config.weight_decay == 0.0 and V2.weight_decay == 0.0
    with pytest.raises(ValueError, match="no weight decay to set"):
        dataclasses.replace(V2, weight_decay=0.1)


def test_recipes_by_name_and_bad_values():
    assert get_recipe("v1") is V1 and get_recipe("v2") is V2 and set(RECIPES) == {"v1", "v2"}
    with pytest.raises(ValueError, match=r"unknown scaling recipe 'v3'; known: \['v1', 'v2'\]"):
        get_recipe("v3")
    with pytest.raises(ValueError, match="lr_base must be a finite"):
        dataclasses.replace(V2, lr_base=math.nan)
    with pytest.raises(ValueError, match="optimizer must be one of"):
        dataclasses.replace(V1, optimizer="sgd")
    with pytest.raises(ValueError, match="width must be in"):
        V2.learning_rate(0, 10)
    assert V2.with_base(0.05).lr_base == 0.05 and V2.lr_base == 3e-2


def test_the_planner_asks_the_recipe():
    family = ModelFamily(widths=(8, 16, 32), vocab_size=257, seq_len=64, head_dim=8, aspect_ratio=128, batch_sizes=(16,))
    for recipe in (V1, V2):
        plan = plan_sweep([4e10], dataclasses.replace(family, recipe=recipe))
        assert not plan.skipped
        for cand in plan.candidates:
            assert cand.learning_rate == recipe.learning_rate(cand.width, cand.steps)
            assert cand.recipe == recipe.name and cand.optimizer == recipe.optimizer_config()
            assert cand.config.init_std == (cand.width**-0.5 if recipe is V2 else 0.02)
    with pytest.raises(ValueError, match="ModelFamily.recipe must be a Recipe"):
        dataclasses.replace(family, recipe="v2")


def test_a_recipe_is_frozen_data():
    assert isinstance(V2, Recipe)
    with pytest.raises(dataclasses.FrozenInstanceError):
        V2.lr_base = 1.0  # type: ignore[misc]
    assert Recipe(**V2.as_dict()) == V2


def test_the_recipe_of_a_ladders_settings_and_its_lr_sweep():
    from marin_assets.scaling.ladder import SweepSettings
    from marin_assets.scaling.lr_sweep import resolve_recipe, uses_lr_sweep

    v2, v1 = SweepSettings(recipe="v2"), SweepSettings(recipe="v1")
    assert resolve_recipe(v2, {"recipe": "v2", "best_lr": 0.021}) == V2.with_base(0.021) and uses_lr_sweep(v2)
    assert resolve_recipe(v1, None) == V1 and not uses_lr_sweep(v1)  # v1 is not re-tuned
    with pytest.raises(ValueError, match="from an lr_sweep of that recipe; the lr_sweep given was run for 'v1'"):
        resolve_recipe(v2, {"recipe": "v1", "best_lr": 0.01})
    pinned = SweepSettings(recipe="v2", lr_base=0.05)
    assert resolve_recipe(pinned, None) == V2.with_base(0.05) and not uses_lr_sweep(pinned)
    with pytest.raises(ValueError, match="unknown scaling recipe"):
        SweepSettings(recipe="v9")
