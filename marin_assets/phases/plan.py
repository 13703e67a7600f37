"""The declarative phase plan: what a run starts with and how it may adapt.

Tootsie's phases (Kestrel, Ocelot, Jellyfish, Phoenix, Starling) were not planned in
advance; they were reactions. So a ``PhasePlan`` holds the first phase plus the *policies*
the controller applies when a signal fires: which sources are high quality, how much of a
cooldown mix they get, the mix for a re-warm, the z-loss for a late cooldown, and the
hardware ladder for migrations. ``decide`` (decide.py) turns signals into the next
``PhaseSpec``; ``phase_train_config`` turns a spec into a runnable ``TrainConfig``.

A phase may change the model (``model_changes``: ModelConfig overrides that hold from that phase
on); one that does so on a checkpoint of another architecture names the ``transplant`` mapping
(marin_assets/train/checkpoints/transplant.py) that carries the warm start's weights over. The plan's
``architecture_switch`` says which switch ``decide`` may make when roll-backs do not cure a
divergence (the 32B run's last resort: a warm start into a block with QK-norm).

A plan's ``branches`` (``BranchSpec``) leave the main run from one of its checkpoints (an early cooldown)
and lead nowhere: the controller runs each once the main run accepts its source phase, and its phases,
versions and artifacts are the same with and without them (marin_assets/phases/branches.py).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

from marin_assets.datakit.mixture import Mixture
from marin_assets.model.config import ModelConfig
from marin_assets.numeric_checks import check_field_types
from marin_assets.store.names import validate_segment
from marin_assets.train.config import SCHEDULE_KINDS, replace


def _check_mix(mixture: Mapping[str, float], where: str) -> Mixture:
    """The phase's mix as the one validated Mixture type (finite weights >= 0, positive sum)."""
    try:
        return Mixture.constant(mixture)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from e


def _check_model_changes(changes: Mapping[str, Any] | None, where: str) -> None:
    """Overrides of ModelConfig fields by name, with JSON scalar values (they travel in run configs and cursors);
    the values themselves are checked by ModelConfig when the phase's TrainConfig is built."""
    if changes is None:
        return

    if not isinstance(changes, Mapping) or not changes:
        raise ValueError(f"{where}: model_changes must be a non-empty mapping of ModelConfig fields, got {changes!r}")
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    for field, value in changes.items():
        if field not in known:
            raise ValueError(f"{where}: model_changes names {field!r}, which is not a ModelConfig field")
        if not isinstance(value, (bool, int, float, str)) or (isinstance(value, float) and not math.isfinite(value)):
            raise ValueError(f"{where}: model_changes[{field!r}] must be a finite number, a bool or a string, got {value!r}")


def _check_context(seq_len: int | None, sequence_parallel: int | None, where: str) -> None:
    """A phase's or branch's own context length and sequence axis, where it sets them."""
    if seq_len is not None and seq_len < 2:
        raise ValueError(f"{where}: seq_len must be >= 2 (one input and one target token), got {seq_len}")
    if sequence_parallel is not None and sequence_parallel < 1:
        raise ValueError(f"{where}: sequence_parallel must be >= 1, got {sequence_parallel}")


def _check_name(name: str, what: str) -> None:
    """A run or phase name becomes a path segment and a partition key: one safe segment, or a
    ValueError naming ``what`` and the name (``a/b`` or ``../x`` would leave the run's folder)."""

    validate_segment(name, what)


def _check_mapping_name(name: str, where: str) -> None:
    # deferred (import cost): jax, and only a plan that names a mapping needs it
    from marin_assets.train.checkpoints.transplant import MAPPINGS

    if name not in MAPPINGS:
        raise ValueError(f"{where}: transplant mapping {name!r} is not one of {sorted(MAPPINGS)}")


def normalise(mixture: Mapping[str, float]) -> dict[str, float]:
    """Weights summing to 1, zero-weight sources dropped, sorted by source."""
    return {k: v for k, v in Mixture.constant(mixture).weights_at(0).items() if v > 0}


