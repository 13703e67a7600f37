"""Optimizer-state offload (issue 25 item 5): ``TrainConfig.offload_optimizer`` keeps the optimizer
state in pinned host memory between steps. XLA:CPU cannot compile the in-step copies, so here we
check what CPU can show: the refusal and its reason, the layout (only the optimizer state moves),
and the lowered step (the moments enter and leave in host memory, copied to the device for the
update). Running it needs a GPU or TPU."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest

from marin_assets.train.config import config_from_dict
from marin_assets.train.distributed import mesh as meshlib
from marin_assets.train.distributed import offload
from marin_assets.train.loop import default_model, make_train_step, state_layout, train
from tests.support.configs import NARROW_MODEL

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="states what XLA:CPU does")


def _narrow(**changes):
    base = {
        "model": NARROW_MODEL,
        "seq_len": 16,
        "batch_size": 2,
        "num_steps": 2,
        "schedule": {"warmup_steps": 1, "decay_steps": 1},
    }
    return config_from_dict({**base, **changes})


def _layout(config):
    model, mesh = default_model(), meshlib.make_mesh(config.model)
    opt, shapes, state_sh = state_layout(config, model, mesh)
    return model, opt, mesh, shapes, state_sh


def test_xla_cpu_cannot_compile_host_offload_and_the_knob_says_why():
    mesh = meshlib.make_mesh(_narrow().model)
    problem = offload.host_offload_problem(mesh)
    assert problem is not None and "annotate_device_placement" in problem  # measured with jax 0.7.2
    with pytest.raises(ValueError, match=r"offload_optimizer: the cpu backend cannot .*annotate_device_placement"):
        offload.check_supported(mesh)


def test_training_with_offload_on_cpu_is_refused_before_the_first_step(caches, tmp_path):
    with pytest.raises(ValueError, match="offload_optimizer"):
        train(_narrow(offload_optimizer=True), caches, tmp_path / "run")
    assert not list((tmp_path / "run").rglob("*.jsonl")) and not (tmp_path / "run" / "checkpoints").exists()


def test_only_the_optimizer_state_moves_to_host_memory():
    *_, state_sh = _layout(_narrow())
    moved = offload.offloaded(state_sh)
    assert {s.memory_kind for s in jax.tree.leaves(moved.opt_state)} == {"pinned_host"}
    for field in ("params", "guard", "router_bias", "step", "rng"):
        assert jax.tree.leaves(getattr(moved, field)) == jax.tree.leaves(getattr(state_sh, field))
        assert "pinned_host" not in {s.memory_kind for s in jax.tree.leaves(getattr(moved, field))}


def _memory_kinds(signature: str) -> list[str]:
    """The memory kind of each argument or result in a lowered main's signature ('device' when unmarked)."""
    parts = re.split(r"%arg\d+: |(?<=[,(])\s*tensor<", signature)
    return ["pinned_host" if 'mhlo.memory_kind = "pinned_host"' in part else "device" for part in parts[1:]]


def test_the_offloaded_step_takes_and_returns_the_moments_in_host_memory():
    config = _narrow(offload_optimizer=True)
    model, opt, mesh, shapes, state_sh = _layout(config)
    host_sh = offload.offloaded(state_sh)
    step = make_train_step(config, opt, model, mesh, host_sh)
    state_in = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, host_sh)
    tokens = jax.ShapeDtypeStruct((2, 16), np.int32, sharding=meshlib.batch_sharding(mesh))
    text = step.lower(state_in, tokens, np.bool_(True), np.float32(1e-2)).as_text()
    main = next(line for line in text.splitlines() if "func.func public @main" in line)
    args, results = main.split("->", 1)
    n_state, n_opt = len(jax.tree.leaves(shapes)), len(jax.tree.leaves(shapes.opt_state))
    # Arguments and results list the state's leaves in tree order: params, then opt_state, ...
    n_params = len(jax.tree.leaves(shapes.params))
    expected = ["device"] * n_params + ["pinned_host"] * n_opt + ["device"] * (n_state - n_params - n_opt)
    assert _memory_kinds(args)[:n_state] == expected
    assert _memory_kinds(results)[:n_state] == expected
    # The update reads device copies: one placement annotation per moment leaf each way.
    assert text.count("annotate_device_placement") >= 2 * n_opt
