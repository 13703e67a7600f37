"""The declarative phase plan: what a run starts with and how it may adapt.

Tootsie's phases (Kestrel, Ocelot, Jellyfish, Phoenix, Starling) were not planned in
advance; they were reactions. So a ``PhasePlan`` holds the first phase plus the *policies*
the controller applies when a signal fires: which sources are high quality, how much of a
cooldown mix they get, the mix for a re-warm, the z-loss for a late cooldown, and the
hardware ladder for migrations. ``decide`` (decide.py) turns signals into the next
``PhaseSpec``; ``phase_train_config`` turns a spec into a runnable ``TrainConfig``.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from marin_assets.datakit.mixture import Mixture
from marin_assets.numeric_checks import check_field_types

SCHEDULE_KINDS = ("constant", "cosine", "wsd", "wsd_s", "linear_decay")


def _check_mix(mixture: Mapping[str, float], where: str) -> Mixture:
    """The phase's mix as the one validated Mixture type (finite weights >= 0, positive sum)."""
    try:
        return Mixture.constant(mixture)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from e


def normalise(mixture: Mapping[str, float]) -> dict[str, float]:
    """Weights summing to 1, zero-weight sources dropped, sorted by source."""
    return {k: v for k, v in Mixture.constant(mixture).weights_at(0).items() if v > 0}


@dataclasses.dataclass(frozen=True)
class PhaseSpec:
    name: str
    warm_start_from: str | None  # name of the phase whose final checkpoint this starts from
    schedule: str  # a schedules.KINDS kind
    mixture: Mapping[str, float]
    batch_size: int
    hardware: str
    token_budget: int
    peak_lr: float
    is_cooldown: bool = False
    z_loss: float | None = None  # lm z-loss override (Starling), None = model default
    warmup_start_fraction: float = 0.0
    start_fraction: float = 1.0  # linear_decay: start LR as a fraction of peak

    def __post_init__(self) -> None:
        check_field_types(self)
        if not self.name:
            raise ValueError("PhaseSpec.name must be non-empty")
        if self.schedule not in SCHEDULE_KINDS:
            raise ValueError(f"PhaseSpec {self.name}: schedule must be one of {SCHEDULE_KINDS}, got {self.schedule!r}")
        _check_mix(self.mixture, f"PhaseSpec {self.name}")
        if self.batch_size <= 0 or self.token_budget <= 0 or self.peak_lr <= 0:
            raise ValueError(f"PhaseSpec {self.name}: batch_size, token_budget and peak_lr must be > 0")

    @property
    def data_mixture(self) -> Mixture:
        return Mixture.constant(self.mixture)


@dataclasses.dataclass(frozen=True)
class PhasePlan:
    run: str
    first: PhaseSpec
    phase_names: tuple[str, ...] = ("kestrel", "ocelot", "jellyfish", "phoenix", "starling", "heron", "ibis")
    high_quality_sources: tuple[str, ...] = ()
    cooldown_hq_fraction: float = 0.3  # share of the cooldown mix given to high-quality data
    cooldown_tokens: int = 1  # length of a cooldown (capped by what the budget leaves)
    min_cooldown_tokens: int = 1  # less budget than this left: stop instead of starting a phase
    low_data_tokens: int = 0  # total tokens left in the mix below this: cool down (Jellyfish)
    rewarm_mixture: Mapping[str, float] | None = None  # Phoenix's new mix (None: keep)
    rewarm_tokens: int = 1
    rewarm_start_fraction: float = 0.05
    late_cooldown_z_loss: float = 1e-4  # z-loss for a second or later cooldown (Starling)
    hardware_ladder: Mapping[str, float] = dataclasses.field(default_factory=dict)  # tag -> relative size
    spike_sigma: float = 6.0
    spike_window: int = 32

    def __post_init__(self) -> None:
        check_field_types(self)
        if not 0.0 < self.cooldown_hq_fraction <= 1.0:
            raise ValueError(f"PhasePlan.cooldown_hq_fraction must be in (0, 1], got {self.cooldown_hq_fraction}")
        if self.cooldown_tokens <= 0 or self.rewarm_tokens <= 0 or self.min_cooldown_tokens <= 0:
            raise ValueError("PhasePlan: cooldown_tokens, rewarm_tokens and min_cooldown_tokens must be > 0")
        if self.rewarm_mixture is not None:
            _check_mix(self.rewarm_mixture, "PhasePlan.rewarm_mixture")
        if self.hardware_ladder and self.first.hardware not in self.hardware_ladder:
            raise ValueError(f"PhasePlan: first phase hardware {self.first.hardware!r} is not in the ladder "
                             f"{sorted(self.hardware_ladder)}")
        if len(set(self.phase_names)) != len(self.phase_names):
            raise ValueError("PhasePlan.phase_names must be unique")

    def name_after(self, used: tuple[str, ...]) -> str:
        for name in self.phase_names:
            if name not in used:
                return name
        return f"phase{len(used)}"


def phase_telemetry_run(run: str, phase: str) -> str:
    """The telemetry store's run name for one phase of ``run``: the trainer logs under it
    (``train(..., telemetry_run=...)``) and the phase controller reads it live."""
    from marin_assets.store.names import validate_segment

    return validate_segment(f"{run}-{phase}", "telemetry run")


def phase_train_config(base, spec: PhaseSpec):
    """A TrainConfig for ``spec`` from a base TrainConfig (model, optimizer, guards, seq_len)."""
    from marin_assets.train.config import replace

    steps = max(1, spec.token_budget // (spec.batch_size * base.seq_len))
    warmup = 0 if spec.schedule == "linear_decay" else min(base.schedule.warmup_steps, steps // 4)
    schedule = {"kind": spec.schedule, "peak_lr": spec.peak_lr, "total_steps": steps, "warmup_steps": warmup,
                "warmup_start_fraction": spec.warmup_start_fraction, "start_fraction": spec.start_fraction,
                "decay_steps": min(base.schedule.decay_steps, max(steps - warmup, 0))}
    if spec.schedule == "wsd_s":
        cycle = max(base.schedule.cycle_steps, 1)
        schedule |= {"cycle_steps": cycle, "decay_steps": min(base.schedule.decay_steps, cycle),
                     "rewarm_steps": min(base.schedule.rewarm_steps, cycle - min(base.schedule.decay_steps, cycle))}
    changes = {"num_steps": steps, "batch_size": spec.batch_size, "mixture": spec.data_mixture,
               "schedule": schedule, "phase": spec.name}
    if spec.z_loss is not None:
        changes["model"] = {"lm_z_loss": spec.z_loss}
    return replace(base, **changes)
