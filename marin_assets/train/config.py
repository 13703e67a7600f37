"""TrainConfig: one validated dataclass tree for a training phase, loadable from YAML: the model
(model/config.py), the optimizer, the LR schedule and the stability guards, and the phase's own fields.

Every config of the tree lives in a module without JAX (this one, model/config.py): a process that only
reads, checks or generates configs (the Dagster code location, ``marin`` parsing a file) never imports it.
The code that runs them is in optimizers.py, lr_schedules.py and guards.py."""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kernels.choices import CONTEXT_PARALLEL_IMPLS
from marin_assets.config_files import load_structured
from marin_assets.datakit.mixture import Mixture
from marin_assets.knobs import knob
from marin_assets.model.config import (
    DEFAULT_DTYPE,
    DEFAULT_REMAT,
    DTYPE_BYTES,
    DTYPE_NAMES,
    MAX_INT32,
    REMAT_NAMES,
    ModelConfig,
    check_dtype,
    check_remat,
)
from marin_assets.model.flops import count_params
from marin_assets.numeric_checks import check_field_types, check_int

OPTIMIZER_NAMES = ("adamw", "adamh", "muon")  # optimizers.py builds each

# Newton-Schulz steps are unrolled into the traced step: compile time grows with each, and 5 already
# orthogonalises well enough; past this a value is a typo, not a setting.
MAX_NS_STEPS = 100


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    name: str = "adamw"
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    muon_momentum: float = 0.95
    muon_ns_steps: int = 5

    def __post_init__(self) -> None:
        check_field_types(self)
        if self.name not in OPTIMIZER_NAMES:
            raise ValueError(f"OptimizerConfig.name must be one of {OPTIMIZER_NAMES}, got {self.name!r}")
        for name in ("beta1", "beta2", "muon_momentum"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"OptimizerConfig.{name} must be in [0, 1), got {getattr(self, name)}")
        if self.eps <= 0 or self.weight_decay < 0:
            raise ValueError("OptimizerConfig: eps must be > 0 and weight_decay >= 0")
        check_int("OptimizerConfig.muon_ns_steps", self.muon_ns_steps, 1, MAX_NS_STEPS)


MAX_STEPS = 2**31 - 1  # the train state's step is int32

SCHEDULE_KINDS = ("constant", "cosine", "wsd", "wsd_s", "linear_decay")


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
        if self.kind not in SCHEDULE_KINDS:
            raise ValueError(f"ScheduleConfig.kind must be one of {SCHEDULE_KINDS}, got {self.kind!r}")
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


MAX_COUNT = 2**31 - 1  # the window and the spike counter are compared with int32 counters