@dataclasses.dataclass(frozen=True)
class PhaseSpec:
    name: str
    warm_start_from: str | None  # name of the phase whose final checkpoint this starts from
    schedule: str  # one of SCHEDULE_KINDS (train/config.py)
    mixture: Mapping[str, float]
    batch_size: int
    hardware: str
    token_budget: int
    peak_lr: float
    is_cooldown: bool = False
    z_loss: float | None = None  # lm z-loss override (Starling), None = model default
    warmup_start_fraction: float = 0.0
    start_fraction: float = 1.0  # linear_decay: start LR as a fraction of peak
    model_changes: Mapping[str, Any] | None = None  # ModelConfig overrides, e.g. {"qk_norm": True}
    transplant: str | None = None  # a train.checkpoints.transplant mapping: the warm start is of another architecture
    seq_len: int | None = None  # a context phase's sequence length (None: the base's); tokens per batch kept
    # A context phase's sequence axis (TrainConfig.sequence_parallel; None: the base's): each row split over
    # that many devices. A layout, so not part of the phase's version (spec_record).
    sequence_parallel: int | None = None

    def __post_init__(self) -> None:
        check_field_types(self)
        _check_name(self.name, "PhaseSpec.name")
        if self.warm_start_from is not None:
            _check_name(self.warm_start_from, f"PhaseSpec {self.name}: warm_start_from")
        _check_context(self.seq_len, self.sequence_parallel, f"PhaseSpec {self.name}")
        _check_model_changes(self.model_changes, f"PhaseSpec {self.name}")
        if self.transplant is not None and self.warm_start_from is None:
            raise ValueError(f"PhaseSpec {self.name}: transplant {self.transplant!r} needs a warm_start_from to carry over")
        if self.schedule not in SCHEDULE_KINDS:
            raise ValueError(f"PhaseSpec {self.name}: schedule must be one of {SCHEDULE_KINDS}, got {self.schedule!r}")
        _check_mix(self.mixture, f"PhaseSpec {self.name}")
        if self.batch_size <= 0 or self.token_budget <= 0 or self.peak_lr <= 0:
            raise ValueError(f"PhaseSpec {self.name}: batch_size, token_budget and peak_lr must be > 0")

    @property
    def data_mixture(self) -> Mixture:
        return Mixture.constant(self.mixture)


ARCHITECTURE_FIELDS = ("model_changes", "transplant")
RECORDED_WHEN_SET = (*ARCHITECTURE_FIELDS, "seq_len")  # fields added after phases were versioned
LAYOUT_FIELDS = ("sequence_parallel",)  # how the devices split the work, not what is computed: never recorded


