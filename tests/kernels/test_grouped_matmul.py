"""The blocked grouped matmul equals jax.lax.ragged_dot, forward and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.dispatch import moe_local
from kernels.grouped_matmul import block_layout, default_block, expert_swiglu, grouped_matmul, resolve_impl
from kernels.router import route_topk

# float32, same products summed in a different order: a few ulps of the O(1) outputs.
TOL = 1e-5


def _inputs(M=50, K=16, N=12, G=5, seed=0):
    k = jax.random.split(jax.random.PRNGKey(seed), 2)
    return jax.random.normal(k[0], (M, K)), jax.random.normal(k[1], (G, K, N))


GROUPINGS = [
    [7, 0, 20, 3, 10],  # empty group, rows past the sum (dropped rows)
    [50, 0, 0, 0, 0],  # everything in one group
    [0, 0, 0, 0, 0],  # nothing routed
    [10, 10, 10, 10, 10],
]  # exactly full


@pytest.mark.parametrize("sizes", GROUPINGS)
@pytest.mark.parametrize("block", [None, 8, 16, 64])
def test_blocked_matches_ragged_dot_forward_and_grads(sizes, block):
    x, w = _inputs()
    gs = jnp.array(sizes, jnp.int32)

    def loss(impl):
        return lambda x, w: jnp.sum(jnp.sin(grouped_matmul(x, w, gs, impl, block)))

    ref, got = grouped_matmul(x, w, gs, "ragged_dot"), grouped_matmul(x, w, gs, "blocked", block)
    np.testing.assert_allclose(got, ref, atol=TOL)
    assert not np.asarray(got[int(sum(sizes)) :]).any()  # rows in no group are exact zeros
    for g_ref, g_got in zip(jax.grad(loss("ragged_dot"), (0, 1))(x, w), jax.grad(loss("blocked"), (0, 1))(x, w)):
        np.testing.assert_allclose(g_got, g_ref, atol=TOL)


def test_blocked_swiglu_matches_ragged_dot_grads():
    x, wg = _inputs(K=8, N=6)
    k = jax.random.split(jax.random.PRNGKey(3), 2)
    wu, wd = jax.random.normal(k[0], wg.shape), jax.random.normal(k[1], (5, 6, 8))
    gs = jnp.array([7, 0, 20, 3, 10])

    def loss(impl):
        return lambda *a: jnp.sum(jnp.sin(expert_swiglu(*a, gs, impl, 8)))

    args = (x, wg, wu, wd)
    np.testing.assert_allclose(expert_swiglu(*args, gs, "blocked", 8), expert_swiglu(*args, gs, "ragged_dot"), atol=10 * TOL)
    for g_ref, g_got in zip(jax.grad(loss("ragged_dot"), (0, 1, 2, 3))(*args), jax.grad(loss("blocked"), (0, 1, 2, 3))(*args)):
        np.testing.assert_allclose(g_got, g_ref, atol=10 * TOL)  # larger values: |x| ~ 10


def test_moe_local_blocked_equals_ragged_with_capacity_drops():
    k = jax.random.split(jax.random.PRNGKey(4), 5)
    E, D, F, T = 4, 8, 6, 24
    wg, wu = 0.3 * jax.random.normal(k[0], (E, D, F)), 0.3 * jax.random.normal(k[1], (E, D, F))
    wd = 0.3 * jax.random.normal(k[2], (E, F, D))
    x = jax.random.normal(k[3], (T, D))
    ids, w = route_topk(jax.random.normal(k[4], (T, E)), jnp.zeros(E), 2)
    for capacity in (None, 5):
        ref, ref_drop = moe_local(x, ids, w, wg, wu, wd, capacity, impl="ragged_dot")
        got, got_drop = moe_local(x, ids, w, wg, wu, wd, capacity, impl="blocked")
        assert int(got_drop) == int(ref_drop)
        np.testing.assert_allclose(got, ref, atol=TOL)


def test_block_layout_places_groups_on_block_boundaries():
    src, dst, block_group = block_layout(jnp.array([3, 0, 5]), 10, 4)
    # 3 -> one block, 0 -> none, 5 -> two blocks; bound = (10 + 3*3) // 4 = 4 blocks.
    assert block_group.tolist()[:3] == [0, 2, 2]
    assert dst.tolist() == [0, 1, 2, 4, 5, 6, 7, 8, 16, 16]  # rows 8, 9 in no group
    assert src.tolist()[:12] == [0, 1, 2, 10, 3, 4, 5, 6, 7, 10, 10, 10]


def test_impl_choice():
    assert default_block(4096, 8) == 128 and default_block(24, 4) == 16
    assert resolve_impl("ragged_dot") == "ragged_dot"
    assert resolve_impl("auto") == ("ragged_dot" if jax.default_backend() == "tpu" else "blocked")
    with pytest.raises(ValueError, match="impl must be one of"):
        resolve_impl("dense")
