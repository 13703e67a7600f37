"""Experiment records: ``experiments/<name>.yaml``, validated into one typed dataclass.

A record says what is tested and what is expected *before* anything runs::

    name: screen_tiny_moe                 # = the file's stem; becomes a path segment
    hypothesis: "..."                     # what we expect and why
    links: {issue: 14, wandb_project: marin-screens}
    baseline:
      config: ../examples/tiny_moe.yaml   # a TrainConfig YAML (relative to the record) or a mapping
      override: {model: {d_model: 32}}    # optional, applied on top
    budgets: [2.0e10, 4.0e10, 8.0e10]     # training FLOPs per run (>= 3: the fit has 3 parameters)
    seeds: [0, 1, 2]                      # baseline seeds (>= 2: they give the noise floor)
    arms:
      partial_rope: {change: {model: {rope_fraction: 0.5}}}
      control_seed: {change: {}, seeds: [10, 11, 12], expect: {ci_contains: 1.0}}
    criterion:
      statement: "..."
      checks: [{arm: partial_rope, ci_low_above: 1.0}]
    amendments:                           # optional: dated, reasoned edits made after a run
      - {date: 2026-11-30, reason: "..."}

Each run is one (arm, budget, seed); the baseline is the arm ``baseline``. An arm's
``change`` is a TrainConfig override (nested mappings merge); ``expect`` are checks the
arm itself must pass for the screen to be trusted (controls); ``criterion.checks`` decide
whether the hypothesis held. Checks: ``ci_contains``, ``ci_low_above``, ``ci_high_below``,
``speedup_above``, ``speedup_below`` (all on the effective speedup).

``amendments`` keep the record's history visible: each says when and why the record was
edited after a run (e.g. seeds added to an inconclusive control). They are not frozen
(``frozen()`` leaves them out): writing one down never invalidates a lock, while the edit
it explains is still judged by the lock like any other.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from marin_assets.store.names import validate_segment
from marin_assets.train.config import config_from_dict

if TYPE_CHECKING:  # the config module imports jax; the outline (code-location load) must not
    from marin_assets.train.config import TrainConfig

BASELINE = "baseline"
DEFAULT_DATA_FILES = 80  # standard-library files in the screens' corpus (experiments/data.py)
CHECKS = ("ci_contains", "ci_low_above", "ci_high_below", "speedup_above", "speedup_below")
# Names become partition keys "<arm>-C<budget>-s<seed>" and path segments, so they may not
# contain the "-" separator (validate_segment then refuses anything path-unsafe).
_NAME = re.compile(r"[a-z][a-z0-9_]{0,47}")


def validate_name(name: Any, what: str) -> str:
    """A lower-case identifier ([a-z][a-z0-9_]*, at most 48 chars) that is a safe path segment."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"{what} {name!r} must match [a-z][a-z0-9_]{{0,47}} (lower case, digits, '_')")
    return validate_segment(name, what)


