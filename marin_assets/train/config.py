"""TrainConfig: one validated dataclass for a training phase, loadable from YAML."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any, Mapping

from marin_assets.datakit.mixture import Mixture
from marin_assets.knobs import knob
from marin_assets.model.compute import DEFAULT_DTYPE, DEFAULT_REMAT, DTYPE_NAMES, REMAT_NAMES, check_remat, dtype_of
from marin_assets.model.config import ModelConfig
from marin_assets.numeric_checks import check_field_types
from marin_assets.train.guards import GuardConfig
from marin_assets.train.optimizers import OptimizerConfig
from marin_assets.train.schedules import ScheduleConfig


class ConfigError(ValueError):
    """A config of the wrong shape or with an out-of-range value; the message names the field."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    model: ModelConfig = ModelConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    guards: GuardConfig = GuardConfig()
    seq_len: int = 64
    batch_size: int = 8
    num_steps: int = 100  # steps of this phase (the schedule's clock starts at the phase start)
    # A Mixture, or a spelling Mixture.from_dict reads ({source: weight} or
    # {"stages": [[start_step, {source: weight}], ...]}); None = every source equally.
    mixture: Mixture | None = None
    seed: int = 0
    data_seed: int = 0
    # The data shuffle's block in tokens, fixed for the whole run (None: the first phase's seq_len). A phase
    # of longer context reads windows of several consecutive blocks, so set it to the run's longest seq_len
    # for every window to be contiguous text (train/data.py).
    data_block_tokens: int | None = None
    checkpoint_every_steps: int = 100  # permanent checkpoints
    checkpoint_every_seconds: float = 600.0  # temporary checkpoints
    prefetch: int = 2
    wandb: bool = False  # offline wandb run under <out>/wandb (slow to start, so opt-in)
    phase: str = "main"
    # How the step computes (marin_assets/model/compute.py). They live here, not on ModelConfig: they
    # leave the parameter tree, the parameter and FLOP counts unchanged, so the same model can be
    # trained, resumed or evaluated under other choices (evaluation and held-out loss run in fp32).
    compute_dtype: str = knob(DEFAULT_DTYPE, help=f"dtype of activations and matmuls, one of {DTYPE_NAMES}; norms, "
                              "softmax, router logits, LM logits and the loss stay float32")
    param_dtype: str = knob(DEFAULT_DTYPE, help=f"dtype of the parameters and optimizer state (the master weights "
                            f"checkpoints keep), one of {DTYPE_NAMES}")
    remat: str = knob(DEFAULT_REMAT, versioned=False, help=f"activation rematerialisation per layer, one of {REMAT_NAMES}: "
                      "full recomputes the layer in the backward, save_matmuls keeps the weight matmuls' outputs")
    fsdp: bool = knob(False, versioned=False, help="FSDP: params and optimizer state split over every device of the mesh "
                      "(routed experts over expert x data) and gathered per layer in the step (train/mesh.py)")
    offload_optimizer: bool = knob(False, versioned=False, help="keep the optimizer state in pinned host memory between "
                                   "steps, copied to the device inside the step (train/offload.py; refused where the "
                                   "backend cannot compile it, e.g. XLA:CPU)")

    def __post_init__(self) -> None:
        for name, cls in (("model", ModelConfig), ("optimizer", OptimizerConfig), ("schedule", ScheduleConfig),
                          ("guards", GuardConfig)):
            if not isinstance(getattr(self, name), cls):
                raise ValueError(f"TrainConfig.{name} must be a {cls.__name__}, got {getattr(self, name)!r}")
        check_field_types(self)
        if self.mixture is not None:
            object.__setattr__(self, "mixture", Mixture.from_dict(self.mixture))
        for name in ("seq_len", "batch_size", "num_steps", "checkpoint_every_steps", "prefetch"):
            if getattr(self, name) <= 0:
                raise ValueError(f"TrainConfig.{name} must be a positive int, got {getattr(self, name)!r}")
        if self.data_block_tokens is not None and self.data_block_tokens <= 0:
            raise ValueError(f"TrainConfig.data_block_tokens must be a positive int or unset, got {self.data_block_tokens!r}")
        if self.seq_len < 2:
            raise ValueError("TrainConfig.seq_len must be >= 2 (one input and one target token)")
        if self.seq_len > self.model.max_seq_len:
            raise ValueError(
                f"TrainConfig.seq_len ({self.seq_len}) exceeds model.max_seq_len ({self.model.max_seq_len})")
        if self.checkpoint_every_seconds <= 0:
            raise ValueError("TrainConfig.checkpoint_every_seconds must be > 0")
        dtype_of(self.compute_dtype, "TrainConfig.compute_dtype")
        dtype_of(self.param_dtype, "TrainConfig.param_dtype")
        check_remat(self.remat, "TrainConfig.remat")

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len


def _field_value(hint, value, where: str):
    """One field's raw YAML/JSON value, converted where the file format forces it."""
    if dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where} must be a mapping of {hint.__name__} fields, got "
                              f"{type(value).__name__} {value!r:.80}")
        return _build(hint, value, where)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _build(cls, data: Mapping[str, Any], where: str):
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping of {cls.__name__} fields, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(map(str, set(data) - set(fields)))
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    kwargs = {key: _field_value(hints[key], value, f"{where}.{key}") for key, value in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:  # __post_init__ names the field; add the file/path
        raise ConfigError(f"{where}: {e}") from e


def config_from_dict(data: Mapping[str, Any], where: str = "config", vocab_size: int | None = None) -> TrainConfig:
    """Nested dicts -> TrainConfig; every failure is a ConfigError naming the field.

    ``schedule.total_steps`` defaults to ``num_steps``. ``vocab_size`` (the tokenizer's, e.g.
    from the cache) fills ``model.vocab_size`` when the file leaves it unset.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping of TrainConfig fields, got {type(data).__name__}")
    data = dict(data)
    if "num_steps" in data and isinstance(data.get("schedule") or {}, Mapping):
        data["schedule"] = {"total_steps": data["num_steps"], **(data.get("schedule") or {})}
    if vocab_size is not None and isinstance(data.get("model") or {}, Mapping):
        data["model"] = {"vocab_size": vocab_size, **(data.get("model") or {})}
    return _build(TrainConfig, data, where)


def config_to_dict(config: TrainConfig) -> dict:
    data = dataclasses.asdict(config)
    data["mixture"] = config.mixture.to_dict() if config.mixture is not None else None
    return data


def load_config(path: str | Path, vocab_size: int | None = None) -> TrainConfig:
    """A TrainConfig from YAML; ``vocab_size`` as in ``config_from_dict``."""
    from marin_assets.config_files import load_structured

    try:
        data = load_structured(path)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e})") from e
    except ValueError as e:  # already one line naming the file (and line:column)
        raise ConfigError(str(e)) from None
    return config_from_dict({} if data is None else data, where=f"{path}: config", vocab_size=vocab_size)


_NESTED = ("model", "optimizer", "schedule", "guards")


def replace(config: TrainConfig, **changes) -> TrainConfig:
    """dataclasses.replace that also accepts nested dicts for the sub-configs (merged into them)."""
    data = config_to_dict(config)
    for key, value in changes.items():
        if key in _NESTED and isinstance(value, Mapping):
            data[key] = {**data[key], **value}
        elif key in _NESTED and dataclasses.is_dataclass(value):
            data[key] = dataclasses.asdict(value)
        elif key == "mixture" and isinstance(value, Mixture):
            data[key] = value.to_dict()
        else:
            data[key] = value
    return config_from_dict(data)
