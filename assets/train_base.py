"""The base training config every phase of train/demo starts from (``PhaseConfig.base``): the demo's model
shape, optimizer, schedule and run lengths, as typed Dagster config."""

from __future__ import annotations

import dagster as dg


# A tiny MoE that trains a phase in well under a minute on CPU (tokens/step = 8 x 64), Qwen3-MoE-shaped (QK-norm,
# no shared expert, softmax router, no balancing bias) so that the main run exports exactly to HF's qwen3_moe
# layout (export/demo); our own MoE (ModelConfig's defaults) has no exact HF counterpart.
class ModelShapeConfig(dg.Config):
    vocab_size: int = 0  # 0: the tokenizer's, from the mixture's datasets
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    d_ff: int = 128
    n_routed_experts: int = 4
    n_shared_experts: int = 0
    top_k: int = 2
    expert_d_ff: int = 64
    max_seq_len: int = 64
    router_gating: str = "softmax"  # ModelConfig checks the value
    balancing: str = "none"  # a quantile bias changes which experts are chosen: no HF router has one
    # No balance loss either. Measured in `make demo` (routed assignments dropped in training, 2-process expert
    # axis; eval bits-per-byte), kestrel / jellyfish: 0: 0.34, 4.904 / 0.26, 4.758; sequence_balance_loss 1e-3:
    # 0.31, 4.904 / 0.29, 4.775; 1e-2: 0.23, 5.132 / 0.15, 4.850 (the earlier shared-expert, sigmoid, quantile
    # model: 0.18, 4.930 / 0.04, 4.797). Inference, and so the export, is dropless.


class OptimizerBaseConfig(dg.Config):
    name: str = "adamw"
    weight_decay: float = 0.1


class ScheduleBaseConfig(dg.Config):
    kind: str = "wsd"
    peak_lr: float = 0.003
    warmup_steps: int = 8
    decay_steps: int = 8


class TrainBaseConfig(dg.Config):
    """The TrainConfig (marin_assets/train/config.py) every phase starts from."""

    model: ModelShapeConfig = ModelShapeConfig()
    optimizer: OptimizerBaseConfig = OptimizerBaseConfig()
    schedule: ScheduleBaseConfig = ScheduleBaseConfig()
    seq_len: int = 64
    batch_size: int = 8
    num_steps: int = 48
    checkpoint_every_steps: int = 16
    checkpoint_every_seconds: float = 60.0
