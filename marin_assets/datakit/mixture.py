"""The data mixture: which sources a run trains on, in what proportions, from which step.

One type for the concept, used by the trainer's data loader (``TrainConfig.mixture``), the
phase plan (``PhaseSpec.mixture`` is validated and normalised through it) and the
``mixture`` asset. Marin's mixtures are schedules: a list of ``(step, {source: weight})``
stages, each in force from its step until the next. ``step`` is the global training step
(= the loader's batch index), so a warm-started phase's stages continue the run's clock.

    Mixture.constant({"web": 3, "code": 1})
    Mixture([(0, {"web": 3, "code": 1}), (1000, {"web": 1, "math": 1})])
    Mixture.from_dict({"web": 3, "code": 1})                           # YAML: plain weights
    Mixture.from_dict({"stages": [[0, {"web": 1}], [1000, {"math": 1}]]})
    Mixture.from_dict([[0, {"web": 1}], [1000, {"math": 1}]])          # the asset's JSON list
    mixture.to_dict() == {"stages": [[0, {"code": 0.25, "math": 0.0, "web": 0.75}], ...]}

Weights are validated (finite, >= 0, a positive sum per stage) and normalised per stage
over every source the mixture names (zeros included), so two spellings of the same mix
compare equal and ``Mixture.from_dict(m.to_dict()) == m``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from marin_assets.datakit.datasets import resolve

Stage = tuple[int, tuple[tuple[str, float], ...]]  # (first step, sorted (source, weight) pairs)
StageSpec = tuple[int, Mapping[str, float] | tuple[tuple[str, float], ...]]  # as given: {source: weight} or a Stage's pairs


def _stage_weights(step: Any, weights: Any) -> dict[str, float]:
    where = f"mixture stage at step {step!r}"
    if not isinstance(weights, Mapping) or not weights:
        raise ValueError(f"{where}: weights must be a non-empty mapping {{source: weight}}, got {weights!r}")
    out = {}
    for name, w in weights.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: source names must be non-empty strings, got {name!r}")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
            raise ValueError(f"{where}: weight of {name!r} must be finite and >= 0, got {w!r}")
        out[name] = float(w)
    if sum(out.values()) <= 0:
        raise ValueError(f"{where}: weights sum to zero")
    return out


def _normalised(weights: dict[str, float]) -> dict[str, float]:
    """Weights over their sum; weights that already sum to 1 (to 1e-12) are kept as given, so that
    normalising is idempotent: dividing by a float sum of 0.9999999999999999 would move every
    weight by one ulp, and a mixture read back from its own to_dict() would differ from itself."""
    total = math.fsum(weights.values())
    if math.isclose(total, 1.0, rel_tol=1e-12, abs_tol=0.0):
        return weights
    return {name: w / total for name, w in weights.items()}


def _check_steps(steps: list[Any]) -> None:
    for step in steps:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"mixture stage step must be a non-negative integer, got {step!r}")
    if steps[0] != 0:
        raise ValueError(f"the first mixture stage must start at step 0, got {steps[0]}")
    for prev, cur in zip(steps, steps[1:]):
        if cur <= prev:
            raise ValueError(f"mixture stage steps must be strictly ascending, got {prev} then {cur}")


@dataclasses.dataclass(frozen=True)
class Mixture:
    """Validated, normalised ``[(step, {source: weight})]`` stages (see the module doc).

    ``stages`` accepts any sequence of ``(step, {source: weight})`` pairs; it is stored as
    a tuple of ``(step, ((source, weight), ...))`` with weights normalised per stage (so the
    constructor takes a wider type than the field holds: it is written out, not generated).
    """

    stages: Sequence[Stage]

    def __init__(self, stages: Sequence[StageSpec]) -> None:
        raw = stages
        if isinstance(raw, (str, bytes, Mapping)) or not isinstance(raw, Sequence) or not raw:
            raise ValueError(f"a mixture needs at least one (step, weights) stage, got {raw!r}")
        pairs = []
        for stage in raw:
            if isinstance(stage, (str, bytes)) or not isinstance(stage, Sequence) or len(stage) != 2:
                raise ValueError(f"a mixture stage must be a [step, {{source: weight}}] pair, got {stage!r}")
            pairs.append((stage[0], stage[1]))
        _check_steps([step for step, _ in pairs])
        weights = [_stage_weights(step, w if not _is_pairs(w) else dict(w)) for step, w in pairs]
        sources = sorted({name for w in weights for name in w})
        stages = tuple(
            (int(step), tuple((name, w.get(name, 0.0)) for name in sources))
            for (step, _), w in zip(pairs, (_normalised(w) for w in weights))
        )
        object.__setattr__(self, "stages", stages)

    @classmethod
    def constant(cls, weights: Mapping[str, float]) -> Mixture:
        return cls([(0, weights)])

    @classmethod
    def from_dict(cls, obj: Any) -> Mixture:
        """A Mixture from its config spellings: ``{source: weight}``, ``{"stages": [[step,
        {source: weight}], ...]}``, the bare stage list, or a Mixture (returned as is)."""
        if isinstance(obj, Mixture):
            return obj
        if isinstance(obj, Mapping):
            if "stages" in obj:
                if set(obj) != {"stages"}:
                    raise ValueError(f"mixture: a staged mixture has only 'stages', got keys {sorted(map(str, obj))}")
                return cls(obj["stages"])
            return cls.constant(obj)
        if isinstance(obj, Sequence) and not isinstance(obj, (str, bytes)):
            return cls(obj)
        raise ValueError(
            f"mixture must be {{source: weight}} or {{'stages': [[step, {{source: weight}}], ...]}}, "
            f"got {type(obj).__name__} {obj!r}"
        )

    def to_dict(self) -> dict:
        """``{"stages": [[step, {source: weight}], ...]}``: JSON-ready, ``from_dict`` reads it back."""
        return {"stages": [[step, dict(weights)] for step, weights in self.stages]}

    def to_json(self) -> list:
        """The stage list alone (what the ``mixture`` asset writes as ``schedule``)."""
        return self.to_dict()["stages"]

    @property
    def sources(self) -> tuple[str, ...]:
        """Every source any stage names, sorted (zero-weight ones included)."""
        return tuple(name for name, _ in self.stages[0][1])

    @property
    def weighted(self) -> tuple[str, ...]:
        """The sources some stage gives a positive weight, sorted (what a trainer reads)."""
        return tuple(sorted({name for _, weights in self.stages for name, w in weights if w > 0}))

    @property
    def steps(self) -> tuple[int, ...]:
        return tuple(step for step, _ in self.stages)

    def stage_index(self, step: int) -> int:
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        index = 0
        for i, start in enumerate(self.steps):
            if step >= start:
                index = i
        return index

    def weights_at(self, step: int) -> dict[str, float]:
        """Normalised weights in force at ``step`` (every source, zeros included)."""
        return dict(self.stages[self.stage_index(step)][1])

    def check_sources(self, available: Sequence[str], where: str = "mixture") -> None:
        """Every source with a positive weight in some stage must be among ``available``."""
        unknown = sorted(set(self.weighted) - set(available))
        if unknown:
            raise ValueError(f"{where} names unknown sources {unknown}; available: {sorted(available)}")


def _is_pairs(weights: Any) -> bool:
    """A stage's weights as stored (``((source, weight), ...)``) rather than a mapping."""
    return isinstance(weights, tuple) and all(isinstance(p, tuple) and len(p) == 2 for p in weights) and bool(weights)


MIXTURE_FILE = "mixture.json"  # what the ``mixture`` asset writes: {"schedule": [...], "datasets": {...}}


def read_mixture_file(data_dir: str) -> tuple[Mixture, dict[str, dict]]:
    """(schedule, {source: {"index": absolute dataset.json path, "version", "train_tokens",
    "validation_tokens", "vocab_size"}}) of a ``mixture`` artifact's data directory."""
    import json

    import fsspec

    path = f"{data_dir.rstrip('/')}/{MIXTURE_FILE}"
    fs, fs_path = fsspec.core.url_to_fs(path)
    spec = json.loads(fs.cat_file(fs_path))
    if not isinstance(spec, dict) or "schedule" not in spec or not isinstance(spec.get("datasets"), dict):
        raise ValueError(f"{path}: not a mixture (want 'schedule' and 'datasets')")
    datasets = {s: {**d, "index": resolve(d["index"], data_dir)} for s, d in spec["datasets"].items()}
    return Mixture.from_dict(spec["schedule"]), datasets
