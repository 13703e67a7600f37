"""Gradient accumulation (``TrainConfig.microbatches``, train/accumulate.py): a step in 2 or 4 microbatches
updates the params as the whole batch does (dense, and a MoE whose loss has router terms besides its token
mean, under uneven loss masks); a run in microbatches resumes bit-exactly; FSDP with expert parallelism on a
1x4 mesh agrees (the session's mesh runs); bad values are refused naming the field."""

from __future__ import annotations

import functools
import json
import types

import numpy as np
import pytest

from marin_assets.knobs import knob_info
from marin_assets.train.checkpoints import checkpoint as ckpt
from marin_assets.train.config import ConfigError, TrainConfig, config_from_dict, load_config, replace
from marin_assets.train.data.batches import MaskedRows
from marin_assets.train.distributed import mesh as meshlib
from marin_assets.train.loop import train
from marin_assets.train.metrics import read_metrics
from tests.support.configs import TINY_MODEL, TINY_TRAIN
from tests.train.train_check import max_abs_diff, one_step

# fp32: what summing the gradient in another order may change. The loss (~5.6, where one ulp is 4.8e-7) is
# bounded relative to itself: 1.9e-6 (4 ulps) measured for the MoE in 2 microbatches.
TOLERANCE = 1e-6
BATCH, SEQ = 8, 32
# Capacity factors of n_routed_experts: nothing can drop (what drops depends on the microbatch: accumulate.py).
# The router z-loss and sequence balance are on: means over tokens and sequences, weighed unlike the token mean.
MODELS = {
    "dense": dict(TINY_MODEL, n_routed_experts=0),
    "moe": dict(TINY_MODEL, capacity_factor_send=4.0, capacity_factor_recv=4.0, router_z_loss=1e-2, sequence_balance_loss=1e-2),
}


def uneven_masks(rng, batch: int, seq_len: int) -> np.ndarray:
    """A loss mask whose rows count very different numbers of targets (one none), so the microbatches do."""
    density = np.linspace(1.0, 0.0, batch)[rng.permutation(batch)]
    return (rng.random((batch, seq_len)) < density[:, None]).astype(np.int32)


def _config(model: str, microbatches: int):
    # Adam's eps at 1e-3 bounds how far its first step can amplify a gradient's rounding (|d update / d g| <= lr / eps):
    # at 1e-8, a component of |g| ~ 1e-8 moves by up to lr whichever way it rounds (7e-5 measured at lr 1e-2).
    return config_from_dict(
        {**TINY_TRAIN, "model": MODELS[model], "batch_size": BATCH, "microbatches": microbatches, "optimizer": {"eps": 1e-3}}
    )


@functools.cache
def _step(model: str, masked: bool, microbatches: int):
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, TINY_MODEL["vocab_size"], (BATCH, SEQ), dtype=np.int32)
    batch = MaskedRows(tokens, uneven_masks(rng, BATCH, SEQ)) if masked else tokens
    config = _config(model, microbatches)
    return one_step(config, batch, meshlib.make_mesh(config.model))


def differences(one: tuple, other: tuple) -> dict:
    """|one - other| of two ``one_step`` results: the largest of the params' and gradient's, the loss's, grad_norm's
    and the largest of the MoE telemetry's (expert loads, drops, router z-loss: the microbatches' aux combined)."""
    (p1, g1, m1), (p2, g2, m2) = one, other
    assert m1.keys() == m2.keys()
    return {
        "params": max_abs_diff(p1, p2),
        "gradient": max_abs_diff(g1, g2),
        "loss": abs(m1["loss"] - m2["loss"]),
        "grad_norm": abs(m1["grad_norm"] - m2["grad_norm"]),
        "moe": max((abs(m1[k] - m2[k]) for k in m1 if k.startswith("moe/")), default=0.0),
    }


# Each case compiles a step (~30 s cold on a busy 2-core CPU): the dense model without a mask (every share 1/m),
# the MoE with uneven masks (shares by counted targets, its router terms by 1/m: the general case).
@pytest.mark.parametrize(
    ("model", "masked", "microbatches"), [("dense", False, 2), ("dense", False, 4), ("moe", True, 2), ("moe", True, 4)]
)
def test_a_step_in_microbatches_updates_as_the_whole_batch(model, masked, microbatches):
    ref = _step(model, masked, 1)
    diffs = differences(_step(model, masked, microbatches), ref)
    print(json.dumps({"model": model, "masked": masked, "microbatches": microbatches, "max_abs_diff": diffs}))
    assert max(diffs["params"], diffs["gradient"], diffs["grad_norm"], diffs["moe"]) <= TOLERANCE, diffs
    assert diffs["loss"] <= TOLERANCE * ref[2]["loss"], diffs
    assert _step(model, masked, microbatches)[2]["dropped"] == ref[2]["dropped"] == 0


