"""Stability guards that run inside the jitted train step.

- Gradient clipping to a global norm.
- Update-norm clipping to mean + sigma*std of the accepted update norms over a rolling
  window (128 steps by default).
- Skip-step: when the loss or the gradient norm is not finite, exceeds mean + sigma*std
  of its own rolling window, or the batch was flagged corrupt by the data loader, the step
  applies a zero update and the optimizer state is kept as it was.

Everything is ``jnp.where`` over arrays, so a skipped step costs nothing extra and there
is no host round-trip. Skipped steps do not enter the rolling windows, so one spike does
not raise the threshold for the next. Every event is counted in ``GuardState.counts``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from marin_assets.train.config import GuardConfig

COUNTERS = ("skipped_nonfinite", "skipped_spike", "skipped_bad_batch", "update_clipped", "grad_clipped")


def init_guard_state(cfg: GuardConfig) -> dict:
    zeros = jnp.zeros((cfg.window,), jnp.float32)
    return {
        "loss": zeros,
        "grad_norm": zeros,
        "update_norm": zeros,
        "n_accepted": jnp.int32(0),
        "consecutive_spikes": jnp.int32(0),
        "counts": {name: jnp.int32(0) for name in COUNTERS},
    }


def window_threshold(history: jax.Array, n_accepted: jax.Array, sigma: float) -> jax.Array:
    """mean + sigma*std over the filled part of a ring buffer."""
    size = history.shape[0]
    filled = jnp.minimum(n_accepted, size)
    valid = jnp.arange(size) < filled
    count = jnp.maximum(filled, 1).astype(jnp.float32)
    mean = jnp.sum(jnp.where(valid, history, 0.0)) / count
    var = jnp.sum(jnp.where(valid, jnp.square(history - mean), 0.0)) / count
    return mean + sigma * jnp.sqrt(var)


def global_norm(tree) -> jax.Array:
    leaves = jax.tree.leaves(tree)
    return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves))


def should_skip(cfg: GuardConfig, state: dict, loss, grad_norm, batch_ok) -> dict:
    """Decide, from values already computed, whether this step is skipped and why."""
    nonfinite = ~jnp.isfinite(loss) | ~jnp.isfinite(grad_norm)
    enough = state["n_accepted"] >= cfg.min_history
    if cfg.skip_sigma > 0:
        spike = enough & (
            (loss > window_threshold(state["loss"], state["n_accepted"], cfg.skip_sigma))
            | (grad_norm > window_threshold(state["grad_norm"], state["n_accepted"], cfg.skip_sigma))
        )
        if cfg.max_consecutive_spikes > 0:
            spike = spike & (state["consecutive_spikes"] < cfg.max_consecutive_spikes)
    else:
        spike = jnp.bool_(False)
    bad_batch = ~jnp.asarray(batch_ok, jnp.bool_)
    return {
        "nonfinite": nonfinite & ~bad_batch,
        "spike": spike & ~nonfinite & ~bad_batch,
        "bad_batch": bad_batch,
        "skip": nonfinite | spike | bad_batch,
    }


def clip_grads(cfg: GuardConfig, grads, grad_norm, zero: jax.Array):
    """Scale to the clip norm; zero the gradients of a skipped step so no NaN reaches the
    optimizer maths (its result is thrown away anyway)."""
    scale = jnp.float32(1.0)
    if cfg.grad_clip > 0:
        scale = jnp.minimum(1.0, cfg.grad_clip / jnp.maximum(grad_norm, 1e-12))
    scale = jnp.where(zero | ~jnp.isfinite(scale), 0.0, scale)
    return jax.tree.map(lambda g: jnp.where(zero, jnp.zeros_like(g), g * scale.astype(g.dtype)), grads), (cfg.grad_clip > 0) & (
        grad_norm > cfg.grad_clip
    ) & ~zero


def clip_updates(cfg: GuardConfig, state: dict, updates):
    """Scale the update down to mean + sigma*std of recent accepted update norms."""
    norm = global_norm(updates)
    if cfg.update_clip_sigma <= 0:
        return updates, norm, jnp.bool_(False)
    limit = window_threshold(state["update_norm"], state["n_accepted"], cfg.update_clip_sigma)
    clipped = (state["n_accepted"] >= cfg.min_history) & (norm > limit)
    scale = jnp.where(clipped, limit / jnp.maximum(norm, 1e-12), 1.0)
    return jax.tree.map(lambda u: u * scale.astype(u.dtype), updates), norm * scale, clipped


def record(cfg: GuardConfig, state: dict, decision: dict, loss, grad_norm, update_norm, grad_clipped, update_clipped) -> dict:
    """Push an accepted step into the windows and bump the event counters."""
    accept = ~decision["skip"]
    slot = state["n_accepted"] % cfg.window

    def push(buf, value):
        return jnp.where(accept, buf.at[slot].set(jnp.asarray(value, jnp.float32)), buf)

    counts = dict(state["counts"])
    for name, flag in (
        ("skipped_nonfinite", decision["nonfinite"]),
        ("skipped_spike", decision["spike"]),
        ("skipped_bad_batch", decision["bad_batch"]),
        ("update_clipped", update_clipped & accept),
        ("grad_clipped", grad_clipped & accept),
    ):
        counts[name] = counts[name] + flag.astype(jnp.int32)
    return {
        "loss": push(state["loss"], loss),
        "grad_norm": push(state["grad_norm"], grad_norm),
        "update_norm": push(state["update_norm"], update_norm),
        "n_accepted": state["n_accepted"] + accept.astype(jnp.int32),
        "consecutive_spikes": jnp.where(decision["spike"], state["consecutive_spikes"] + 1, 0).astype(jnp.int32),
        "counts": counts,
    }
