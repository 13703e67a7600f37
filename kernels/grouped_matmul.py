"""Grouped expert matmul over rows sorted by expert (``jax.lax.ragged_dot``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def grouped_matmul(x: jax.Array, w: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """x: [M, K] rows sorted by group; w: [G, K, N]; group_sizes: [G] int32.

    Row block g (the next ``group_sizes[g]`` rows) is multiplied by ``w[g]``. Rows past
    ``sum(group_sizes)`` (dropped or padding rows) come out as zeros.
    """
    out = jax.lax.ragged_dot(x, w, group_sizes.astype(jnp.int32))
    used = jnp.arange(x.shape[0]) < jnp.sum(group_sizes)
    return jnp.where(used[:, None], out, jnp.zeros((), out.dtype))


def expert_swiglu(x: jax.Array, w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array,
                  group_sizes: jax.Array) -> jax.Array:
    """SwiGLU per expert on rows sorted by expert: down(silu(x @ gate) * (x @ up))."""
    gate = grouped_matmul(x, w_gate, group_sizes)
    up = grouped_matmul(x, w_up, group_sizes)
    return grouped_matmul(jax.nn.silu(gate) * up, w_down, group_sizes)
