import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marin_assets.model import ModelConfig, init_params, init_router_bias, next_router_bias
from marin_assets.model import forward as _forward
from marin_assets.model import loss_fn as _loss_fn

# Compiled once per config: op-by-op dispatch of these small models costs ~10x the compile on CPU.
forward = jax.jit(_forward, static_argnums=2)
loss_fn = jax.jit(_loss_fn, static_argnums=2)

CONFIGS = {
    "moe": ModelConfig(
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
    ),
    "dense": ModelConfig(
        vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=32, n_routed_experts=0, max_seq_len=16
    ),
    "latent_hist": ModelConfig(
        vocab_size=64,
        d_model=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=4,
        d_ff=32,
        n_routed_experts=4,
        top_k=1,
        expert_d_ff=16,
        latent_dim=8,
        balancing="quantile_histogram",
        max_seq_len=16,
        router_z_loss=1e-3,
    ),
}


def _tokens(B=2, S=16, V=64, seed=1):
    return jax.random.randint(jax.random.PRNGKey(seed), (B, S), 0, V)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_forward_shapes_and_causality(name):
    c = CONFIGS[name]
    p, bias, tok = init_params(c, jax.random.PRNGKey(0)), init_router_bias(c), _tokens()
    logits, aux = forward(p, tok, c, bias)
    assert logits.shape == (2, 16, 64) and logits.dtype == jnp.float32
    assert aux["expert_load"].shape == (2, c.n_routed_experts)
    if c.is_moe:  # every token makes exactly top_k choices per layer
        assert aux["expert_load"].sum(axis=1).tolist() == [32 * c.top_k] * 2
    # Changing the last token must not change any earlier position's logits.
    logits2, _ = forward(p, tok.at[:, -1].set((tok[:, -1] + 1) % 64), c, bias)
    np.testing.assert_allclose(logits[:, :-1], logits2[:, :-1], atol=1e-5)
    assert not np.allclose(logits[:, -1], logits2[:, -1])


def test_router_bias_gets_no_gradient_and_changes_routing():
    c = CONFIGS["moe"]
    p, tok = init_params(c, jax.random.PRNGKey(0)), _tokens()
    bias = jnp.zeros((2, 4)).at[:, 0].set(10.0)  # forces expert 0 into every top-2
    g = jax.jit(jax.grad(lambda b: _loss_fn(p, tok, c, b)[0]))(bias)
    assert float(jnp.max(jnp.abs(g))) == 0.0
    _, aux = loss_fn(p, tok, c, bias)
    assert aux["expert_load"][:, 0].tolist() == [32, 32]


def test_loss_mask_and_z_losses():
    c = CONFIGS["latent_hist"]
    p, bias, tok = init_params(c, jax.random.PRNGKey(0)), init_router_bias(c), _tokens()
    loss, aux = loss_fn(p, tok, c, bias)
    np.testing.assert_allclose(
        loss, aux["ce_loss"] + c.lm_z_loss * aux["lm_z_loss"] + c.router_z_loss * aux["router_z_loss"], rtol=1e-6
    )
    mask = jnp.zeros_like(tok).at[:, :5].set(1)
    _, aux_m = loss_fn(p, tok, c, bias, loss_mask=mask)
    assert float(aux_m["n_tokens"]) == 2 * 4  # targets at positions 1..4
    logits, _ = forward(p, tok, c, bias)
    lp = jax.nn.log_softmax(logits[:, :4])
    want = -jnp.mean(jnp.take_along_axis(lp, tok[:, 1:5, None], axis=-1))
    np.testing.assert_allclose(aux_m["ce_loss"], want, rtol=1e-5)


def test_next_router_bias_is_mean_centred_and_moves_against_load():
    c = CONFIGS["moe"]
    p, tok = init_params(c, jax.random.PRNGKey(0)), _tokens(B=8)
    bias = jnp.zeros((2, 4)).at[:, 0].set(1.0).at[:, 1].set(-1.0)
    _, aux = loss_fn(p, tok, c, bias)
    new = next_router_bias(bias, aux, c)
    np.testing.assert_allclose(new.mean(axis=1), 0.0, atol=1e-6)
    assert (new[:, 0] < bias[:, 0]).all()  # overloaded expert pushed down
    off = next_router_bias(bias, aux, ModelConfig(**{**c.__dict__, "balancing": "none"}))
    np.testing.assert_array_equal(off, bias)


def test_invalid_tokens_shape():
    c = CONFIGS["dense"]
    with pytest.raises(ValueError, match="tokens"):
        forward(init_params(c, jax.random.PRNGKey(0)), jnp.zeros((16,), jnp.int32), c, init_router_bias(c))


def test_grouped_matmul_impls_give_the_same_loss_and_grads():
    """The blocked grouped matmul (default off TPU) matches ragged_dot through the model, on the
    config with the latent projection and histogram balancing. tests/kernels/test_grouped_matmul.py
    compares the two kernels themselves (uneven groups, capacity drops); a second model config here
    cost ~15 s of the inner loop for no path the kernel tests miss."""
    import dataclasses

    c = CONFIGS["latent_hist"]
    p, bias, tok = init_params(c, jax.random.PRNGKey(0)), init_router_bias(c), _tokens()
    results = {}
    for impl in ("ragged_dot", "blocked"):
        ci = dataclasses.replace(c, grouped_matmul=impl)
        results[impl] = jax.jit(jax.value_and_grad(_loss_fn, has_aux=True), static_argnums=2)(p, tok, ci, bias)
    (l_ref, aux_ref), g_ref = results["ragged_dot"]
    (l_got, aux_got), g_got = results["blocked"]
    np.testing.assert_allclose(l_got, l_ref, rtol=1e-6)
    np.testing.assert_array_equal(aux_got["expert_load"], aux_ref["expert_load"])
    for a, b in zip(jax.tree.leaves(g_got), jax.tree.leaves(g_ref)):
        np.testing.assert_allclose(a, b, atol=1e-6)  # float32; grads here are O(1e-2)
