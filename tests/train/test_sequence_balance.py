"""The sequence-wise balance loss (DeepSeek-V3's complementary loss): its value, its gradient's direction and
its place in loss_fn as a ModelConfig balancing option."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.balancing import sequence_balance_loss
from kernels.router import route_topk
from marin_assets.model import ModelConfig, init_params, init_router_bias, loss_fn


def test_known_answer_by_hand():
    # one sequence of 2 tokens, 2 experts, top-1: token 0 picks expert 0, token 1 expert 0 too
    logits = jnp.array([[1.0, 0.0], [2.0, -1.0]])
    ids = jnp.array([[0], [0]])
    s = 1 / (1 + np.exp(-np.array([[1.0, 0.0], [2.0, -1.0]])))
    p = (s / s.sum(1, keepdims=True)).mean(0)
    f = np.array([2, 0]) * 2 / (1 * 2)
    assert float(sequence_balance_loss(logits, ids, 1)) == pytest.approx(float(f @ p), rel=1e-6)


def test_even_sequences_score_one_and_a_lopsided_one_more():
    E, k, S = 4, 2, 8
    even_ids = jnp.array([[t % E, (t + 1) % E] for t in range(S)])
    assert float(sequence_balance_loss(jnp.zeros((S, E)), even_ids, 1)) == pytest.approx(1.0)
    lopsided = jnp.tile(jnp.array([[3.0, 2.0, -2.0, -2.0]]), (S, 1))
    ids, _ = route_topk(lopsided, jnp.zeros(E), k)
    assert float(sequence_balance_loss(lopsided, ids, 1)) > 1.2
    with pytest.raises(ValueError, match="16 tokens do not split into 3 sequences"):
        sequence_balance_loss(jnp.zeros((16, E)), ids[:16].repeat(2, 0), 3)


def test_descent_on_the_loss_evens_a_sequence_that_piles_onto_few_experts():
    """A router whose sequence-1 tokens all prefer experts 0 and 1: a few gradient steps on the loss alone
    spread that sequence's choices (the batch-wide bias could not: sequence 2 prefers 2 and 3)."""
    E, k, S, D = 4, 2, 32, 8
    x = jax.random.normal(jax.random.PRNGKey(0), (2 * S, D))
    w = jnp.zeros((D, E))
    skew = jnp.concatenate(
        [jnp.tile(jnp.array([[2.0, 2.0, 0.0, 0.0]]), (S, 1)), jnp.tile(jnp.array([[0.0, 0.0, 2.0, 2.0]]), (S, 1))]
    )

    def loss(w):
        logits = skew + x @ w
        ids, _ = route_topk(logits, jnp.zeros(E), k)
        return sequence_balance_loss(logits, ids, 2)

    before, grad = float(loss(w)), jax.jit(jax.grad(loss))
    for _ in range(100):
        w = w - 5.0 * grad(w)
    assert float(loss(w)) < before - 0.2


def test_loss_fn_adds_the_coefficient_times_the_layer_mean():
    config = ModelConfig(
        vocab_size=64,
        d_model=16,
        n_layers=2,
        n_heads=2,
        n_kv_heads=1,
        d_ff=32,
        n_routed_experts=4,
        top_k=2,
        expert_d_ff=16,
        max_seq_len=16,
    )
    params, bias = init_params(config, jax.random.PRNGKey(1)), init_router_bias(config)
    tokens = jax.random.randint(jax.random.PRNGKey(2), (2, 16), 0, 64)
    run = jax.jit(loss_fn, static_argnums=2)
    off, aux_off = run(params, tokens, config, bias)
    on, aux_on = run(params, tokens, dataclasses.replace(config, sequence_balance_loss=0.5), bias)
    assert np.all(np.asarray(aux_off["seq_balance"]) == 0.0)
    terms = np.asarray(aux_on["seq_balance"])
    assert terms.shape == (2,) and np.all(terms >= 0.99)
    assert float(on) == pytest.approx(float(off) + 0.5 * terms.mean(), rel=1e-6)
    for bad in (float("nan"), -1.0):
        with pytest.raises(ValueError, match="ModelConfig.sequence_balance_loss must be"):
            ModelConfig(sequence_balance_loss=bad)
