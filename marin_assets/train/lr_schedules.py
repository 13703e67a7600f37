"""Learning-rate schedules as pure functions of the step.

Every schedule is ``lr(step) -> float`` built from jnp ops, so the same function works
inside the jitted train step (step is a traced int32) and in tests (plain ints). The step
passed in is the step *within the current phase*: a phase that warm-starts from another
phase's checkpoint restarts its schedule at 0 while the global step keeps counting.

Kinds (Marin reference, section 5):
- ``constant``     : warmup then flat at peak.
- ``cosine``       : warmup then cosine decay to ``min_lr_fraction * peak`` at total_steps.
- ``wsd``          : warmup, stable at peak, linear decay over the last ``decay_steps``
                     down to ``min_lr_fraction * peak`` (5% by default).
- ``wsd_s``        : cyclic WSD: after warmup, every ``cycle_steps`` the last
                     ``decay_steps`` of the cycle decay linearly; the next cycle re-warms
                     to peak over ``rewarm_steps`` (0 = jump straight back).
- ``linear_decay`` : a cooldown phase: linear from ``start_fraction * peak`` down to
                     ``min_lr_fraction * peak`` over total_steps (no warmup needed).

``warmup_start_fraction`` lets a re-warm phase start from the cooled-down LR
(e.g. 0.05) instead of 0, which is what Phoenix did after Jellyfish's cooldown.
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp

from marin_assets.train.config import ScheduleConfig


def _warmup(step, cfg: ScheduleConfig):
    """Linear from warmup_start_fraction*peak at step 0 to peak at step warmup_steps."""
    if cfg.warmup_steps == 0:
        return jnp.asarray(cfg.peak_lr, jnp.float32)
    frac = jnp.clip(step / cfg.warmup_steps, 0.0, 1.0)
    start = cfg.warmup_start_fraction
    return cfg.peak_lr * (start + (1.0 - start) * frac)


def _linear(step, start_step, length, lr_from, lr_to):
    frac = jnp.clip((step - start_step) / max(length, 1), 0.0, 1.0)
    return lr_from + (lr_to - lr_from) * frac


def learning_rate(step, cfg: ScheduleConfig):
    """LR at ``step`` (phase-relative); works on ints and traced jnp scalars."""
    step = jnp.asarray(step, jnp.float32)
    peak = cfg.peak_lr
    floor = cfg.min_lr_fraction * peak
    warm = _warmup(step, cfg)
    in_warmup = step < cfg.warmup_steps
    if cfg.kind == "constant":
        lr = jnp.where(in_warmup, warm, peak)
    elif cfg.kind == "cosine":
        span = max(cfg.total_steps - cfg.warmup_steps, 1)
        t = jnp.clip((step - cfg.warmup_steps) / span, 0.0, 1.0)
        lr = jnp.where(in_warmup, warm, floor + (peak - floor) * 0.5 * (1.0 + jnp.cos(jnp.pi * t)))
    elif cfg.kind == "wsd":
        decay_start = cfg.total_steps - cfg.decay_steps
        decay = _linear(step, decay_start, cfg.decay_steps, peak, floor)
        lr = jnp.where(in_warmup, warm, jnp.where(step < decay_start, peak, decay))
    elif cfg.kind == "wsd_s":
        t = jnp.maximum(step - cfg.warmup_steps, 0.0)
        cycle = jnp.floor(t / cfg.cycle_steps)
        pos = t - cycle * cfg.cycle_steps
        decay_start = cfg.cycle_steps - cfg.decay_steps
        decay = _linear(pos, decay_start, cfg.decay_steps, peak, floor)
        # Re-warm from the floor at the start of every cycle after the first.
        rewarm = _linear(pos, 0.0, cfg.rewarm_steps, floor, peak) if cfg.rewarm_steps else peak
        stable = jnp.where((cycle > 0) & (pos < cfg.rewarm_steps), rewarm, peak)
        lr = jnp.where(in_warmup, warm, jnp.where(pos < decay_start, stable, decay))
    else:  # linear_decay
        lr = _linear(step, 0.0, max(cfg.total_steps - 1, 1), cfg.start_fraction * peak, floor)
    return jnp.asarray(lr, jnp.float32)


def make_schedule(cfg: ScheduleConfig) -> Callable:
    return lambda step: learning_rate(step, cfg)
