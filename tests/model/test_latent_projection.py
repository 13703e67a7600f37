"""The optional latent projection of the routed experts' input (ModelConfig.latent_dim): off by default, and when on
the routed experts (and the expert-parallel exchange that carries their tokens) work at the latent width."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.dispatch import moe_local
from kernels.router import route_topk
from marin_assets.model import ModelConfig, init_params
from marin_assets.model.layers import swiglu
from marin_assets.model.moe import moe_mlp

BASE = ModelConfig(
    vocab_size=64,
    d_model=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    d_ff=32,
    n_routed_experts=4,
    top_k=2,
    expert_d_ff=16,
    max_seq_len=16,
)
LATENT = dataclasses.replace(BASE, latent_dim=8)


def _shapes(config: ModelConfig) -> dict:
    """The layer weights' shapes, traced (nothing initialised)."""
    tree = jax.eval_shape(lambda key: init_params(config, key), jax.random.PRNGKey(0))
    return {name: leaf.shape for name, leaf in tree["layers"].items()}


def _layer0(config: ModelConfig) -> dict:
    """Layer weights of init_params' shapes, drawn with numpy: compiling the init costs more than these tests."""
    rng = np.random.default_rng(0)
    return {name: jnp.asarray(rng.normal(0.0, 0.2, shape[1:]), jnp.float32) for name, shape in _shapes(config).items()}


_moe = jax.jit(moe_mlp, static_argnums=(2, 4))


def _x() -> jax.Array:
    return jax.random.normal(jax.random.PRNGKey(3), (2, 8, 32))


class _RecordingEP:
    """Stands in for kernels.expert_parallel.ExpertParallel: records what the exchange would carry."""

    def __init__(self, config: ModelConfig):
        self.config, self.widths = config, []

    def __call__(self, x, ids, weights, w_gate, w_up, w_down):
        self.widths.append(x.shape[-1])
        return moe_local(x, ids, weights, w_gate, w_up, w_down, impl=self.config.grouped_matmul)


def test_off_by_default_with_no_projection_weights():
    assert ModelConfig().latent_dim is None and BASE.routed_dim == BASE.d_model
    layers = _shapes(BASE)
    assert "latent_down" not in layers and "latent_up" not in layers
    assert layers["e_gate"] == (2, 4, 32, 16) and layers["e_down"] == (2, 4, 16, 32)


def test_on_the_experts_work_at_the_latent_width():
    layers = _shapes(LATENT)
    assert layers["latent_down"] == (2, 32, 8) and layers["latent_up"] == (2, 8, 32)
    assert layers["e_gate"] == layers["e_up"] == (2, 4, 8, 16) and layers["e_down"] == (2, 4, 16, 8)


@pytest.mark.parametrize("config,width", [(BASE, 32), (LATENT, 8)])
def test_the_expert_parallel_exchange_carries_routed_dim_values_per_token(config, width):
    ep = _RecordingEP(config)
    p, bias = _layer0(config), jnp.zeros((4,))
    out, _ = _moe(p, _x(), config, bias, ep)
    assert ep.widths == [width] == [config.routed_dim] and out.shape == (2, 8, 32)
    local, _ = _moe(p, _x(), config, bias, None)
    np.testing.assert_array_equal(out, local)  # the recorder computes what the local path does


def _by_hand(config: ModelConfig, p: dict, x: jax.Array) -> jax.Array:
    xt = x.reshape(-1, config.d_model)
    ids, weights = route_topk(xt.astype(jnp.float32) @ p["router"].astype(jnp.float32), jnp.zeros((4,)), config.top_k)
    routed_in = xt @ p["latent_down"] if config.latent_dim is not None else xt
    routed, _ = moe_local(routed_in, ids, weights, p["e_gate"], p["e_up"], p["e_down"], impl=config.grouped_matmul)
    if config.latent_dim is not None:
        routed = routed @ p["latent_up"]
    return (routed + swiglu(xt, p["w_gate"], p["w_up"], p["w_down"])).reshape(x.shape)


@pytest.mark.parametrize("config", [BASE, LATENT])
def test_moe_mlp_is_project_down_experts_project_up_plus_shared(config):
    p = _layer0(config)
    out, _ = _moe(p, _x(), config, jnp.zeros((4,)), None)
    np.testing.assert_array_equal(out, jax.jit(_by_hand, static_argnums=0)(config, p, _x()))


def test_the_projections_are_trained():
    grads = jax.jit(jax.grad(lambda q: jnp.sum(moe_mlp(q, _x(), LATENT, jnp.zeros((4,)))[0] ** 2)))(_layer0(LATENT))
    for name in ("latent_down", "latent_up"):
        assert float(jnp.max(jnp.abs(grads[name]))) > 0, name


@pytest.mark.parametrize("latent", [0, -8, 2.5, True])
def test_a_bad_latent_width_is_refused_naming_the_field(latent):
    with pytest.raises(ValueError, match="latent_dim"):
        dataclasses.replace(BASE, latent_dim=latent)