@pytest.mark.slow  # three short trainings
def test_a_run_in_microbatches_resumes_bit_exact(caches, tmp_path):
    # The dense case's config: the process reuses its compiled step (compile_cache.reuse_jitted).
    config = replace(_config("dense", 2), num_steps=6, checkpoint_every_steps=4)
    straight = train(config, caches, tmp_path / "straight")
    train(config, caches, tmp_path / "killed", stop_at_step=5)  # checkpoint 4 committed, step 5 lost
    assert ckpt.latest_valid(tmp_path / "killed" / "checkpoints").name == "step-000000004"
    resumed = train(config, caches, tmp_path / "killed", resume=True)
    rows = [[(r["step"], r["loss"], r["grad_norm"]) for r in read_metrics(run.metrics_path)] for run in (straight, resumed)]
    assert rows[0] == rows[1] and len(rows[0]) == 6  # exact ==, every step
    a, _ = ckpt.load(straight.checkpoint_dir)
    b, _ = ckpt.load(resumed.checkpoint_dir)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_microbatches_compose_with_fsdp_and_expert_parallelism(mesh_runs):
    """The 1x4 fsdp_ragged run's first step (FSDP over 4 devices, the experts over an expert axis of 4) in 2
    microbatches vs. one (train_check.microbatch_control): the same gradient; splitting the batch moves no rows
    between devices. The params only within 1e-4, as the mesh tests bound them: the run's Adam eps (1e-8) turns
    a gradient's rounding near 0 into up to lr in its first update."""
    control = json.loads((mesh_runs / "1x4.json").read_text())["microbatches"]
    print(json.dumps({"mesh": "1x4", "microbatch_control": control}))
    assert max(control["gradient"], control["grad_norm"]) <= TOLERANCE, control
    assert control["loss"] <= TOLERANCE * control["loss_value"] and control["params"] <= 1e-4, control
    assert control["dropped"] == [0, 0] and control["split_collectives"] == []


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (0, "TrainConfig.microbatches must be a positive int, got 0"),
        (-2, "TrainConfig.microbatches must be a positive int, got -2"),
        (3, "TrainConfig.microbatches (3) must divide batch_size (4)"),
        (True, "TrainConfig.microbatches must be int, got bool True"),
    ],
)
def test_a_bad_microbatches_is_a_one_line_config_error(value, why):
    with pytest.raises(ConfigError) as caught:
        config_from_dict({**TINY_TRAIN, "microbatches": value}, where="run.yaml: config")
    assert str(caught.value) == f"run.yaml: config: {why}"


def test_a_microbatch_that_does_not_split_over_the_mesh_is_refused_before_compute(caches, tiny_config, tmp_path):
    two = types.SimpleNamespace(shape={"data": 2, "sequence": 1, "expert": 1})  # check_fits reads only the shape
    with pytest.raises(
        ValueError,
        match=r"TrainConfig\.microbatches \(4\): a microbatch of batch_size 4 / 4 = 1 rows "
        r"is not divisible by the 2 batch shards",
    ):
        train(replace(tiny_config, microbatches=4), caches, tmp_path / "a", mesh=two)
    assert not (tmp_path / "a").exists()
    meshlib.check_fits(two, tiny_config.model, batch_size=4, seq_len=32, microbatches=2)  # 2 rows: one per shard


def test_the_knob_comes_from_yaml_and_is_versioned(tmp_path):
    (tmp_path / "run.yaml").write_text("microbatches: 2\nbatch_size: 8\n")
    assert load_config(tmp_path / "run.yaml", vocab_size=257).microbatches == 2
    assert config_from_dict(TINY_TRAIN).microbatches == 1
    info = knob_info(TrainConfig, "microbatches")
    # Not remat's versioned=False: a MoE's balancing bias and expert capacity follow the microbatches (accumulate.py).
    assert info.default == 1 and info.versioned is True
