"""Quantile balancing on a deliberately skewed router."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.balancing import apply_shift, load_cv, quantile_shift_exact, quantile_shift_histogram
from kernels.router import expert_load, route_topk

T, E, K = 2048, 16, 2
SKEW = jnp.linspace(0.0, 3.0, E)  # expert 15's logits are +3 over expert 0's


def _logits(step):
    return jax.random.normal(jax.random.PRNGKey(step), (T, E)) + SKEW


def _run(shift_fn, steps=8, rate=0.5):
    bias, cvs = jnp.zeros(E), []
    for step in range(steps + 1):
        logits = _logits(step)  # fresh tokens every step: the bias is always one step stale
        ids, _ = route_topk(logits, bias, K)
        cvs.append(float(load_cv(expert_load(ids, E))))
        bias = apply_shift(bias, shift_fn(logits, bias, K), rate)
    return cvs, bias


@pytest.mark.parametrize(
    "name,shift_fn",
    [
        ("exact", quantile_shift_exact),
        ("histogram", lambda l, b, k: quantile_shift_histogram(l, b, k, bins=10_000)),
    ],
)
def test_skewed_router_load_cv_falls(name, shift_fn):
    cvs, bias = _run(shift_fn)
    # Measured on this setup: CV 1.18 before, 0.07 after 8 steps (both variants, rate 0.5);
    # sampling noise alone on 256 tokens/expert is ~0.06.
    assert cvs[0] > 1.0
    assert cvs[-1] < 0.15, cvs
    np.testing.assert_allclose(float(bias.mean()), 0.0, atol=1e-5)
    assert float(bias[0]) > float(bias[-1])  # the favoured expert is pushed down


def test_one_exact_step_gives_fair_share_on_the_same_tokens():
    logits = _logits(0)
    shift = quantile_shift_exact(logits, jnp.zeros(E), K)
    # Applied one expert at a time (the others held fixed), each expert gets T*k/E.
    for e in (0, 7, 15):
        bias = jnp.zeros(E).at[e].set(-shift[e])
        ids, _ = route_topk(logits, bias, K)
        assert int(expert_load(ids, E)[e]) == T * K // E


def test_histogram_matches_exact_quantile():
    logits, bias = _logits(3), 0.1 * jax.random.normal(jax.random.PRNGKey(9), (E,))
    exact = quantile_shift_exact(logits, bias, K)
    hist = quantile_shift_histogram(logits, bias, K, bins=10_000)
    np.testing.assert_allclose(hist, exact, atol=0.02)
    coarse = quantile_shift_histogram(logits, bias, K, bins=10)
    assert float(jnp.max(jnp.abs(coarse - exact))) > float(jnp.max(jnp.abs(hist - exact)))


def test_shift_has_no_gradient():
    g = jax.grad(lambda l: jnp.sum(quantile_shift_exact(l, jnp.zeros(E), K)))(_logits(0))
    assert float(jnp.max(jnp.abs(g))) == 0.0