@dataclasses.dataclass(frozen=True)
class GuardConfig:
    grad_clip: float = 1.0  # 0 disables
    update_clip_sigma: float = 6.0  # 0 disables
    skip_sigma: float = 6.0  # 0 disables the spike test (non-finite steps are always skipped)
    window: int = 128
    min_history: int = 16  # no statistical test until this many steps were accepted
    # A level shift is not a spike: after this many spike-skips in a row the next step is
    # accepted, so the window learns the new level instead of freezing the run (0: no cap).
    max_consecutive_spikes: int = 8
    # A phase that skipped more than this fraction of its steps trained on little or nothing
    # (e.g. every batch flagged corrupt): train() raises TooManySkippedSteps after it.
    max_skipped_fraction: float = 0.5

    def __post_init__(self) -> None:
        check_field_types(self)
        for name in ("grad_clip", "update_clip_sigma", "skip_sigma"):
            if getattr(self, name) < 0:
                raise ValueError(f"GuardConfig.{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.max_skipped_fraction <= 1.0:
            raise ValueError(f"GuardConfig.max_skipped_fraction must be in [0, 1], got {self.max_skipped_fraction}")
        if self.window < 2:
            raise ValueError(f"GuardConfig.window must be >= 2, got {self.window}")
        check_int("GuardConfig.window", self.window, 2, MAX_COUNT)
        if self.max_consecutive_spikes < 0:
            raise ValueError(f"GuardConfig.max_consecutive_spikes must be >= 0, got {self.max_consecutive_spikes}")
        check_int("GuardConfig.max_consecutive_spikes", self.max_consecutive_spikes, 0, MAX_COUNT)
        if not 2 <= self.min_history <= self.window:
            raise ValueError(f"GuardConfig.min_history must be in [2, window={self.window}], got {self.min_history}")


class ConfigError(ValueError):
    """A config of the wrong shape or with an out-of-range value; the message names the field."""


# jax.random.PRNGKey keeps 32 bits of its seed (without jax_enable_x64): 2**32 would be seed 0's key
# and -1 seed 2**32 - 1's, and past int64 it raises OverflowError. The data seed keeps the same range.
MAX_SEED = 2**32 - 1
# Integer fields' [lo, hi]. Steps and token counts are int32 on the device (TrainState.step); seq_len
# needs one input and one target token.
_INT_RANGES = {
    "seq_len": (2, MAX_INT32),
    "batch_size": (1, MAX_INT32),
    "num_steps": (1, MAX_INT32),
    "seed": (0, MAX_SEED),
    "data_seed": (0, MAX_SEED),
    "data_block_tokens": (1, MAX_INT32),
    "checkpoint_every_steps": (1, MAX_INT32),
    "prefetch": (1, MAX_INT32),
    "microbatches": (1, MAX_INT32),
    "sequence_parallel": (1, MAX_INT32),
}


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
    # for every window to be contiguous text (train/data/batches.py).
    data_block_tokens: int | None = None
    checkpoint_every_steps: int = 100  # permanent checkpoints
    checkpoint_every_seconds: float = 600.0  # temporary checkpoints
    prefetch: int = 2
    wandb: bool = False  # offline wandb run under <out>/wandb (slow to start, so opt-in)
    phase: str = "main"
    # How the step computes (marin_assets/model/compute.py). They live here, not on ModelConfig: they
    # leave the parameter tree, the parameter and FLOP counts unchanged, so the same model can be
    # trained, resumed or evaluated under other choices (evaluation and held-out loss run in fp32).
    compute_dtype: str = knob(
        DEFAULT_DTYPE,
        help=f"dtype of activations and matmuls, one of {DTYPE_NAMES}; norms, "
        "softmax, router logits, LM logits and the loss stay float32",
    )
    param_dtype: str = knob(
        DEFAULT_DTYPE,
        help=f"dtype of the parameters and optimizer state (the master weights checkpoints keep), one of {DTYPE_NAMES}",
    )
    remat: str = knob(
        DEFAULT_REMAT,
        versioned=False,
        help=f"activation rematerialisation per layer, one of {REMAT_NAMES}: "
        "full recomputes the layer in the backward, save_matmuls keeps the weight matmuls' outputs",
    )
    fsdp: bool = knob(
        False,
        versioned=False,
        help="FSDP: params and optimizer state split over every device of the mesh "
        "(routed experts over expert x data) and gathered per layer in the step (train/distributed/mesh.py)",
    )
    offload_optimizer: bool = knob(
        False,
        versioned=False,
        help="keep the optimizer state in pinned host memory between "
        "steps, copied to the device inside the step (train/distributed/offload.py; refused where the "
        "backend cannot compile it, e.g. XLA:CPU)",
    )
    document_masking: bool = knob(
        False,
        help="attention stays inside each packed document: segment ids from the "
        "caches' EOS tokens (train/data/batches.py); with model.rope_per_document positions restart too",
    )
    # Versioned, unlike remat: the gradient is the batch's up to rounding, but a MoE's quantile-balancing bias moves
    # by the microbatches' mean correction and an expert capacity is a microbatch's (train/accumulate.py).
    microbatches: int = knob(
        1,
        help="gradient accumulation: each step runs its batch as this many microbatches in turn "
        "(one microbatch's activations in memory) and sums their gradients into the batch's "
        "(train/accumulate.py); must divide batch_size",
    )
    # Not versioned, like fsdp: a layout. The step computes the same loss and gradient up to rounding.
    sequence_parallel: int = knob(
        1,
        versioned=False,
        help="context parallelism: the mesh's sequence axis, over which each row's positions are split "
        "(attention all-gathers keys and values along it: kernels.attention.SequenceParallel, reference or "
        "blockwise kernel); must divide seq_len and the devices of a process",
    )

    def __post_init__(self) -> None:
        for name, cls in (
            ("model", ModelConfig),
            ("optimizer", OptimizerConfig),
            ("schedule", ScheduleConfig),
            ("guards", GuardConfig),
        ):
            if not isinstance(getattr(self, name), cls):
                raise ValueError(f"TrainConfig.{name} must be a {cls.__name__}, got {getattr(self, name)!r}")
        check_field_types(self)
        if self.mixture is not None:
            object.__setattr__(self, "mixture", Mixture.from_dict(self.mixture))
        for name in (
            "seq_len",
            "batch_size",
            "num_steps",
            "checkpoint_every_steps",
            "prefetch",
            "microbatches",
            "sequence_parallel",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"TrainConfig.{name} must be a positive int, got {getattr(self, name)!r}")
        if self.data_block_tokens is not None and self.data_block_tokens <= 0:
            raise ValueError(f"TrainConfig.data_block_tokens must be a positive int or unset, got {self.data_block_tokens!r}")
        for name, (lo, hi) in _INT_RANGES.items():
            if getattr(self, name) is not None:
                check_int(f"TrainConfig.{name}", getattr(self, name), lo, hi)
        if self.batch_size % self.microbatches:
            raise ValueError(f"TrainConfig.microbatches ({self.microbatches}) must divide batch_size ({self.batch_size})")
        if self.seq_len % self.sequence_parallel:
            raise ValueError(f"TrainConfig.sequence_parallel ({self.sequence_parallel}) must divide seq_len ({self.seq_len})")
        if self.sequence_parallel > 1 and self.model.attention_impl not in CONTEXT_PARALLEL_IMPLS:
            raise ValueError(
                f"TrainConfig.sequence_parallel ({self.sequence_parallel}) runs attention through the reference or "
                f"blockwise kernel; model.attention_impl is {self.model.attention_impl!r} (one of {CONTEXT_PARALLEL_IMPLS})"
            )
        if self.seq_len > self.model.max_seq_len:
            raise ValueError(f"TrainConfig.seq_len ({self.seq_len}) exceeds model.max_seq_len ({self.model.max_seq_len})")
        if self.checkpoint_every_seconds <= 0:
            raise ValueError(f"TrainConfig.checkpoint_every_seconds must be > 0, got {self.checkpoint_every_seconds}")
        check_dtype(self.compute_dtype, "TrainConfig.compute_dtype")
        check_dtype(self.param_dtype, "TrainConfig.param_dtype")
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
            raise ConfigError(f"{where} must be a mapping of {hint.__name__} fields, got {type(value).__name__} {value!r:.80}")
        return _build(hint, value, where)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > _MAX_FLOAT:  # float() would raise OverflowError
            raise ConfigError(f"{where} must be a finite number, got an integer of {value.bit_length()} bits")
        return float(value)
    return value


_MAX_FLOAT = 2**1023  # past it float(int) overflows


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
        try:  # named as the file spells it, not as the schedule.total_steps it is copied to
            check_int("TrainConfig.num_steps", data["num_steps"], *_INT_RANGES["num_steps"])
        except ValueError as e:
            raise ConfigError(f"{where}: {e}") from None
        data["schedule"] = {"total_steps": data["num_steps"], **(data.get("schedule") or {})}
    if vocab_size is not None and isinstance(data.get("model") or {}, Mapping):
        data["model"] = {"vocab_size": vocab_size, **(data.get("model") or {})}
    return _build(TrainConfig, data, where)


def config_to_dict(config: TrainConfig) -> dict:
    data = dataclasses.asdict(config)
    data["mixture"] = config.mixture.to_dict() if config.mixture is not None else None
    return data


def load_config(path: str | Path, vocab_size: int | None = None, check_memory: bool = True) -> TrainConfig:
    """A TrainConfig from YAML; ``vocab_size`` as in ``config_from_dict``. ``check_memory``: refuse a
    config whose state cannot fit this host (``check_state_fits``); off for a shape only planned with."""
    try:
        data = load_structured(path)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e})") from e
    except ValueError as e:  # already one line naming the file (and line:column)
        raise ConfigError(str(e)) from None
    config = config_from_dict({} if data is None else data, where=f"{path}: config", vocab_size=vocab_size)
    if check_memory:
        check_state_fits(config, where=f"{path}: config")
    return config


