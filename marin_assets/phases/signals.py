"""Signals the phase controller reads, and the loss-spike detector over recent metrics."""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from marin_assets.scaling.trajectory import BAND_ACTIONS

if TYPE_CHECKING:  # for the annotation only: the signals stay importable without the plan's dependencies
    from marin_assets.phases.plan import PhaseSpec


@dataclasses.dataclass(frozen=True)
class BandSignal:
    """The main run left the ladder's band (marin_assets/scaling/trajectory.py): why, at which step,
    and what the watch's settings say to do about it (``hold``, ``rollback`` or ``warn``)."""

    reason: str
    action: str
    step: int | None = None

    def __post_init__(self) -> None:
        if self.action not in BAND_ACTIONS:
            raise ValueError(f"BandSignal.action must be one of {BAND_ACTIONS}, got {self.action!r}")


@dataclasses.dataclass(frozen=True)
class Signals:
    tokens_left: Mapping[str, int]  # per source, tokens not yet seen (from the train result)
    budget_tokens: int  # the run's compute/time budget in tokens (a user-edited source asset)
    hardware_available: tuple[str, ...] = ()  # hardware tags with free capacity now
    recent_losses: tuple[float, ...] = ()  # the current phase's latest per-step losses, oldest first
    off_band: BandSignal | None = None  # the phase left the ladder's band (None: inside, not watched or released)
    recent_drop_rates: tuple[float, ...] = ()  # the phase's latest DROP_RATE values (none: not an MoE, or released)

    def __post_init__(self) -> None:
        if self.budget_tokens < 0:
            raise ValueError(f"Signals.budget_tokens must be >= 0, got {self.budget_tokens}")
        bad = {k: v for k, v in self.tokens_left.items() if v < 0}
        if bad:
            raise ValueError(f"Signals.tokens_left must be >= 0, got {bad}")


@dataclasses.dataclass(frozen=True)
class RunState:
    phase: PhaseSpec  # the phase now running (or just finished)
    phase_tokens: int  # tokens trained in this phase so far
    tokens_trained: int  # tokens trained in the whole run
    phases_done: tuple[str, ...] = ()  # names of earlier phases, oldest first
    cooldowns_done: int = 0  # cooldown phases before the current one
    last_good_checkpoint: str | None = None
    step: int | None = None  # the global step the phase has reached (live) or ended at
    ended_early: str | None = None  # why the controller ended this phase mid-way (None: it ran its course)
    rollbacks: int = 0  # consecutive roll-backs of this phase (its attempt)
    switches_done: tuple[str, ...] = ()  # transplant mappings of this and earlier phases (architecture switches made)

    @property
    def phase_finished(self) -> bool:
        return self.phase_tokens >= self.phase.token_budget


def loss_spike(losses: Sequence[float], sigma: float = 6.0, window: int = 32, min_history: int = 8) -> str | None:
    """A reason string if the newest loss is non-finite or above mean + sigma*std of the
    ``window`` losses before it; None otherwise."""
    if not losses:
        return None
    last = losses[-1]
    if not math.isfinite(last):
        return f"loss is {last} at the latest step"
    history = [x for x in losses[-window - 1 : -1] if math.isfinite(x)]
    if len(history) < min_history:
        return None
    mean = sum(history) / len(history)
    std = math.sqrt(sum((x - mean) ** 2 for x in history) / len(history))
    limit = mean + sigma * std
    if last > limit and last - mean > 1e-6:
        return f"loss {last:.4g} > mean {mean:.4g} + {sigma:g}*std {std:.3g} = {limit:.4g} over the last {len(history)} steps"
    return None


def drop_rate_alarm(rates: Sequence[float], max_rate: float, window: int = 32) -> str | None:
    """A reason string if the mean of the last ``window`` finite drop rates is above ``max_rate``; None
    otherwise, and when there are none (a dense model, or metrics without the column). The mean, not the
    newest value: one step's drops swing with its batch, a router that stopped balancing stays high."""
    recent = [float(x) for x in list(rates)[-window:] if isinstance(x, numbers.Real) and math.isfinite(x)]
    if not recent:
        return None
    mean = sum(recent) / len(recent)
    if mean > max_rate:
        return f"MoE drop rate {mean:.2%} (mean of the last {len(recent)} steps) > max_drop_rate {max_rate:.2%}"
    return None
