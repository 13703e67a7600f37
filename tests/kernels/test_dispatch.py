import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.balancing import load_cv
from kernels.dispatch import moe_local, position_in_group
from kernels.expert_parallel import _pack, _unpack, round_robin_counts
from kernels.grouped_matmul import grouped_matmul
from kernels.router import route_topk


def _weights(E=4, D=8, F=6, seed=0):
    k = jax.random.split(jax.random.PRNGKey(seed), 3)
    return (
        0.3 * jax.random.normal(k[0], (E, D, F)),
        0.3 * jax.random.normal(k[1], (E, D, F)),
        0.3 * jax.random.normal(k[2], (E, F, D)),
    )


def _naive(x, ids, w, wg, wu, wd, capacity=None):
    """Token-by-token loop in numpy: the obvious definition of the routed layer."""
    x, ids, w = np.asarray(x), np.asarray(ids), np.asarray(w)
    wg, wu, wd = map(np.asarray, (wg, wu, wd))
    out = np.zeros_like(x)
    seen = np.zeros(wg.shape[0], int)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = ids[t, j]
            seen[e] += 1
            if capacity is not None and seen[e] > capacity:
                continue
            g, u = x[t] @ wg[e], x[t] @ wu[e]
            out[t] += w[t, j] * ((g / (1 + np.exp(-g)) * u) @ wd[e])
    return out


def test_route_topk_selects_on_biased_logits_and_weights_from_unbiased_scores():
    logits = jnp.array([[2.0, 1.0, 0.0, -1.0]])
    ids, w = route_topk(logits, jnp.array([0.0, 0.0, 0.0, 5.0]), 2)
    assert sorted(ids[0].tolist()) == [0, 3]
    s = jax.nn.sigmoid(logits[0])
    np.testing.assert_allclose(np.sort(w[0]), np.sort(np.array([s[0], s[3]]) / float(s[0] + s[3])), rtol=1e-6)


def test_moe_local_matches_naive_loop():
    wg, wu, wd = _weights()
    x = jax.random.normal(jax.random.PRNGKey(1), (12, 8))
    ids, w = route_topk(jax.random.normal(jax.random.PRNGKey(2), (12, 4)), jnp.zeros(4), 2)
    out, dropped = moe_local(x, ids, w, wg, wu, wd)
    assert int(dropped) == 0
    np.testing.assert_allclose(out, _naive(x, ids, w, wg, wu, wd), atol=1e-5)


def test_moe_local_capacity_drops_exactly_the_overflow_in_token_order():
    wg, wu, wd = _weights()
    x = jax.random.normal(jax.random.PRNGKey(3), (6, 8))
    # expert 0 gets 5 assignments, expert 1 gets 4, expert 2 gets 3; capacity 2.
    ids = jnp.array([[0, 1], [0, 1], [0, 2], [0, 1], [0, 2], [1, 2]])
    w = jnp.full((6, 2), 0.5)
    out, dropped = moe_local(x, ids, w, wg, wu, wd, capacity=2)
    assert int(dropped) == (5 - 2) + (4 - 2) + (3 - 2)
    np.testing.assert_allclose(out, _naive(x, ids, w, wg, wu, wd, capacity=2), atol=1e-5)


def test_grouped_matmul_zeroes_rows_past_groups():
    x = jnp.ones((5, 2))
    w = jnp.stack([jnp.eye(2), 2 * jnp.eye(2)])
    out = grouped_matmul(x, w, jnp.array([1, 2]))
    np.testing.assert_allclose(out, [[1, 1], [2, 2], [2, 2], [0, 0], [0, 0]])


def test_position_in_group():
    keys = jnp.array([2, 0, 2, 1, 0, 2])
    assert position_in_group(keys, 3).tolist() == [0, 0, 1, 0, 1, 2]


@pytest.mark.parametrize(
    "counts,cap,want",
    [
        ([5, 1, 3], 9, [5, 1, 3]),  # everything fits
        ([5, 1, 3], 6, [3, 1, 2]),  # rounds: (1,1,1) (1,_,1) (1,_,_) = 6
        ([5, 1, 3], 7, [3, 1, 3]),
        ([4, 4, 4, 4], 6, [2, 2, 1, 1]),  # leftover goes to the first sources
        ([0, 0], 3, [0, 0]),
    ],
)
def test_round_robin_counts(counts, cap, want):
    assert round_robin_counts(jnp.array(counts), cap).tolist() == want


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_pack_unpack_roundtrip_keeps_ids_exact(dtype):
    rows = jnp.arange(12, dtype=jnp.float32).reshape(3, 4).astype(dtype)
    tags = jnp.array([0, 7, 123_456], jnp.int32)
    got_rows, got_tags = _unpack(_pack(rows, tags), 4)
    assert got_tags.tolist() == tags.tolist()
    assert (got_rows == rows).all()


def test_load_cv():
    assert float(load_cv(jnp.array([2, 2, 2, 2]))) == 0.0
    np.testing.assert_allclose(float(load_cv(jnp.array([0, 4]))), 1.0)
