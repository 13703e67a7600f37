"""The 535B-A23B shape and `marin plan comm` (issue 24 item 6): parameter counts from jax.eval_shape over our init,
and the communication formulas reproducing the published per-GPU, per-layer figures under the stated assumptions."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from marin_assets.cli import main
from marin_assets.cluster.comm_plan import (
    GIB,
    TIB,
    CommPlanConfig,
    ExpertLayout,
    ep_activation_bytes,
    fsdp_weight_bytes,
    param_counts,
    plan_comm,
)
from marin_assets.model import ModelConfig, count_params
from marin_assets.train.config import load_config

HERO_YAML = Path(__file__).resolve().parents[2] / "examples" / "marin_535b_a23b.yaml"


@pytest.fixture(scope="module")
def hero() -> ModelConfig:
    return load_config(HERO_YAML, check_memory=False).model  # a shape to plan with: ~7.8 TiB of state


def test_hero_yaml_is_the_published_shape(hero):
    assert (hero.n_layers, hero.d_model, hero.n_routed_experts, hero.top_k, hero.expert_d_ff) == (48, 6144, 384, 8, 3072)
    assert (hero.n_shared_experts, hero.latent_dim, hero.qk_norm, hero.n_heads % hero.n_kv_heads) == (2, 3072, True, 0)


def test_hero_counts_from_eval_shape_land_on_535b_a23b(hero):
    counts = param_counts(hero)
    assert abs(counts["total"] / 535e9 - 1) < 0.02 and abs(counts["active"] / 23e9 - 1) < 0.02
    # the published figures, to the digits they were given in (marin-community/marin#8435: 535.3B / 22.76B)
    assert (round(counts["total"] / 1e9, 1), round(counts["active"] / 1e9, 2)) == (535.3, 22.76)
    # the FLOP counter's analytic count agrees with the traced tree, leaf for leaf
    assert (counts["total"], counts["active_with_vocab"]) == count_params(hero)
    assert counts["active_with_vocab"] - counts["active"] == 2 * hero.vocab_size * hero.d_model
    assert counts["routed_expert_per_layer"] == ExpertLayout.of(hero).expert_params == 384 * 3 * 3072 * 3072


@pytest.mark.parametrize(
    "model",
    [
        ModelConfig(
            vocab_size=50,
            d_model=16,
            n_layers=3,
            n_heads=2,
            n_kv_heads=1,
            d_ff=24,
            n_routed_experts=6,
            n_shared_experts=1,
            top_k=2,
            expert_d_ff=8,
            latent_dim=4,
        ),
        ModelConfig(n_shared_experts=0, n_routed_experts=8, top_k=3),
        ModelConfig(n_routed_experts=0),
    ],
)
def test_eval_shape_counts_agree_with_the_flop_counter(model):
    """count_params is checked against a materialised init_params tree in tests/model/test_config_flops.py."""
    counts = param_counts(model)
    assert (counts["total"], counts["active_with_vocab"]) == count_params(model)
    assert counts["active"] == counts["active_with_vocab"] - 2 * model.vocab_size * model.d_model
    routed_per_layer = ExpertLayout.of(model).expert_params if model.is_moe else 0
    assert counts["routed_expert_per_layer"] == routed_per_layer


def test_hero_plan_reproduces_the_published_traffic(hero):
    report = plan_comm(hero, CommPlanConfig())
    rows, ratios = report["layouts"], report["ratios"]
    # FSDP over experts: the layer's bf16 routed-expert weights, 384 * 3 * 3072 * 3072 * 2 B
    assert rows["config"]["fsdp_weight_bytes"] == 384 * 3 * 3072 * 3072 * 2 == 20.25 * GIB
    # expert parallelism: dispatch + combine of 65,536 tokens x top-8 x latent 3072 in bf16
    assert rows["config"]["ep_activation_bytes"] == 2 * 65536 * 8 * 3072 * 2 == 6 * GIB
    assert rows["without_latent"]["ep_activation_gib"] == 12.0 and ratios["latent_over_no_latent_ep"] == 0.5
    assert (rows["coarser"]["n_experts"], rows["coarser"]["top_k"], rows["coarser"]["expert_d_ff"]) == (192, 4, 6144)
    assert rows["coarser"]["fsdp_weight_bytes"] == rows["config"]["fsdp_weight_bytes"]
    assert rows["coarser"]["ep_activation_gib"] == 3.0 and ratios["config_over_coarser_ep"] == 2.0
    assert ratios["fsdp_over_ep"] == 20.25 / 6
    # ~16 bytes of training state per parameter: ~8 TiB
    assert report["training_state_bytes"] == 16 * report["params"]["total"]
    assert round(report["training_state_tib"]) == 8 and report["notes"] == []


layouts = st.builds(
    ExpertLayout,
    n_experts=st.integers(1, 1024),
    top_k=st.integers(1, 16),
    expert_d_ff=st.integers(1, 1 << 14),
    routed_dim=st.integers(1, 1 << 14),
)
tokens = st.integers(1, 1 << 20)
value_bytes = st.sampled_from([0.5, 1.0, 2.0, 4.0])


@given(st.integers(1, 64), st.integers(1, 16), st.integers(1, 8), tokens, value_bytes)
def test_a_latent_of_half_the_width_halves_ep_traffic_and_expert_weights(half_width, experts, k, t, b):
    k = min(k, experts)
    model = ModelConfig(d_model=2 * half_width, n_heads=1, n_kv_heads=1, head_dim=2, n_routed_experts=experts, top_k=k)
    plain = ExpertLayout.of(model)
    latent = ExpertLayout.of(dataclasses.replace(model, latent_dim=half_width))
    assert (plain.routed_dim, latent.routed_dim) == (2 * half_width, half_width)
    assert ep_activation_bytes(latent, t, b) * 2 == ep_activation_bytes(plain, t, b)
    assert fsdp_weight_bytes(latent, b) * 2 == fsdp_weight_bytes(plain, b)


@given(layouts, tokens, value_bytes, st.integers(2, 8))
def test_finer_experts_with_more_picks_multiply_ep_traffic_at_equal_tokens_and_weights(layout, t, b, g):
    fine = dataclasses.replace(layout, n_experts=layout.n_experts * g, top_k=layout.top_k * g)
    coarse = fine.coarser(g)
    assert (coarse.n_experts, coarse.top_k, coarse.expert_d_ff) == (layout.n_experts, layout.top_k, layout.expert_d_ff * g)
    assert fsdp_weight_bytes(fine, b) == fsdp_weight_bytes(coarse, b)  # same expert parameters
    assert math.isclose(ep_activation_bytes(fine, t, b), g * ep_activation_bytes(coarse, t, b), rel_tol=1e-12)


@given(layouts, tokens, st.integers(2, 64), value_bytes)
def test_ep_traffic_is_linear_in_tokens_and_fsdp_traffic_ignores_them(layout, t, m, b):
    assert ep_activation_bytes(layout, m * t, b) == pytest.approx(m * ep_activation_bytes(layout, t, b), rel=1e-12)
    assert fsdp_weight_bytes(layout, b) == layout.n_experts * 3 * layout.routed_dim * layout.expert_d_ff * b


def test_the_192_choose_4_to_384_choose_8_doubling_at_equal_tokens():
    coarse = ExpertLayout(192, 4, 6144, 3072)
    fine = ExpertLayout(384, 8, 3072, 3072)
    assert fine.coarser(2) == coarse
    assert ep_activation_bytes(fine, 65536, 2.0) == 2 * ep_activation_bytes(coarse, 65536, 2.0)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"tokens_per_gpu": 0}, "tokens_per_gpu"),
        ({"tokens_per_gpu": True}, "tokens_per_gpu"),
        ({"bytes_per_value": float("nan")}, "bytes_per_value"),
        ({"bytes_per_value": -2.0}, "bytes_per_value"),
        ({"state_bytes_per_param": float("inf")}, "state_bytes_per_param"),
        ({"granularity": 1}, "granularity"),
    ],
)
def test_bad_assumptions_are_refused_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"CommPlanConfig.{field}"):
        CommPlanConfig(**kwargs)


def test_an_indivisible_coarser_layout_is_a_note_not_a_silent_gap():
    model = ModelConfig(n_routed_experts=6, top_k=3)
    report = plan_comm(model, CommPlanConfig(granularity=2))
    assert report["layouts"]["coarser"] is None and report["ratios"]["config_over_coarser_ep"] is None
    assert report["notes"] == ["coarser layout not computed: 6 experts top-3 cannot be made 2 times coarser (not divisible)"]
    with pytest.raises(ValueError, match="no routed experts"):
        plan_comm(ModelConfig(n_routed_experts=0), CommPlanConfig())


def test_cli_json_is_one_object_of_computed_numbers(hero, capsys):
    assert main(["plan", "comm", "--config", str(HERO_YAML), "--json", "--tokens-per-gpu", "32768"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["layouts"]["config"]["ep_activation_gib"] == 3.0  # half the tokens, half the activations
    assert report["layouts"]["config"]["fsdp_weight_gib"] == 20.25
    assert report["params"]["total"] == param_counts(hero)["total"]
    assert report["training_state_bytes"] / TIB == report["training_state_tib"]


def test_cli_table_lists_every_layout(capsys):
    assert main(["plan", "comm", "--config", str(HERO_YAML)]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split()[-4:] for line in out[2:5]}
    assert rows == {
        "config": ["20.25", "GiB", "6.00", "GiB"],
        "without_latent": ["40.50", "GiB", "12.00", "GiB"],
        "coarser": ["20.25", "GiB", "3.00", "GiB"],
    }
    assert "total 535,305,996,288, active 22,763,096,064" in out[5]


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--tokens-per-gpu", "0"], "marin plan comm: CommPlanConfig.tokens_per_gpu must be in [1, inf], got 0"),
        (["--bytes-per-value", "-1"], "marin plan comm: CommPlanConfig.bytes_per_value must be in (0, inf], got -1"),
    ],
)
def test_cli_bad_flags_exit_2_with_one_line(flags, message, capsys):
    assert main(["plan", "comm", "--config", str(HERO_YAML), *flags]) == 2
    assert capsys.readouterr().err.strip() == message


def test_cli_nan_flag_and_bad_config_files(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["plan", "comm", "--config", str(HERO_YAML), "--bytes-per-value", "nan"])
    assert exited.value.code == 2 and "'nan' is not a finite number" in capsys.readouterr().err
    dense = tmp_path / "dense.yaml"
    dense.write_text("model:\n  n_routed_experts: 0\n")
    assert main(["plan", "comm", "--config", str(dense)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"marin plan comm: {dense}: the model has no routed experts (n_routed_experts = 0): nothing to plan"]
    assert main(["plan", "comm", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml: cannot read" in capsys.readouterr().err


def test_hero_attention_pattern_is_planned_and_lowers_on_8_devices(hero):
    """A window of 2048 on three layers of four (#8435): 36 sliding, 12 global. At 4096 tokens attention
    FLOPs and keys/values are (12 * 4096 + 36 * 2048) / (48 * 4096) = 0.625 of an all-global model's."""
    att = plan_comm(hero, CommPlanConfig(), 4096)["attention"]
    assert (att["global_layers"], att["sliding_layers"], att["window"]) == (12, 36, 2048)
    assert att["pattern_over_all_global"] == 0.625
    assert att["kv_bytes_per_sequence"] == 2 * 12 * 128 * 2 * (12 * 4096 + 36 * 2048)  # 720 MiB in bf16
    assert att["attention_flops_per_token"] == 0.625 * att["all_global_attention_flops_per_token"]
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("hero_attention_check.py"))],
        cwd=root,
        env=dict(os.environ, PYTHONPATH=str(root)),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    report = json.loads(out.stdout)
    assert report["devices"] == 8 and report["seq_len"] == 4096
    assert {w: r["layers"] for w, r in report["layer_windows"].items()} == {"2048": 36, "None": 12}
    assert report["forward_logits_shape"] == [1, 4096, hero.vocab_size]
