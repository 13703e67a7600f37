"""Top-k router: selection on biased logits, combine weights from the unbiased scores (sigmoid by
default; softmax over every expert, as Mixtral and Qwen3-MoE route, when asked)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.choices import GATINGS


def route_topk(logits: jax.Array, bias: jax.Array, k: int, gating: str = "sigmoid") -> tuple[jax.Array, jax.Array]:
    """Pick ``k`` experts per token.

    logits: [T, E] float32 router logits. bias: [E] balancing bias (never differentiated).
    Returns (expert_ids [T, k] int32, combine_weights [T, k] float32).

    Selection uses ``logits + stop_gradient(bias)`` so the bias steers load without
    touching the loss; the combine weights use the *unbiased* sigmoid scores of the
    chosen experts, renormalised to sum to one per token. ``gating="softmax"`` scores every expert
    with a softmax over all of them instead (then the same top-k and renormalisation: Mixtral's and
    Qwen3-MoE's router with norm_topk_prob, exactly, while the bias is 0).
    """
    if logits.ndim != 2:
        raise ValueError(f"route_topk: logits must be [tokens, experts], got shape {logits.shape}")
    biased = logits + jax.lax.stop_gradient(bias.astype(logits.dtype))
    _, expert_ids = jax.lax.top_k(biased, k)
    if gating not in GATINGS:
        raise ValueError(f"route_topk: gating must be one of {GATINGS}, got {gating!r}")
    scores = jax.nn.softmax(logits, axis=-1) if gating == "softmax" else jax.nn.sigmoid(logits)
    chosen = jnp.take_along_axis(scores, expert_ids, axis=-1)
    weights = chosen / jnp.sum(chosen, axis=-1, keepdims=True)
    return expert_ids.astype(jnp.int32), weights


def z_loss(logits: jax.Array) -> jax.Array:
    """Mean squared log-sum-exp of the logits (keeps them from drifting large)."""
    lse = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)
    return jnp.mean(jnp.square(lse))


def expert_load(expert_ids: jax.Array, n_experts: int) -> jax.Array:
    """Number of assignments each expert received: [E] int32."""
    return jnp.bincount(expert_ids.reshape(-1), length=n_experts).astype(jnp.int32)
