"""Mixed precision in training (issue 25 item 2): the TrainConfig knobs compute_dtype and
param_dtype. A bf16-compute run tracks the fp32 run's loss curve over 50 steps on the tiny config
and checkpoints fp32 masters; param_dtype="bfloat16" keeps params and optimizer state in bf16;
a bad dtype name is a one-line config error naming the field."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marin_assets.train.checkpoints import checkpoint as ckpt
from marin_assets.train.config import ConfigError, config_from_dict, replace
from marin_assets.train.distributed import mesh as meshlib
from marin_assets.train.loop import default_model, init_state, make_train_step, state_layout, train
from marin_assets.train.metrics import read_metrics
from tests.support.configs import NARROW_MODEL, TINY_TRAIN

STEPS = 50
# Allowed |bf16 loss - fp32 loss| over the 50 steps, in nats: at most MAX_DEVIATION at any step and
# MEAN_DEVIATION on average. Measured on this config (tiny MoE, 4 x 32 tokens per step, loss 5.54
# -> 3.78; JAX 0.7.2 on x86 CPU): at most 0.0007 through step 32, then the two runs' paths part
# (0.014 at step 33) and the largest is 0.043 (step 40, 1.1% of the loss); the mean is 0.005.
# The bounds leave room for another CPU's rounding to part them earlier.
MAX_DEVIATION = 0.1
MEAN_DEVIATION = 0.02


@pytest.mark.slow
def test_bf16_compute_tracks_fp32_for_50_steps_and_checkpoints_fp32_masters(caches, tiny_config, tmp_path):
    # The spike-skip and update-clip guards are threshold tests: a loss on either side of a threshold
    # (seen: step 41 skipped in fp32, not in bf16) would compare two different runs, not two precisions.
    fp32 = replace(
        tiny_config,
        num_steps=STEPS,
        checkpoint_every_steps=STEPS,
        schedule={"total_steps": STEPS},
        guards={"skip_sigma": 0.0, "update_clip_sigma": 0.0},
    )
    bf16 = replace(fp32, compute_dtype="bfloat16")
    runs = {name: train(config, caches, tmp_path / name) for name, config in (("fp32", fp32), ("bf16", bf16))}
    rows = {name: read_metrics(run.metrics_path) for name, run in runs.items()}
    assert [r["step"] for r in rows["fp32"]] == [r["step"] for r in rows["bf16"]] == list(range(1, STEPS + 1))
    assert [r["skipped"] for r in rows["fp32"]] == [r["skipped"] for r in rows["bf16"]]
    loss32, loss16 = (np.array([r["loss"] for r in rows[name]]) for name in ("fp32", "bf16"))
    deviation = np.abs(loss16 - loss32)
    print(
        f"|bf16 - fp32| loss over {STEPS} steps: max {deviation.max():.4f} (step {deviation.argmax() + 1}), "
        f"mean {deviation.mean():.4f}; fp32 {loss32[0]:.3f} -> {loss32[-1]:.3f}"
    )
    assert deviation.max() > 0  # the bf16 run did compute in bf16
    assert deviation.max() < MAX_DEVIATION and deviation.mean() < MEAN_DEVIATION
    assert loss16[-5:].mean() < loss16[:5].mean() - 1.0  # and it learns

    arrays, meta = ckpt.load(runs["bf16"].checkpoint_dir)
    assert meta["step"] == STEPS and meta["config"]["compute_dtype"] == "bfloat16"
    masters = {
        k: a.dtype
        for k, a in arrays.items()
        if k.startswith(("['params']", "['opt_state']")) and np.issubdtype(a.dtype, np.floating)
    }
    assert masters and set(masters.values()) == {np.dtype(np.float32)}, masters
    assert any(k.startswith("['opt_state']") for k in masters)


def _narrow(**changes):
    base = {
        "model": NARROW_MODEL,
        "seq_len": 16,
        "batch_size": 2,
        "num_steps": 2,
        "schedule": {"warmup_steps": 1, "decay_steps": 1},
    }
    return config_from_dict({**base, **changes})


def _float_dtypes(tree) -> set[str]:
    return {str(x.dtype) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)}


def test_bf16_params_keep_params_and_optimizer_state_in_bf16_through_a_step():
    config = _narrow(param_dtype="bfloat16", compute_dtype="bfloat16")
    model = default_model()
    mesh = meshlib.make_mesh(config.model)
    opt, _, state_sh = state_layout(config, model, mesh)
    state = meshlib.init_sharded(lambda: init_state(config, opt, model), mesh)
    assert _float_dtypes(state.params) == _float_dtypes(state.opt_state) == {"bfloat16"}
    step = make_train_step(config, opt, model, mesh, state_sh)
    rows = np.random.default_rng(0).integers(0, config.model.vocab_size, (2, 16)).astype(np.int32)
    before = jax.device_get(state.params)
    state, metrics = step(state, meshlib.shard_batch(mesh, rows, 2), np.bool_(True), np.float32(1e-2))
    assert np.isfinite(float(metrics["loss"])) and not bool(metrics["skipped"])
    assert _float_dtypes(state.params) == _float_dtypes(state.opt_state) == {"bfloat16"}
    moved = jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))), before, jax.device_get(state.params))
    assert any(jax.tree.leaves(moved))


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("compute_dtype", "fp16", "must be one of ('float32', 'bfloat16'), got 'fp16'"),
        ("compute_dtype", "float16", "must be one of ('float32', 'bfloat16'), got 'float16'"),
        ("param_dtype", "bf16", "must be one of ('float32', 'bfloat16'), got 'bf16'"),
        ("param_dtype", 16, "must be str, got int 16"),
        ("remat", "everything", "must be one of ('none', 'full', 'save_matmuls'), got 'everything'"),
    ],
)
def test_a_bad_precision_or_remat_value_is_a_one_line_config_error(field, value, why):
    with pytest.raises(ConfigError) as caught:
        config_from_dict({**TINY_TRAIN, field: value}, where="run.yaml: config")
    message = str(caught.value)
    assert message == f"run.yaml: config: TrainConfig.{field} {why}" and "\n" not in message


def test_the_knobs_default_to_todays_fp32_without_remat():
    config = config_from_dict(TINY_TRAIN)
    assert (config.compute_dtype, config.param_dtype, config.remat) == ("float32", "float32", "none")
