"""One phase's training job: what a backend hands to its workers, and what a worker reads.

The orchestration side builds a ``TrainSpec`` (``orchestration.training_backends``
re-exports it) and writes ``to_json_dict()``; every worker process reads it back with
``load_spec`` (``python -m marin_assets.train.distributed.worker --spec SPEC``). One class for both
sides, checked on construction, so a spec the orchestrator accepts is one a worker accepts.

The JSON (every key required except the optional ones)::

  config          TrainConfig as nested dicts (``config_to_dict`` / ``config_from_dict``)
  caches          {source name: cache path or URL} or one path (named "train")
  out_dir         the phase's resumable work dir, a local path or fsspec URL (all processes
                  share it; process 0 writes)
  resume          bool: continue from the newest valid checkpoint in out_dir
  warm_start      optional: a checkpoint or out dir to start from
  telemetry_run   optional: the run name live metrics go under (the phase controller reads it)
  telemetry_root  optional: the telemetry store (default $MARIN_PREFIX/telemetry)
  allow_tokenizer_change  optional bool: resume/warm start onto another tokenizer's tokens
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from marin_assets.store.names import validate_segment
from marin_assets.train.budget import BudgetStop
from marin_assets.train.config import TrainConfig, config_from_dict, config_to_dict

SPEC_KEYS = (
    "config",
    "caches",
    "out_dir",
    "resume",
    "warm_start",
    "telemetry_run",
    "telemetry_root",
    "allow_tokenizer_change",
    "budget_file",
)
OPTIONAL_KEYS = ("warm_start", "telemetry_run", "telemetry_root", "budget_file")


def _path_text(value: Any, what: str) -> str:
    """A path or URL as a non-empty string (``os.PathLike`` accepted); ValueError naming ``what``."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty path string, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class TrainSpec:
    """One phase's training job, as every worker process reads it. Paths may be given as
    ``Path``s; they are kept as strings (local paths or fsspec URLs)."""

    config: TrainConfig
    caches: Mapping[str, str] | str
    out_dir: str
    resume: bool = True
    warm_start: str | None = None
    telemetry_run: str | None = None
    telemetry_root: str | None = None
    allow_tokenizer_change: bool = False
    # The run's budget file (``budget.BudgetStop``): read at each permanent checkpoint step, a cut ends the phase there.
    budget_file: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.config, TrainConfig):
            raise ValueError(f"spec.config must be a TrainConfig, got {type(self.config).__name__}")
        object.__setattr__(self, "caches", self._checked_caches(self.caches))
        object.__setattr__(self, "out_dir", _path_text(self.out_dir, "spec.out_dir"))
        for name in ("resume", "allow_tokenizer_change"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"spec.{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("warm_start", "budget_file"):
            if isinstance(getattr(self, name), os.PathLike):
                object.__setattr__(self, name, os.fspath(getattr(self, name)))
        for name in OPTIONAL_KEYS:
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"spec.{name} must be a non-empty string or null, got {value!r}")
        if self.telemetry_run is not None:
            try:
                validate_segment(self.telemetry_run, "run name")
            except ValueError as e:
                raise ValueError(f"spec.telemetry_run: {e}") from None

    @staticmethod
    def _checked_caches(caches: Any) -> dict[str, str] | str:
        if not isinstance(caches, Mapping):
            return _path_text(caches, "spec.caches (a mapping or one path)")
        if not caches:
            raise ValueError("spec.caches is empty: it names no cache")
        out = {}
        for name, path in caches.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"spec.caches: source name {name!r} must be a non-empty string")
            out[name] = _path_text(path, f"spec.caches[{name!r}]")
        return out

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "config": config_to_dict(self.config),
            "caches": self.caches,
            "out_dir": self.out_dir,
            "resume": self.resume,
            "allow_tokenizer_change": self.allow_tokenizer_change,
            **{k: getattr(self, k) for k in OPTIONAL_KEYS},
        }

    @classmethod
    def from_json_dict(cls, data: Any, where: str = "spec") -> TrainSpec:
        """The spec in ``data`` (parsed JSON); ValueError naming the key at fault."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - set(SPEC_KEYS))
        missing = [k for k in SPEC_KEYS if k not in data and k not in (*OPTIONAL_KEYS, "allow_tokenizer_change")]
        if unknown or missing:
            raise ValueError(f"{where}: unknown key(s) {unknown}, missing key(s) {missing}; keys are {list(SPEC_KEYS)}")
        if not isinstance(data["config"], Mapping):
            raise ValueError(f"{where}.config: expected an object of TrainConfig fields, got {type(data['config']).__name__}")
        try:
            config = config_from_dict(data["config"], where=f"{where}.config")
        except (TypeError, AttributeError) as e:  # a field of the wrong type reached a dataclass
            raise ValueError(f"{where}.config: {e}") from None
        return cls(
            config=config,
            caches=data["caches"],
            out_dir=data["out_dir"],
            resume=data["resume"],
            allow_tokenizer_change=data.get("allow_tokenizer_change", False),
            **{k: data.get(k) for k in OPTIONAL_KEYS},
        )

    def stop_check(self):
        """What ends the phase early besides a signal (``train``'s ``stop_check``): the budget file's cut, if any."""
        return BudgetStop(self.budget_file) if self.budget_file else None

    def paths(self) -> list[str]:
        """Every path the workers open: out dir, caches, warm start."""
        caches = [self.caches] if isinstance(self.caches, str) else list(self.caches.values())
        return [self.out_dir, *caches, *([self.warm_start] if self.warm_start else [])]


def load_spec(path: str | os.PathLike) -> TrainSpec:
    """A spec from a local path or an fsspec URL (e.g. gs://...); ValueError naming the file."""
    import fsspec

    try:
        with fsspec.open(os.fspath(path), "r") as f:
            data = json.loads(f.read())
    except FileNotFoundError:
        raise ValueError(f"{path}: spec file not found") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from None
    return TrainSpec.from_json_dict(data, where=str(path))
