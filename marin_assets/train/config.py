"""TrainConfig: one validated dataclass for a training phase, loadable from YAML."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any, Mapping

from marin_assets.model.config import ModelConfig
from marin_assets.train.guards import GuardConfig
from marin_assets.train.optimizers import OptimizerConfig
from marin_assets.train.schedules import ScheduleConfig


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    model: ModelConfig = ModelConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    guards: GuardConfig = GuardConfig()
    seq_len: int = 64
    batch_size: int = 8
    num_steps: int = 100  # steps of this phase (the schedule's clock starts at the phase start)
    # {source: weight} or {"stages": [[start_batch, {source: weight}], ...]}; None = uniform.
    mixture: Mapping[str, Any] | None = None
    seed: int = 0
    data_seed: int = 0
    checkpoint_every_steps: int = 100  # permanent checkpoints
    checkpoint_every_seconds: float = 600.0  # temporary checkpoints
    prefetch: int = 2
    wandb: bool = False  # offline wandb run under <out>/wandb (slow to start, so opt-in)
    phase: str = "main"

    def __post_init__(self) -> None:
        for name in ("seq_len", "batch_size", "num_steps", "checkpoint_every_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"TrainConfig.{name} must be a positive int, got {value!r}")
        if self.seq_len < 2:
            raise ValueError("TrainConfig.seq_len must be >= 2 (one input and one target token)")
        if self.seq_len > self.model.max_seq_len:
            raise ValueError(
                f"TrainConfig.seq_len ({self.seq_len}) exceeds model.max_seq_len ({self.model.max_seq_len})")
        if self.checkpoint_every_seconds <= 0:
            raise ValueError("TrainConfig.checkpoint_every_seconds must be > 0")
        if self.prefetch < 1:
            raise ValueError("TrainConfig.prefetch must be >= 1")

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len


def _build(cls, data: Mapping[str, Any], where: str):
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in data.items():
        hint = hints[key]
        if dataclasses.is_dataclass(hint) and isinstance(value, Mapping):
            value = _build(hint, value, f"{where}.{key}")
        elif hint is float and isinstance(value, int):
            value = float(value)
        kwargs[key] = value
    return cls(**kwargs)


def config_from_dict(data: Mapping[str, Any], where: str = "config") -> TrainConfig:
    """Nested dicts -> TrainConfig. ``schedule.total_steps`` defaults to ``num_steps``."""
    data = dict(data)
    if "num_steps" in data:
        schedule = dict(data.get("schedule") or {})
        schedule.setdefault("total_steps", data["num_steps"])
        data["schedule"] = schedule
    return _build(TrainConfig, data, where)


def config_to_dict(config: TrainConfig) -> dict:
    return dataclasses.asdict(config)


def load_config(path: str | Path) -> TrainConfig:
    import yaml

    text = Path(path).read_text()
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {e}") from e
    return config_from_dict(data, where=str(path))


def replace(config: TrainConfig, **changes) -> TrainConfig:
    """dataclasses.replace that also accepts nested dicts for the sub-configs."""
    data = config_to_dict(config)
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        elif dataclasses.is_dataclass(value):
            data[key] = dataclasses.asdict(value)
        else:
            data[key] = value
    return config_from_dict(data)
