"""Single-device token dispatch / combine with an optional per-expert capacity.

The assignments (token t, slot j) are sorted by expert so a grouped matmul can run over
contiguous blocks. With a capacity, the assignments of an expert past its capacity (in
token order) are dropped: they contribute nothing and are counted.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.grouped_matmul import expert_swiglu


def position_in_group(keys: jax.Array, n_groups: int) -> jax.Array:
    """For each element, how many earlier elements share its key (stable, in input order)."""
    order = jnp.argsort(keys, stable=True)
    counts = jnp.bincount(keys, length=n_groups)
    starts = jnp.cumsum(counts) - counts
    sorted_pos = jnp.arange(keys.shape[0]) - starts[keys[order]]
    return jnp.zeros_like(keys).at[order].set(sorted_pos.astype(keys.dtype))


def moe_local(
    x: jax.Array,
    expert_ids: jax.Array,
    weights: jax.Array,
    w_gate: jax.Array,
    w_up: jax.Array,
    w_down: jax.Array,
    capacity: int | None = None,
    impl: str = "auto",
) -> tuple[jax.Array, jax.Array]:
    """Routed experts on one device.

    x: [T, D]; expert_ids, weights: [T, k]; w_gate, w_up: [E, D, F]; w_down: [E, F, D].
    capacity: max assignments per expert (None = dropless).
    impl: grouped matmul implementation (``kernels.grouped_matmul.IMPLS``).
    Returns (out [T, D], dropped assignments: int32 scalar).
    """
    T, k = expert_ids.shape
    E = w_gate.shape[0]
    flat_e = expert_ids.reshape(-1)
    if capacity is None:
        keep = jnp.ones(flat_e.shape, bool)
    else:
        keep = position_in_group(flat_e, E) < capacity
    # Dropped assignments sort into an overflow group E, after every real expert.
    key = jnp.where(keep, flat_e, E)
    order = jnp.argsort(key, stable=True)
    group_sizes = jnp.bincount(key, length=E + 1)[:E].astype(jnp.int32)
    rows = x[order // k]
    out_sorted = expert_swiglu(rows, w_gate, w_up, w_down, group_sizes, impl)
    out_assign = jnp.zeros_like(out_sorted).at[order].set(out_sorted)
    out = jnp.einsum("tkd,tk->td", out_assign.reshape(T, k, -1), weights.astype(out_assign.dtype))
    dropped = (flat_e.shape[0] - jnp.sum(group_sizes)).astype(jnp.int32)
    return out, dropped
