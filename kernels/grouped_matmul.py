"""Grouped expert matmul over rows sorted by expert.

Two implementations of the same math (row block g of x times ``w[g]``):

``"ragged_dot"``  ``jax.lax.ragged_dot``. On TPU XLA has a native grouped matmul for it;
    elsewhere (XLA:CPU, and the jax 0.7 fallback in general) it is lowered densely:
    every row is multiplied by *every* group's weight and masked, i.e. G times the
    FLOPs and a [G, M, K] temporary. That made it ~75% of a CPU MoE train step.

``"blocked"``  Megablox-style: each group is padded to a multiple of ``block`` rows so
    every block of rows belongs to one group; the blocks are then one batched matmul
    against the per-block weights ``w[block_group]``. FLOPs are the real ones plus at
    most ``G * (block - 1)`` padding rows. The row moves are pure gathers in both
    directions (a custom VJP, since padding is a partial permutation), so there are no
    scatters, which are slow on XLA:CPU.

``"auto"`` (the default everywhere) picks ``ragged_dot`` on TPU and ``blocked`` elsewhere.
The two agree to float32 rounding (tests/kernels/test_grouped_matmul.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.choices import GROUPED_MATMUL_IMPLS as IMPLS


def resolve_impl(impl: str) -> str:
    """``"auto"`` -> the implementation that is fast on the current default backend."""
    if impl not in IMPLS:
        raise ValueError(f"grouped matmul impl must be one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        return "ragged_dot" if jax.default_backend() == "tpu" else "blocked"
    return impl


def default_block(n_rows: int, n_groups: int) -> int:
    """Rows per block: a power of two in [16, 128], padding at most ~1/4 of the rows.

    Small blocks waste few FLOPs on padding but copy one [K, N] weight per block; on
    XLA:CPU (measured, E=8, K=256, N=512) blocks below ~64 rows lose more to those copies.
    """
    target = max(16, n_rows // (4 * max(n_groups, 1)))
    block = 16
    while block * 2 <= min(target, 128):
        block *= 2
    return block


# -- row moves: gathers both ways --------------------------------------------------------


@jax.custom_vjp
def permute_rows(x: jax.Array, index: jax.Array, inverse: jax.Array) -> jax.Array:
    """out[i] = x[index[i]] (zeros where index is out of range).

    ``index`` must be a partial permutation with inverse ``inverse``: each row j of x is
    read by at most one i, and ``inverse[j]`` is that i (out of range if none). The
    gradient is then a gather too: dx[j] = dout[inverse[j]].
    """
    return jnp.take(x, index, axis=0, mode="fill", fill_value=0)


def _permute_fwd(x, index, inverse):
    return permute_rows(x, index, inverse), (index, inverse)


def _permute_bwd(res, g):
    index, inverse = res
    return jnp.take(g, inverse, axis=0, mode="fill", fill_value=0), None, None


permute_rows.defvjp(_permute_fwd, _permute_bwd)


# -- blocked layout ----------------------------------------------------------------------


def block_layout(group_sizes: jax.Array, n_rows: int, block: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Where each sorted row goes when every group starts on a block boundary.

    group_sizes: [G] (sum <= n_rows; rows past the sum belong to no group).
    Returns (src [R] padded slot -> sorted row, n_rows where padding;
             dst [n_rows] sorted row -> padded slot, R where the row is in no group;
             block_group [R // block] the group of each block).
    R = block * floor((n_rows + G * (block - 1)) / block) bounds sum(ceil(size / block)) * block.
    """
    G = group_sizes.shape[0]
    gs = group_sizes.astype(jnp.int32)
    n_blocks = (n_rows + G * (block - 1)) // block
    R = n_blocks * block
    padded = (gs + block - 1) // block * block
    start, pstart = jnp.cumsum(gs) - gs, jnp.cumsum(padded) - padded

    # Sorted row -> padded slot.
    row = jnp.arange(n_rows, dtype=jnp.int32)
    g_row = jnp.searchsorted(jnp.cumsum(gs), row, side="right").astype(jnp.int32)
    in_group = g_row < G
    g_row = jnp.minimum(g_row, G - 1)
    dst = jnp.where(in_group, pstart[g_row] + row - start[g_row], R)

    # Padded slot -> sorted row (blocks past the last group hold only padding).
    block_group = jnp.searchsorted(jnp.cumsum(padded) // block, jnp.arange(n_blocks), side="right")
    used_block = block_group < G
    block_group = jnp.minimum(block_group, G - 1).astype(jnp.int32)
    slot = jnp.arange(R, dtype=jnp.int32)
    g_slot = jnp.repeat(block_group, block, total_repeat_length=R)
    offset = slot - pstart[g_slot]
    valid = jnp.repeat(used_block, block, total_repeat_length=R) & (offset < gs[g_slot])
    src = jnp.where(valid, start[g_slot] + offset, n_rows)
    return src, dst, block_group


def _block_matmul(xp: jax.Array, w: jax.Array, block_group: jax.Array) -> jax.Array:
    """xp: [R, K] padded rows; w: [G, K, N]; block_group: [R // block] -> [R, N]."""
    n_blocks = block_group.shape[0]
    R, K = xp.shape
    # block_group is clipped to [0, G): a plain gather, no out-of-range select.
    wb = w.at[block_group].get(mode="promise_in_bounds")  # [n_blocks, K, N]
    out = jnp.einsum("nbk,nkf->nbf", xp.reshape(n_blocks, R // n_blocks, K), wb)
    return out.reshape(R, w.shape[-1])


def _blocked(fn, x: jax.Array, group_sizes: jax.Array, n_groups: int, block: int | None):
    """Run ``fn(xp, block_group)`` on the padded layout of x and bring the rows back."""
    M = x.shape[0]
    block = block or default_block(M, n_groups)
    src, dst, block_group = block_layout(group_sizes, M, block)
    out = fn(permute_rows(x, src, dst), block_group)
    return permute_rows(out, dst, src)  # rows in no group read slot R: zeros


# -- public ops --------------------------------------------------------------------------


def _ragged(x, w, group_sizes):
    out = jax.lax.ragged_dot(x, w, group_sizes.astype(jnp.int32))
    used = jnp.arange(x.shape[0]) < jnp.sum(group_sizes)
    return jnp.where(used[:, None], out, jnp.zeros((), out.dtype))


def grouped_matmul(x: jax.Array, w: jax.Array, group_sizes: jax.Array, impl: str = "auto", block: int | None = None) -> jax.Array:
    """x: [M, K] rows sorted by group; w: [G, K, N]; group_sizes: [G] int32.

    Row block g (the next ``group_sizes[g]`` rows) is multiplied by ``w[g]``. Rows past
    ``sum(group_sizes)`` (dropped or padding rows) come out as zeros. ``impl``: see the
    module docstring; ``block``: rows per block for ``"blocked"`` (None: default_block).
    """
    if resolve_impl(impl) == "ragged_dot":
        return _ragged(x, w, group_sizes)
    return _blocked(lambda xp, bg: _block_matmul(xp, w, bg), x, group_sizes, w.shape[0], block)


def expert_swiglu(
    x: jax.Array,
    w_gate: jax.Array,
    w_up: jax.Array,
    w_down: jax.Array,
    group_sizes: jax.Array,
    impl: str = "auto",
    block: int | None = None,
) -> jax.Array:
    """SwiGLU per expert on rows sorted by expert: down(silu(x @ gate) * (x @ up)).

    The blocked path pads once for all three matmuls (padding rows stay zero throughout:
    silu(0) * 0 = 0).
    """
    if resolve_impl(impl) == "ragged_dot":
        gate, up = _ragged(x, w_gate, group_sizes), _ragged(x, w_up, group_sizes)
        return _ragged(jax.nn.silu(gate) * up, w_down, group_sizes)

    def swiglu(xp, block_group):
        gate, up = _block_matmul(xp, w_gate, block_group), _block_matmul(xp, w_up, block_group)
        return _block_matmul(jax.nn.silu(gate) * up, w_down, block_group)

    return _blocked(swiglu, x, group_sizes, w_gate.shape[0], block)
