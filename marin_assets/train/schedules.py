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

import dataclasses
from collections.abc import Callable

import jax.numpy as jnp

from marin_assets.numeric_checks import check_field_types, check_int

MAX_STEPS = 2**31 - 1  # the train state's step is int32

KINDS = ("constant", "cosine", "wsd", "wsd_s", "linear_decay")


@dataclasses.dataclass(frozen=True)
class ScheduleConfig:
    kind: str = "wsd"
    peak_lr: float = 3e-3
    warmup_steps: int = 10
    warmup_start_fraction: float = 0.0
    total_steps: int = 100
    decay_steps: int = 20  # wsd: length of the final decay; wsd_s: decay per cycle
    cycle_steps: int = 0  # wsd_s only
    rewarm_steps: int = 0  # wsd_s only
    min_lr_fraction: float = 0.05
    start_fraction: float = 1.0  # linear_decay only: LR at the first step, as a fraction of peak

    def __post_init__(self) -> None:
        check_field_types(self)
        if self.kind not in KINDS:
            raise ValueError(f"ScheduleConfig.kind must be one of {KINDS}, got {self.kind!r}")
        if not self.peak_lr > 0:
            raise ValueError(f"ScheduleConfig.peak_lr must be > 0, got {self.peak_lr}")
        for name in ("warmup_steps", "decay_steps", "cycle_steps", "rewarm_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"ScheduleConfig.{name} must be >= 0, got {getattr(self, name)}")
            check_int(f"ScheduleConfig.{name}", getattr(self, name), 0, MAX_STEPS)
        if self.total_steps <= 0:
            raise ValueError(f"ScheduleConfig.total_steps must be > 0, got {self.total_steps}")
        check_int("ScheduleConfig.total_steps", self.total_steps, 1, MAX_STEPS)
        for name in ("warmup_start_fraction", "min_lr_fraction", "start_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"ScheduleConfig.{name} must be in [0, 1], got {getattr(self, name)}")
        if (
            self.kind in ("wsd", "cosine")
            and self.warmup_steps + (self.decay_steps if self.kind == "wsd" else 0) > self.total_steps
        ):
            raise ValueError(
                f"ScheduleConfig: warmup_steps ({self.warmup_steps}) + decay_steps ({self.decay_steps}) "
                f"exceed total_steps ({self.total_steps})"
            )
        if self.kind == "wsd_s":
            if self.cycle_steps <= 0:
                raise ValueError("ScheduleConfig: wsd_s needs cycle_steps > 0")
            if self.decay_steps + self.rewarm_steps > self.cycle_steps:
                raise ValueError(
                    f"ScheduleConfig: wsd_s decay_steps ({self.decay_steps}) + rewarm_steps "
                    f"({self.rewarm_steps}) must fit in cycle_steps ({self.cycle_steps})"
                )


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
