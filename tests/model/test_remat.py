"""Activation rematerialisation per layer (issue 25 item 3): the TrainConfig knob ``remat``
(none | full | save_matmuls) leaves losses and gradients as they are and lowers the compiled train
step's temporary memory (``memory_analysis().temp_size_in_bytes``)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from marin_assets.model import ModelConfig, init_params, init_router_bias, loss_fn
from marin_assets.model.compute import rematerialised
from marin_assets.model.config import REMAT_NAMES
from marin_assets.train.config import config_from_dict
from marin_assets.train.distributed import mesh as meshlib
from marin_assets.train.loop import default_model, make_train_step, state_layout

# Three layers and 128-token sequences: the per-layer activations (attention's [S, S] per head
# above all) outweigh the parameters, as they do at scale.
MODEL = {
    "vocab_size": 64,
    "d_model": 32,
    "n_layers": 3,
    "n_heads": 2,
    "n_kv_heads": 1,
    "d_ff": 64,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "top_k": 2,
    "expert_d_ff": 32,
    "max_seq_len": 128,
}
SEQ, BATCH = 128, 2
# The memory test's model: the same without experts. Remat's saving is in the activations either way
# (measured: temp bytes full/none 0.32 dense, 0.31 MoE), and a dense step compiles in half the time.
DENSE = {**MODEL, "n_routed_experts": 0, "n_shared_experts": 0, "top_k": 0, "expert_d_ff": 0}


def _grads(remat: str):
    config = ModelConfig(**MODEL)
    params = init_params(config, jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (BATCH, 32), 0, config.vocab_size)  # short: compiles faster
    fn = jax.jit(jax.value_and_grad(lambda p: loss_fn(p, tokens, config, init_router_bias(config), remat=remat), has_aux=True))
    (loss, _), grads = fn(params)
    return float(loss), grads


@pytest.mark.slow  # compiles three gradients / train steps: minutes on 2 busy cores
def test_losses_and_grads_agree_across_policies():
    loss0, grads0 = _grads("none")
    for policy in ("full", "save_matmuls"):
        loss, grads = _grads(policy)
        worst = max(float(np.max(np.abs(a - b))) for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads0), strict=True))
        print(f"remat={policy}: |loss - none| {abs(loss - loss0):.2e}, max |grad - none| {worst:.2e}")
        assert abs(loss - loss0) <= 1e-6 and worst <= 1e-6, (policy, loss - loss0, worst)


def _temp_bytes(remat: str) -> int:
    config = config_from_dict(
        {
            "model": DENSE,
            "seq_len": SEQ,
            "batch_size": BATCH,
            "num_steps": 2,
            "remat": remat,
            "schedule": {"warmup_steps": 1, "decay_steps": 1},
        }
    )
    model = default_model()
    mesh = meshlib.make_mesh(config.model)
    opt, state, state_sh = state_layout(config, model, mesh)
    step = make_train_step(config, opt, model, mesh, state_sh)
    tokens = jax.ShapeDtypeStruct((BATCH, SEQ), np.int32)
    compiled = step.lower(state, tokens, np.bool_(True), np.float32(1e-3)).compile()
    return int(compiled.memory_analysis().temp_size_in_bytes)


@pytest.mark.slow  # compiles three gradients / train steps: minutes on 2 busy cores
def test_remat_lowers_the_compiled_steps_temporary_memory():
    temp = {policy: _temp_bytes(policy) for policy in REMAT_NAMES}
    print("temp bytes of the compiled train step:", temp)
    # full keeps each layer's input only; save_matmuls also keeps the weight matmuls' outputs
    assert temp["full"] < temp["save_matmuls"] < temp["none"]
    assert temp["full"] < 0.5 * temp["none"]


def test_none_leaves_the_layer_as_it_is_and_bad_names_are_refused():
    def layer(x):
        return x

    assert rematerialised(layer, "none") is layer
    with pytest.raises(ValueError, match=r"^remat must be one of \('none', 'full', 'save_matmuls'\), got 'some'$"):
        rematerialised(layer, "some")
