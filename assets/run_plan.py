"""The demo's run as data: its name and the phase plan the phase controller decides it by (sensors/phase_controller.py);
assets/training.py's train/demo and eval/demo are partitioned by its phases."""

from __future__ import annotations

from assets.datakit.chat import CHAT_SOURCE
from marin_assets.phases.plan import BranchSpec, PhasePlan, PhaseSpec

RUN = "demo"
TRAIN_KEY = f"train/{RUN}"  # a partition per phase (assets/training.py)
CHECKPOINTS_KEY = f"checkpoints/{RUN}"  # a partition per committed checkpoint (assets/checkpoints.py)

DEMO_PLAN = PhasePlan(
    run=RUN,
    first=PhaseSpec(
        name="kestrel",
        warm_start_from=None,
        schedule="wsd",
        mixture={"sotu": 0.3, "shakespeare": 0.2, "spam_assassin": 0.5},
        batch_size=8,
        hardware="cpu",
        token_budget=48 * 512,
        peak_lr=0.003,
    ),
    phase_names=("kestrel", "jellyfish", "phoenix", "starling", "heron", "ibis"),
    high_quality_sources=("sotu", "shakespeare"),
    cooldown_hq_fraction=0.3,
    cooldown_tokens=16 * 512,
    min_cooldown_tokens=4 * 512,
    low_data_tokens=12_288,
    rewarm_mixture={"sotu": 0.5, "shakespeare": 0.5},
    rewarm_tokens=32 * 512,
    # Once the first cooldown is accepted, an SFT branch leaves its checkpoint: the plays' dialogue as chat
    # (datasets/shakespeare_chat), loss on the replies only, at a constant LR below the main run's peak. The main
    # run goes on as it would without it (tests/sensors/test_branch_bytes.py).
    branches=(
        BranchSpec(
            name="sft",
            from_phase="jellyfish",
            token_budget=8 * 512,
            schedule="constant",
            is_cooldown=False,
            mixture={CHAT_SOURCE: 1.0},
            peak_lr=0.001,
        ),
    ),
)