def spec_record(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A PhaseSpec's fields (``dataclasses.asdict`` or a config dump) as its version sees them: the
    architecture fields and seq_len only when set, so a phase that changes neither keeps the record (and
    the content version) it had before the fields existed; the layout fields never."""
    return {k: v for k, v in spec.items() if k not in LAYOUT_FIELDS and not (k in RECORDED_WHEN_SET and v is None)}


@dataclasses.dataclass(frozen=True)
class ArchitectureSwitch:
    """The switch ``decide`` makes when a loss spike survives ``after_rollbacks`` roll-backs of a phase:
    the phase restarts from the same last good checkpoint, carried by ``mapping`` into the model with
    ``model_changes``, warming up from ``warmup_start_fraction`` of peak (the optimizer state is new)."""

    mapping: str
    model_changes: Mapping[str, Any]
    after_rollbacks: int = 2
    warmup_start_fraction: float = 0.0

    def __post_init__(self) -> None:
        check_field_types(self)
        _check_model_changes(self.model_changes, "PhasePlan.architecture_switch")
        if self.after_rollbacks < 0:
            raise ValueError(f"PhasePlan.architecture_switch.after_rollbacks must be >= 0, got {self.after_rollbacks}")
        if not 0.0 <= self.warmup_start_fraction <= 1.0:
            raise ValueError(
                f"PhasePlan.architecture_switch.warmup_start_fraction must be in [0, 1], got {self.warmup_start_fraction}"
            )
        _check_mapping_name(self.mapping, "PhasePlan.architecture_switch")


BRANCH_MARK = "+"  # a branch's partition is "<from phase>+<branch name>"; no main phase name has it


# The ModelConfig fields no parameter's shape depends on (tests/phases/test_context_branch.py checks): a branch may change
# them on the source's checkpoint. RoPE, the causal mask and windows are computed from the positions.
CONTEXT_MODEL_FIELDS = ("max_seq_len", "attention_impl", "sliding_window", "global_attention_every", "rope_per_document")


@dataclasses.dataclass(frozen=True)
class BranchSpec:
    """A phase that leaves the main run from ``from_phase``'s final checkpoint and leads nowhere: no main phase
    warm-starts from it (Marin's early cooldown off the 535B run, for an RL checkpoint, left the main run as it was).

    Its partition is ``"<from_phase>+<name>"`` (``partition``). Unset fields take the source phase's values
    (mix, peak LR, z-loss, context length, sequence axis); batch size and hardware are always the source's, and
    so is the model but for ``model_changes`` that leave its parameters as they are (``CONTEXT_MODEL_FIELDS``: a
    long-context branch raises ``max_seq_len`` and picks an attention kernel and pattern)."""

    name: str
    from_phase: str
    token_budget: int
    schedule: str = "linear_decay"
    is_cooldown: bool = True
    mixture: Mapping[str, float] | None = None  # None: the source phase's mix
    peak_lr: float | None = None  # None: the source phase's
    start_fraction: float = 1.0  # linear_decay: start LR as a fraction of peak
    z_loss: float | None = None  # None: the source phase's
    seq_len: int | None = None  # a context branch's sequence length (None: the source's); tokens per batch kept
    model_changes: Mapping[str, Any] | None = None  # on top of the source's; only CONTEXT_MODEL_FIELDS
    sequence_parallel: int | None = None  # None: the source's

    def __post_init__(self) -> None:
        check_field_types(self)
        where = f"BranchSpec {self.name!r}"
        _check_model_changes(self.model_changes, where)
        shaping = sorted(set(self.model_changes or {}) - set(CONTEXT_MODEL_FIELDS))
        if shaping:
            raise ValueError(
                f"{where}: model_changes may name only {CONTEXT_MODEL_FIELDS} (a branch warm-starts from its source's "
                f"parameters as they are), not {shaping}"
            )
        _check_context(self.seq_len, self.sequence_parallel, where)
        validate_segment(self.name, "branch name")
        if BRANCH_MARK in self.name or BRANCH_MARK in self.from_phase:
            raise ValueError(f"{where}: name and from_phase must not contain {BRANCH_MARK!r} (it joins them in the partition)")
        validate_segment(self.partition, "branch partition key")
        if self.schedule not in SCHEDULE_KINDS:
            raise ValueError(f"{where}: schedule must be one of {SCHEDULE_KINDS}, got {self.schedule!r}")
        if self.token_budget <= 0:
            raise ValueError(f"{where}: token_budget must be > 0, got {self.token_budget}")
        if self.peak_lr is not None and self.peak_lr <= 0:
            raise ValueError(f"{where}: peak_lr must be > 0, got {self.peak_lr}")
        if not 0.0 < self.start_fraction <= 1.0:
            raise ValueError(f"{where}: start_fraction must be in (0, 1], got {self.start_fraction}")
        if self.z_loss is not None and self.z_loss < 0:
            raise ValueError(f"{where}: z_loss must be >= 0, got {self.z_loss}")
        if self.mixture is not None:
            _check_mix(self.mixture, where)

    @property
    def partition(self) -> str:
        return f"{self.from_phase}{BRANCH_MARK}{self.name}"


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
    max_drop_rate: float | None = None  # MoE: mean "moe/drop_rate" of the last spike_window steps above this holds
    architecture_switch: ArchitectureSwitch | None = None
    branches: tuple[BranchSpec, ...] = ()  # phases off the main run, each from one of its checkpoints

    def __post_init__(self) -> None:
        check_field_types(self)
        _check_name(self.run, "PhasePlan.run")
        if not isinstance(self.first, PhaseSpec):
            raise ValueError(f"PhasePlan.first must be a PhaseSpec, got {self.first!r}")
        for name in self.phase_names:
            _check_name(name, "PhasePlan.phase_names entry")
        if self.max_drop_rate is not None and not (math.isfinite(self.max_drop_rate) and 0.0 <= self.max_drop_rate <= 1.0):
            raise ValueError(f"PhasePlan.max_drop_rate must be a finite fraction in [0, 1], got {self.max_drop_rate}")
        if not isinstance(self.architecture_switch, (ArchitectureSwitch, type(None))):
            raise ValueError(f"PhasePlan.architecture_switch must be an ArchitectureSwitch, got {self.architecture_switch!r}")
        if not 0.0 < self.cooldown_hq_fraction <= 1.0:
            raise ValueError(f"PhasePlan.cooldown_hq_fraction must be in (0, 1], got {self.cooldown_hq_fraction}")
        if self.cooldown_tokens <= 0 or self.rewarm_tokens <= 0 or self.min_cooldown_tokens <= 0:
            raise ValueError("PhasePlan: cooldown_tokens, rewarm_tokens and min_cooldown_tokens must be > 0")
        if self.rewarm_mixture is not None:
            _check_mix(self.rewarm_mixture, "PhasePlan.rewarm_mixture")
        if self.hardware_ladder and self.first.hardware not in self.hardware_ladder:
            raise ValueError(
                f"PhasePlan: first phase hardware {self.first.hardware!r} is not in the ladder {sorted(self.hardware_ladder)}"
            )
        if len(set(self.phase_names)) != len(self.phase_names):
            raise ValueError("PhasePlan.phase_names must be unique")
        if any(BRANCH_MARK in name for name in (self.first.name, *self.phase_names)):
            raise ValueError(f"PhasePlan: main phase names must not contain {BRANCH_MARK!r}, which marks a branch's partition")
        self._check_branches()

    def _check_branches(self) -> None:
        """Each branch leaves from a phase the main run can have, under a partition of its own."""
        if not isinstance(self.branches, tuple) or not all(isinstance(b, BranchSpec) for b in self.branches):
            raise ValueError(f"PhasePlan.branches must be a tuple of BranchSpec, got {self.branches!r}")
        partitions = [b.partition for b in self.branches]
        if len(set(partitions)) != len(partitions):
            raise ValueError(f"PhasePlan.branches: two branches share a partition: {sorted(partitions)}")
        for branch in self.branches:
            if not self.is_main_phase_name(branch.from_phase):
                raise ValueError(
                    f"PhasePlan.branches: {branch.name!r} leaves from {branch.from_phase!r}, which is not a "
                    f"phase of the main run ({self.first.name!r}, phase_names or phase<n>)"
                )

    def is_main_phase_name(self, name: str) -> bool:
        """Whether the main run can name a phase ``name``: its first phase, a name of ``phase_names``, or
        ``name_after``'s fallback ``phase<n>``."""
        return name in (self.first.name, *self.phase_names) or re.fullmatch(r"phase[0-9]+", name) is not None

    def name_after(self, used: tuple[str, ...]) -> str:
        for name in self.phase_names:
            if name not in used:
                return name
        return f"phase{len(used)}"


def phase_telemetry_run(run: str, phase: str) -> str:
    """The telemetry store's run name for one phase of ``run``: the trainer logs under it
    (``train(..., telemetry_run=...)``) and the phase controller reads it live."""

    return validate_segment(f"{run}-{phase}", "telemetry run")


def _context_batch(base, spec: PhaseSpec) -> tuple[int, int]:
    """(seq_len, batch_size) of the phase: a context phase keeps the tokens per batch of
    ``spec.batch_size`` sequences of the base's seq_len, so its schedule and token budget mean what they did."""
    if spec.seq_len is None or spec.seq_len == base.seq_len:
        return base.seq_len, spec.batch_size
    tokens = spec.batch_size * base.seq_len
    max_seq_len = (spec.model_changes or {}).get("max_seq_len", base.model.max_seq_len)
    if spec.seq_len > max_seq_len:
        raise ValueError(f"PhaseSpec {spec.name}: seq_len {spec.seq_len} exceeds the model's max_seq_len {max_seq_len}")
    if tokens % spec.seq_len:
        raise ValueError(
            f"PhaseSpec {spec.name}: seq_len {spec.seq_len} does not divide the {tokens} tokens per batch "
            f"(batch_size {spec.batch_size} x base seq_len {base.seq_len})"
        )
    return spec.seq_len, tokens // spec.seq_len


def phase_train_config(base, spec: PhaseSpec):
    """A TrainConfig for ``spec`` from a base TrainConfig (model, optimizer, guards, seq_len); a context phase
    (``spec.seq_len``) trains on sequences of that length, with the tokens per batch of the base's."""

    seq_len, batch_size = _context_batch(base, spec)
    steps = max(1, spec.token_budget // (batch_size * seq_len))
    warmup = 0 if spec.schedule == "linear_decay" else min(base.schedule.warmup_steps, steps // 4)
    schedule = {
        "kind": spec.schedule,
        "peak_lr": spec.peak_lr,
        "total_steps": steps,
        "warmup_steps": warmup,
        "warmup_start_fraction": spec.warmup_start_fraction,
        "start_fraction": spec.start_fraction,
        "decay_steps": min(base.schedule.decay_steps, max(steps - warmup, 0)),
    }
    if spec.schedule == "wsd_s":
        cycle = max(base.schedule.cycle_steps, 1)
        schedule |= {
            "cycle_steps": cycle,
            "decay_steps": min(base.schedule.decay_steps, cycle),
            "rewarm_steps": min(base.schedule.rewarm_steps, cycle - min(base.schedule.decay_steps, cycle)),
        }
    changes = {
        "num_steps": steps,
        "batch_size": batch_size,
        "seq_len": seq_len,
        "mixture": spec.data_mixture,
        "schedule": schedule,
        "phase": spec.name,
    }
    if spec.sequence_parallel is not None:
        changes["sequence_parallel"] = spec.sequence_parallel
    model = {**(spec.model_changes or {}), **({"lm_z_loss": spec.z_loss} if spec.z_loss is not None else {})}
    if model:
        changes["model"] = model
    return replace(base, **changes)
