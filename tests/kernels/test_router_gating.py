"""route_topk's gating: sigmoid (ours, the default, unchanged) and softmax over every expert (Mixtral's and
Qwen3-MoE's router, which an exact HF export needs)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.router import route_topk


def _logits():
    return jax.random.normal(jax.random.PRNGKey(0), (64, 8), jnp.float32) * 3.0


def test_softmax_gating_is_mixtrals_router():
    """Mixtral (HF MixtralSparseMoeBlock): softmax over all experts, top-k of it, renormalised."""
    logits = _logits()
    ids, weights = route_topk(logits, jnp.zeros((8,)), 2, "softmax")
    probs = np.asarray(jax.nn.softmax(logits, axis=-1))
    want_ids = np.argsort(-probs, axis=-1)[:, :2]
    chosen = np.take_along_axis(probs, want_ids, axis=-1)
    assert np.array_equal(np.asarray(ids), want_ids)
    np.testing.assert_allclose(np.asarray(weights), chosen / chosen.sum(-1, keepdims=True), rtol=1e-6)
    # Not the sigmoid weights: with these logits the two gatings differ.
    _, sigmoid_weights = route_topk(logits, jnp.zeros((8,)), 2)
    assert np.max(np.abs(np.asarray(sigmoid_weights) - np.asarray(weights))) > 0.05


def test_sigmoid_gating_is_unchanged_and_the_default():
    logits, bias = _logits(), jnp.linspace(-1.0, 1.0, 8)
    ids, weights = route_topk(logits, bias, 2)
    _, want_ids = jax.lax.top_k(logits + bias, 2)
    chosen = jnp.take_along_axis(jax.nn.sigmoid(logits), want_ids, axis=-1)
    assert np.array_equal(np.asarray(ids), np.asarray(want_ids))
    assert np.asarray(weights).tobytes() == np.asarray(chosen / jnp.sum(chosen, -1, keepdims=True)).tobytes()


def test_an_unknown_gating_is_refused_by_route_topk_and_the_config():
    from marin_assets.model.config import ModelConfig

    with pytest.raises(ValueError, match="gating must be one of"):
        route_topk(_logits(), jnp.zeros((8,)), 2, "relu")
    with pytest.raises(ValueError, match=r"ModelConfig.router_gating must be one of \('sigmoid', 'softmax'\)"):
        ModelConfig(router_gating="relu")  # pyright: ignore[reportArgumentType] - the refusal is the point
    assert ModelConfig().router_gating == "sigmoid"
