"""Quantile balancing: the per-expert bias shift that gives every expert its fair share.

A token picks expert e when e's biased logit beats the k-th best biased logit among the
*other* experts. Call the difference the margin m[t, e]; expert e gets
``#{t : m[t, e] > 0}`` tokens. Shifting e's bias by ``-q_e``, where q_e is the value that
exactly ``T*k/E`` margins exceed, gives e its fair share (holding the others fixed).
Both functions return q: [E]; the caller applies ``bias - rate * q`` from the next step,
mean-centred, outside of any gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def selection_margins(logits: jax.Array, bias: jax.Array, k: int) -> jax.Array:
    """m[t, e] = biased logit of e minus the k-th best biased logit of the other experts."""
    z = logits.astype(jnp.float32) + bias.astype(jnp.float32)
    top = jax.lax.top_k(z, k + 1)[0]  # [T, k+1], descending
    kth, next_after = top[:, k - 1 : k], top[:, k : k + 1]
    chosen = z >= kth
    # A chosen expert competes with the first unchosen one; an unchosen one with the k-th.
    return z - jnp.where(chosen, next_after, kth)


def _fair_share(n_tokens: int, k: int, n_experts: int) -> float:
    return n_tokens * k / n_experts


def quantile_shift_exact(logits: jax.Array, bias: jax.Array, k: int) -> jax.Array:
    """Exact quantile from the sorted margins of this device's tokens. logits: [T, E]."""
    T, E = logits.shape
    if k >= E:  # every expert is always chosen: nothing to balance
        return jnp.zeros((E,), jnp.float32)
    m = jax.lax.stop_gradient(selection_margins(logits, bias, k))
    n = _fair_share(T, k, E)
    lo_rank = int(min(max(round(n), 1), T))  # the n-th and (n+1)-th largest margins
    top = jax.lax.top_k(m.T, min(lo_rank + 1, T))[0]  # [E, n+1] descending
    nth = top[:, lo_rank - 1]
    after = top[:, lo_rank] if lo_rank < T else nth - 1.0
    return 0.5 * (nth + after)


def quantile_shift_histogram(
    logits: jax.Array, bias: jax.Array, k: int, bins: int = 10_000, axis_name: str | None = None
) -> jax.Array:
    """Quantile from a histogram of margins, summed across ``axis_name`` devices if given.

    Cheap to reduce globally: each device contributes a [E, bins] count table over a
    shared range (the global min/max margin), then the quantile is read off the summed
    table with linear interpolation inside the bin.
    """
    T, E = logits.shape
    if k >= E:
        return jnp.zeros((E,), jnp.float32)
    m = jax.lax.stop_gradient(selection_margins(logits, bias, k))
    lo, hi, n_tokens = jnp.min(m), jnp.max(m), jnp.float32(T)
    if axis_name is not None:
        lo, hi = jax.lax.pmin(lo, axis_name), jax.lax.pmax(hi, axis_name)
        n_tokens = jax.lax.psum(n_tokens, axis_name)
    width = jnp.maximum(hi - lo, 1e-6) / bins
    idx = jnp.clip(((m - lo) / width).astype(jnp.int32), 0, bins - 1)  # [T, E]
    hist = jnp.zeros((E, bins), jnp.float32).at[jnp.arange(E)[None, :], idx].add(1.0)
    if axis_name is not None:
        hist = jax.lax.psum(hist, axis_name)
    n: jax.Array = n_tokens * k / E  # an Array: jnp.float32(T) and psum are untyped in jax
    # above[e, i]: margins in bins i.. (inclusive) i.e. >= lower edge of bin i.
    above = jnp.cumsum(hist[:, ::-1], axis=1)[:, ::-1]
    above_next = jnp.concatenate([above[:, 1:], jnp.zeros((E, 1))], axis=1)
    # The bin holding the n-th largest margin: the highest i with above[i] >= n.
    i_star = jnp.sum(above >= n, axis=1) - 1
    i_star = jnp.clip(i_star, 0, bins - 1)
    take = lambda a: jnp.take_along_axis(a, i_star[:, None], axis=1)[:, 0]
    in_bin, over = take(hist), take(above_next)
    frac = jnp.where(in_bin > 0, (n - over) / jnp.maximum(in_bin, 1.0), 0.0)
    upper_edge = lo + (i_star + 1).astype(jnp.float32) * width
    return upper_edge - jnp.clip(frac, 0.0, 1.0) * width


def apply_shift(bias: jax.Array, shift: jax.Array, rate: float) -> jax.Array:
    """Next step's bias: move against the overload, then mean-centre (only differences matter)."""
    new = bias - rate * shift
    return jax.lax.stop_gradient(new - jnp.mean(new, axis=-1, keepdims=True))


def load_cv(load: jax.Array) -> jax.Array:
    """Coefficient of variation (std / mean) of per-expert load, along the last axis."""
    load = load.astype(jnp.float32)
    return jnp.std(load, axis=-1) / jnp.maximum(jnp.mean(load, axis=-1), 1e-9)


def sequence_balance_loss(logits: jax.Array, expert_ids: jax.Array, n_sequences: int) -> jax.Array:
    """DeepSeek-V3's complementary sequence-wise balance loss (arXiv:2412.19437, section 2.1.2), before its
    coefficient: the mean over sequences of ``sum_e f_e * P_e``, where for one sequence of S tokens
    ``f_e = E / (k * S) * #{tokens that chose e}`` and ``P_e`` is the mean over its tokens of the normalised
    sigmoid affinity ``s_e / sum_j s_j``. It is 1 when a sequence's affinities are even and grows as one
    sequence piles onto a few experts: the per-sequence skew that quantile balancing of the whole batch
    leaves alone and a device holding few long sequences pays for in drops.

    logits: [T, E] router logits of ``n_sequences`` consecutive sequences; expert_ids: [T, k] the chosen experts.
    """
    T, E = logits.shape
    k = expert_ids.shape[-1]
    if n_sequences < 1 or T % n_sequences:
        raise ValueError(f"sequence_balance_loss: {T} tokens do not split into {n_sequences} sequences")
    S = T // n_sequences
    scores = jax.nn.sigmoid(logits.astype(jnp.float32))
    affinity = (scores / jnp.sum(scores, axis=-1, keepdims=True)).reshape(n_sequences, S, E)
    chosen = jnp.sum(jax.nn.one_hot(expert_ids, E, dtype=jnp.float32), axis=1).reshape(n_sequences, S, E)
    f = jax.lax.stop_gradient(jnp.sum(chosen, axis=1) * E / (k * S))  # [n_sequences, E]: counts carry no gradient
    return jnp.mean(jnp.sum(f * jnp.mean(affinity, axis=1), axis=-1))
