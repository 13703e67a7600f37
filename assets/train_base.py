"""The Dagster configs of a train/demo phase, generated from the library dataclasses they stand for
(marin_assets/orchestration/knob_configs.py ``dataclass_config``): ``PhaseSpecConfig`` is a
``PhaseSpec``; ``TrainBaseConfig`` the part of a ``TrainConfig`` a phase does not decide itself (the
model's shape, optimizer, schedule, run lengths). Each field has its library field's type and default
(tests/test_knobs.py checks), except the demo's own values (``assets/run_plan.py``'s ``DEMO_BASE``), which
are the base config's defaults here: Dagster reads a nested config's defaults from its class."""

from __future__ import annotations

import dataclasses

from assets.run_plan import DEMO_BASE
from marin_assets.model.config import ModelConfig
from marin_assets.orchestration.knob_configs import Override, dataclass_config
from marin_assets.phases.job import TOKENIZER_VOCAB
from marin_assets.phases.plan import PhaseSpec
from marin_assets.train.config import OptimizerConfig, ScheduleConfig, TrainConfig

DEMO = "the demo's value (assets/run_plan.py DEMO_BASE)"


class PhaseSpecConfig(
    dataclass_config(
        "PhaseSpecConfig",
        PhaseSpec,
        [f.name for f in dataclasses.fields(PhaseSpec)],
        overrides={"mixture": Override(dict[str, float] | None, None, "the phase's own mix; None: the mixture asset's schedule")},
    )
):
    """A PhaseSpec (marin_assets/phases/plan.py), chosen by the phase controller for each phase."""


# The fields a base config sets (the phase decides steps, schedule kind, LR, batch and mixture: plan.py
# ``phase_train_config``). The set is part of every phase's content version (its dump is hashed): a new
# field here re-versions every phase.
class ModelShapeConfig(
    dataclass_config(
        "ModelShapeConfig",
        ModelConfig,
        [
            "vocab_size",
            "d_model",
            "n_layers",
            "n_heads",
            "n_kv_heads",
            "d_ff",
            "n_routed_experts",
            "n_shared_experts",
            "top_k",
            "expert_d_ff",
            "max_seq_len",
            "router_gating",
            "balancing",
        ],
        overrides={
            "vocab_size": Override(int, TOKENIZER_VOCAB, f"{TOKENIZER_VOCAB}: the tokenizer's, from the mixture's datasets")
        },
        values=DEMO_BASE["model"],
        why=DEMO,
    )
):
    """The model's shape (ModelConfig's fields a base config sets)."""


class OptimizerBaseConfig(dataclass_config("OptimizerBaseConfig", OptimizerConfig, ["name", "weight_decay"])):
    """The optimizer (OptimizerConfig's fields a base config sets)."""


class ScheduleBaseConfig(
    dataclass_config(
        "ScheduleBaseConfig",
        ScheduleConfig,
        ["kind", "peak_lr", "warmup_steps", "decay_steps"],
        values=DEMO_BASE["schedule"],
        why=DEMO,
    )
):
    """The LR schedule's shape (the phase sets its kind, peak and length)."""


class TrainBaseConfig(
    dataclass_config(
        "TrainBaseConfig",
        TrainConfig,
        [
            "model",
            "optimizer",
            "schedule",
            "seq_len",
            "batch_size",
            "num_steps",
            "checkpoint_every_steps",
            "checkpoint_every_seconds",
        ],
        nested={"model": ModelShapeConfig, "optimizer": OptimizerBaseConfig, "schedule": ScheduleBaseConfig},
        values={k: v for k, v in DEMO_BASE.items() if k not in ("model", "optimizer", "schedule")},
        why=DEMO,
    )
):
    """The TrainConfig (marin_assets/train/config.py) every phase starts from."""