def _finite(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{where} must be finite, got {value!r}")
    return value


def _yaml_number(value: Any) -> Any:
    """YAML 1.1 reads ``1.5e10`` (no sign on the exponent) as a string; accept it as a number."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _seeds(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"{where} must be a non-empty list of ints, got {value!r}")
    for s in value:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ValueError(f"{where}: seed {s!r} is not an int >= 0")
    if len(set(value)) != len(value):
        raise ValueError(f"{where}: seeds repeat: {list(value)}")
    return tuple(value)


def _mapping(value: Any, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must be a mapping, got {type(value).__name__}: {value!r}")
    return dict(value)


def merge(base: Mapping[str, Any], change: Mapping[str, Any]) -> dict:
    """Nested dict merge: mappings merge key by key, anything else replaces."""
    out = copy.deepcopy(dict(base))
    for key, value in change.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@dataclasses.dataclass(frozen=True)
class Check:
    """One expectation on an arm's effective speedup, e.g. ``ci_high_below: 1.0``."""

    arm: str
    kind: str
    value: float

    @classmethod
    def parse(cls, arm: str, spec: Any, where: str) -> list[Check]:
        spec = _mapping(spec, where)
        unknown = sorted(set(spec) - set(CHECKS))
        if unknown:
            raise ValueError(f"{where}: unknown check(s) {unknown}; allowed: {list(CHECKS)}")
        return [cls(arm, kind, _finite(v, f"{where}.{kind}")) for kind, v in spec.items()]

    def holds(self, speedup: float, ci_low: float, ci_high: float) -> bool:
        return {
            "ci_contains": ci_low <= self.value <= ci_high,
            "ci_low_above": ci_low > self.value,
            "ci_high_below": ci_high < self.value,
            "speedup_above": speedup > self.value,
            "speedup_below": speedup < self.value,
        }[self.kind]

    def describe(self) -> str:
        return f"{self.arm}: {self.kind.replace('_', ' ')} {self.value:g}"


@dataclasses.dataclass(frozen=True)
class Arm:
    name: str
    change: Mapping[str, Any]  # TrainConfig override relative to the baseline
    seeds: tuple[int, ...]
    expect: tuple[Check, ...] = ()


@dataclasses.dataclass(frozen=True)
class Criterion:
    statement: str
    checks: tuple[Check, ...]


@dataclasses.dataclass(frozen=True)
class Amendment:
    """A dated reason for an edit made to the record after a run: the history stays visible."""

    date: str  # ISO date, YYYY-MM-DD
    reason: str

    def __post_init__(self) -> None:
        if not isinstance(self.date, str) or not re.fullmatch(r"\d{4}-\d{2}-\d{2}", self.date):
            raise ValueError(f"amendment date must be an ISO date YYYY-MM-DD, got {self.date!r}")
        try:
            datetime.date.fromisoformat(self.date)
        except ValueError:
            raise ValueError(f"amendment date {self.date!r} is not a calendar date") from None
        if not isinstance(self.reason, str) or not self.reason.strip():
            raise ValueError(f"amendment reason must be a non-empty string, got {self.reason!r}")


@dataclasses.dataclass(frozen=True)
class ScheduleScaling:
    """How each run's schedule follows its step count (budgets differ in steps).

    ``wsd``: warmup and decay are these fractions of the run's steps; ``cosine``: warmup is.
    ``constant`` (and the other kinds) keep the configured schedule as is: nothing then
    depends on the step count, so every budget of an arm shares one compiled train step
    (the step's schedule constants are compiled in), which is what makes a CPU screen fit.
    """

    warmup_fraction: float = 0.1
    decay_fraction: float = 0.3

    def __post_init__(self) -> None:
        for name in ("warmup_fraction", "decay_fraction"):
            value = _finite(getattr(self, name), f"schedule.{name}")
            if not 0.0 <= value < 1.0:
                raise ValueError(f"schedule.{name} must be in [0, 1), got {value}")
        if self.warmup_fraction + self.decay_fraction > 1.0:
            raise ValueError("schedule: warmup_fraction + decay_fraction must be <= 1")


@dataclasses.dataclass(frozen=True)
class ExperimentRecord:
    name: str
    hypothesis: str
    links: Mapping[str, Any]
    baseline: Mapping[str, Any]  # the resolved baseline TrainConfig as a plain dict
    budgets: tuple[float, ...]
    seeds: tuple[int, ...]
    arms: tuple[Arm, ...]
    criterion: Criterion
    schedule: ScheduleScaling = ScheduleScaling()
    validation_windows: int = 64
    bootstrap: int = 1000
    data_files: int = DEFAULT_DATA_FILES  # standard-library files in the corpus (a DataKit dataset: data.py)
    amendments: tuple[Amendment, ...] = ()  # not frozen: see the module docstring
    source: str = "<inline>"

    def __post_init__(self) -> None:
        validate_name(self.name, "experiment name")
        if not isinstance(self.hypothesis, str) or not self.hypothesis.strip():
            raise ValueError(f"{self.source}: hypothesis must be a non-empty string")
        if not self.criterion.statement.strip():
            raise ValueError(f"{self.source}: criterion.statement must be a non-empty string")
        if len(self.budgets) < 3:
            raise ValueError(
                f"{self.source}: need >= 3 budgets (the baseline fit E + A C^-alpha has 3 parameters), got {list(self.budgets)}"
            )
        if list(self.budgets) != sorted(set(self.budgets)) or any(b <= 0 for b in self.budgets):
            raise ValueError(f"{self.source}: budgets must be > 0, distinct and increasing, got {list(self.budgets)}")
        if len(self.seeds) < 2:
            raise ValueError(f"{self.source}: need >= 2 baseline seeds (they measure the noise floor)")
        names = [a.name for a in self.arms]
        if not names:
            raise ValueError(f"{self.source}: no arms")
        if BASELINE in names:
            raise ValueError(f"{self.source}: arm name {BASELINE!r} is reserved for the baseline")
        arms = set(names) | {BASELINE}
        for check in self.criterion.checks + tuple(c for a in self.arms for c in a.expect):
            if check.arm not in arms:
                raise ValueError(f"{self.source}: check {check.describe()!r} names unknown arm {check.arm!r}")
        if self.validation_windows < 1 or self.bootstrap < 10 or self.data_files < 2:
            raise ValueError(f"{self.source}: validation_windows >= 1, bootstrap >= 10, data_files >= 2 required")
        for arm in self.all_arms():
            self.train_config(arm.name)  # every arm's config must be a valid TrainConfig now

    def all_arms(self) -> tuple[Arm, ...]:
        """The baseline (as the arm ``baseline``) followed by the record's arms."""
        return (Arm(BASELINE, {}, self.seeds),) + self.arms

    def arm(self, name: str) -> Arm:
        for arm in self.all_arms():
            if arm.name == name:
                return arm
        raise KeyError(f"experiment {self.name}: no arm {name!r}; arms: {[a.name for a in self.all_arms()]}")

    def train_config(self, arm: str, vocab_size: int | None = None) -> TrainConfig:
        """The arm's TrainConfig before the per-budget step count (baseline + change);
        ``vocab_size`` (the corpus's) fills ``model.vocab_size`` where neither sets it."""

        where = f"{self.source}: arm {arm!r}"
        try:
            return config_from_dict(merge(self.baseline, self.arm(arm).change), where=where, vocab_size=vocab_size)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: invalid config: {e}") from None

    def frozen(self) -> dict:
        """What may not change once a run has started (see ``lock.py``); not the amendments."""
        return {
            "hypothesis": self.hypothesis,
            "criterion": {
                "statement": self.criterion.statement,
                "checks": [dataclasses.asdict(c) for c in self.criterion.checks],
            },
            "baseline": self.baseline,
            "budgets": list(self.budgets),
            "seeds": list(self.seeds),
            "schedule": dataclasses.asdict(self.schedule),
            "validation_windows": self.validation_windows,
            "data_files": self.data_files,
        }

    def frozen_arm(self, name: str) -> dict:
        arm = self.arm(name)
        return {"change": arm.change, "seeds": list(arm.seeds), "expect": [dataclasses.asdict(c) for c in arm.expect]}


# Set per run from the budget and the seed list; an arm that changed them would be ignored.