# Moments the optimizer keeps per parameter: Adam's two; Muon's one momentum on the matrices (most
# parameters; its Adam moments on the rest are not counted, so the estimate stays a lower bound).
_MOMENTS = {"adamw": 2, "adamh": 2, "muon": 1}


def state_bytes(config: TrainConfig) -> int:
    """A lower bound on the training state's bytes, from the closed-form parameter count (nothing built):
    the parameters and the optimizer's moments in param_dtype, plus the prefetched and current batches of
    int32 tokens and the guards' windows. Gradients, activations and XLA's buffers come on top."""
    params, _ = count_params(config.model)
    value_bytes = DTYPE_BYTES[check_dtype(config.param_dtype, "TrainConfig.param_dtype")]
    batches = (config.prefetch + 1) * config.batch_size * config.seq_len * 4
    guard_windows = 3 * config.guards.window * 4  # float32 ring buffers (guards.init_guard_state)
    return params * value_bytes * (1 + _MOMENTS[config.optimizer.name]) + batches + guard_windows


def host_memory_bytes() -> int | None:
    """This host's memory, lowered to the cgroup's limit when the process runs under one; None if unknown."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        return total
    return min(total, int(limit)) if limit.isdigit() else total


def check_state_fits(config: TrainConfig, where: str = "config", available: int | None = None) -> None:
    """A ConfigError naming the fields when ``state_bytes`` exceeds ``available`` (default: this host's
    memory): such a run would otherwise swap or hang allocating its parameters instead of failing."""
    available = host_memory_bytes() if available is None else available
    need = state_bytes(config)
    if available is None or need <= available:
        return

    m = config.model
    params, _ = count_params(m)
    embedding = 2 * m.vocab_size * m.d_model  # the embedding table and the untied LM head
    largest = (
        f"{embedding / params:.0%} of them in the embedding and head (model.vocab_size={m.vocab_size} x "
        f"model.d_model={m.d_model})"
        if 2 * embedding >= params
        else f"{1 - embedding / params:.0%} of them in the layers (model.n_layers={m.n_layers})"
    )
    raise ConfigError(
        f"{where}: the parameters and {config.optimizer.name} state in {config.param_dtype} need at "
        f"least {need / 2**30:,.1f} GiB, more than the {available / 2**30:,.1f} GiB of memory this host "
        f"has: {params:,} parameters, {largest}"
    )


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
