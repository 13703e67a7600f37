"""The demo's run as data, every value it sets in this file (the rest are the library's defaults): its name,
the base training config every phase starts from, and the phase plan the phase controller decides it by
(sensors/phase_controller.py);
assets/training.py's train/demo and eval/demo are partitioned by its phases."""

from __future__ import annotations

from assets.datakit.chat import CHAT_SOURCE
from marin_assets.phases.plan import BranchSpec, PhasePlan, PhaseSpec

RUN = "demo"
TRAIN_KEY = f"train/{RUN}"  # a partition per phase (assets/training.py)
CHECKPOINTS_KEY = f"checkpoints/{RUN}"  # a partition per committed checkpoint (assets/checkpoints.py)

# The base training config every phase starts from, where it departs from the library's defaults (TrainConfig,
# ModelConfig, ...; assets/train_base.py makes these its Dagster config's defaults). A tiny MoE that trains a phase
# in well under a minute on CPU (tokens/step = 8 x 64), Qwen3-MoE-shaped (QK-norm, no shared expert, softmax
# router, no balancing bias) so that the main run exports exactly to HF's qwen3_moe layout (export/demo); our own
# MoE (ModelConfig's defaults) has no exact HF counterpart.
DEMO_BASE = {
    "model": {
        "n_shared_experts": 0,
        "max_seq_len": 64,
        "router_gating": "softmax",
        # A quantile bias changes which experts are chosen: no HF router has one. No balance loss either.
        # Measured in `make demo` (routed assignments dropped in training, 2-process expert axis; eval
        # bits-per-byte), kestrel / jellyfish: 0: 0.34, 4.904 / 0.26, 4.758; sequence_balance_loss 1e-3:
        # 0.31, 4.904 / 0.29, 4.775; 1e-2: 0.23, 5.132 / 0.15, 4.850 (the earlier shared-expert, sigmoid,
        # quantile model: 0.18, 4.930 / 0.04, 4.797). Inference, and so the export, is dropless.
        "balancing": "none",
    },
    "schedule": {"warmup_steps": 8, "decay_steps": 8},
    "seq_len": 64,
    "batch_size": 8,
    "num_steps": 48,
    "checkpoint_every_steps": 16,
    "checkpoint_every_seconds": 60.0,
}

STEP_TOKENS = DEMO_BASE["batch_size"] * DEMO_BASE["seq_len"]  # 8 x 64: token budgets below are in steps of the base

DEMO_PLAN = PhasePlan(
    run=RUN,
    first=PhaseSpec(
        name="kestrel",
        warm_start_from=None,
        schedule="wsd",
        mixture={"sotu": 0.3, "shakespeare": 0.2, "spam_assassin": 0.5},
        batch_size=8,
        hardware="cpu",
        token_budget=48 * STEP_TOKENS,
        peak_lr=0.003,
    ),
    phase_names=("kestrel", "jellyfish", "phoenix", "starling", "heron", "ibis"),
    high_quality_sources=("sotu", "shakespeare"),
    cooldown_hq_fraction=0.3,
    cooldown_tokens=16 * STEP_TOKENS,
    min_cooldown_tokens=4 * STEP_TOKENS,
    low_data_tokens=12_288,
    rewarm_mixture={"sotu": 0.5, "shakespeare": 0.5},
    rewarm_tokens=32 * STEP_TOKENS,
    # Once the first cooldown is accepted, an SFT branch leaves its checkpoint: the plays' dialogue as chat
    # (datasets/shakespeare_chat), loss on the replies only, at a constant LR below the main run's peak. The main
    # run goes on as it would without it (tests/sensors/test_branch_bytes.py).
    branches=(
        BranchSpec(
            name="sft",
            from_phase="jellyfish",
            token_budget=8 * STEP_TOKENS,
            schedule="constant",
            is_cooldown=False,
            mixture={CHAT_SOURCE: 1.0},
            peak_lr=0.001,
        ),
        # A context phase: the same checkpoint at 4x the context (256 tokens; the tokens per step kept, so 2 rows a
        # step), on the blockwise attention kernel (memory linear in the length), the cooldown's mix, a constant LR.
        BranchSpec(
            name="long",
            from_phase="jellyfish",
            token_budget=8 * STEP_TOKENS,
            schedule="constant",
            is_cooldown=False,
            peak_lr=0.001,
            seq_len=4 * DEMO_BASE["seq_len"],
            model_changes={"max_seq_len": 4 * DEMO_BASE["seq_len"], "attention_impl": "blockwise"},
        ),
    ),
)
