"""Partial RoPE and the QK-norm switch: defaults are today's attention bit for bit."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marin_assets.model.config import ModelConfig
from marin_assets.model.layers import attention, partial_rope, rms_norm, rope, rope_dims

CFG = ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=32, max_seq_len=16)


def reference_attention(p, x, config, qk_norm=True):
    """The attention of commit 33153dd (before the switches), copied verbatim."""
    B, S, _ = x.shape
    H, KV, hd = config.n_heads, config.n_kv_heads, config.resolved_head_dim
    q = (x @ p["wq"]).reshape(B, S, H, hd)
    k = (x @ p["wk"]).reshape(B, S, KV, hd)
    v = (x @ p["wv"]).reshape(B, S, KV, hd)
    if qk_norm:
        q = rms_norm(q, p["q_norm"], config.norm_eps)
        k = rms_norm(k, p["k_norm"], config.norm_eps)
    positions = jnp.arange(S)
    q, k = rope(q, positions, config.rope_theta), rope(k, positions, config.rope_theta)
    q = q.reshape(B, S, KV, H // KV, hd)
    scores = jnp.einsum("bqkgd,bskd->bkgqs", q, k).astype(jnp.float32) / jnp.sqrt(hd)
    causal = jnp.tril(jnp.ones((S, S), bool))
    scores = jnp.where(causal, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgqs,bskd->bqkgd", probs, v).reshape(B, S, H * hd)
    return out @ p["wo"]


def params(config, seed=0):
    keys = jax.random.split(jax.random.PRNGKey(seed), 6)
    D, H, KV, hd = config.d_model, config.n_heads, config.n_kv_heads, config.resolved_head_dim
    return {
        "wq": jax.random.normal(keys[0], (D, H * hd)) * 0.2,
        "wk": jax.random.normal(keys[1], (D, KV * hd)) * 0.2,
        "wv": jax.random.normal(keys[2], (D, KV * hd)) * 0.2,
        "wo": jax.random.normal(keys[3], (H * hd, D)) * 0.2,
        "q_norm": 1.0 + 0.1 * jax.random.normal(keys[4], (hd,)),
        "k_norm": 1.0 + 0.1 * jax.random.normal(keys[5], (hd,)),
    }


X = jax.random.normal(jax.random.PRNGKey(9), (2, 12, 32))


def test_defaults_are_bit_identical_to_before():
    assert CFG.rope_fraction == 1.0 and CFG.qk_norm is True and rope_dims(CFG) == CFG.resolved_head_dim
    p = params(CFG)
    np.testing.assert_array_equal(np.asarray(attention(p, X, CFG)), np.asarray(reference_attention(p, X, CFG)))


def test_qk_norm_off_skips_the_norm():
    p = params(CFG)
    off = dataclasses.replace(CFG, qk_norm=False)
    np.testing.assert_array_equal(np.asarray(attention(p, X, off)), np.asarray(reference_attention(p, X, off, qk_norm=False)))
    assert not np.allclose(np.asarray(attention(p, X, off)), np.asarray(attention(p, X, CFG)), atol=1e-3)


def test_partial_rope_rotates_only_the_leading_dims():
    half = dataclasses.replace(CFG, rope_fraction=0.5)  # head_dim 8 -> 4 rotated dims
    assert rope_dims(half) == 4
    x = jax.random.normal(jax.random.PRNGKey(1), (1, 6, 2, 8))
    positions = jnp.arange(6)
    out = partial_rope(x, positions, half)
    np.testing.assert_array_equal(np.asarray(out[..., 4:]), np.asarray(x[..., 4:]))  # position-free dims
    np.testing.assert_array_equal(np.asarray(out[..., :4]), np.asarray(rope(x[..., :4], positions, half.rope_theta)))
    none = dataclasses.replace(CFG, rope_fraction=0.0)
    np.testing.assert_array_equal(np.asarray(partial_rope(x, positions, none)), np.asarray(x))
    assert rope_dims(dataclasses.replace(CFG, rope_fraction=0.3)) == 2  # 2.4 dims -> 2 (even)
    p = params(CFG)
    assert not np.allclose(np.asarray(attention(p, X, half)), np.asarray(attention(p, X, CFG)), atol=1e-3)


@pytest.mark.slow
def test_partial_rope_trains_through_the_model():
    from marin_assets.model import init_params, init_router_bias, loss_fn

    cfg = dataclasses.replace(CFG, rope_fraction=0.5, qk_norm=False, n_routed_experts=2, top_k=1, expert_d_ff=16)
    p = init_params(cfg, jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 12), 0, 64)
    (loss, _), grads = jax.value_and_grad(lambda q: loss_fn(q, tokens, cfg, init_router_bias(cfg)), has_aux=True)(p)
    assert np.isfinite(float(loss))
    # With QK-norm off its gains get no gradient (kept in the tree, unused).
    assert float(jnp.abs(grads["layers"]["q_norm"]).max()) == 0.0
    assert float(jnp.abs(grads["layers"]["wq"]).max()) > 0.0


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -0.1, 1.5])
def test_bad_rope_fraction_is_refused(value):
    with pytest.raises(ValueError, match="rope_fraction must be (in|finite)"):
        dataclasses.replace(CFG, rope_fraction=value)


def test_qk_norm_must_be_a_bool():
    with pytest.raises(ValueError, match="qk_norm must be bool"):
        dataclasses.replace(CFG, qk_norm="no")


@settings(max_examples=100, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True))
def test_rope_fraction_accepted_exactly_in_unit_interval(value):
    try:
        cfg = dataclasses.replace(CFG, rope_fraction=value)
    except ValueError:
        assert not (0.0 <= value <= 1.0)
        return
    assert 0.0 <= value <= 1.0 and rope_dims(cfg) % 2 == 0 and 0 <= rope_dims(cfg) <= cfg.resolved_head_dim
