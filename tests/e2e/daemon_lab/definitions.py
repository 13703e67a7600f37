"""The code location of the daemon test (tests/e2e/test_daemon_drives_the_lab.py): a run of a tiny real
model, decided by the phase controller the code location builds for the demo (the same factory), the
phase's evaluation in the same run, the user-shards sensor over the DataKit's sharded graph of a watched
folder, and the nightly evaluation schedule, ticking every minute here.

Kestrel trains 8 steps of 4 x 32 tokens; the budget file (written by the test) leaves 4 more, which the
controller spends on a cooldown (Starling), then stops. When a person raises the budget by 4 steps, the
controller re-warms (Phoenix) on the users' data: datasets/user, as the user-shards sensor last built it
from the files in $MARIN_USER_DATA_DIR. Each step sleeps a little so a phase is still running when the
test kills the daemon. The fixed caches' paths come from the test in ``DAEMON_LAB_CACHES``.
"""

from __future__ import annotations

import json
import os
import shutil
import time

import dagster as dg

from assets.datakit import make_datakit_graph
from assets.datakit.datasets import dataset_key
from assets.datakit.sources import watched_source
from assets.train_base import PhaseSpecConfig
from marin_assets.datakit.datasets import INDEX_FILE, read_dataset
from marin_assets.orchestration import (
    ArtifactIOManager,
    ArtifactStoreResource,
    StageConfig,
    StageContext,
    versioned,
    versioned_asset,
)
from marin_assets.phases.job import phase_spec
from marin_assets.phases.plan import PhasePlan, PhaseSpec, phase_telemetry_run, phase_train_config
from marin_assets.train.budget import BudgetStop
from sensors.phase_controller import phase_controller_sensor
from sensors.schedules import nightly_evals_schedule
from sensors.user_shards import user_shards_sensor
from tests.assets.test_shard_assets import eval_ngrams, quality_model, tokenizer
from tests.support.configs import PHASE_BASE

CACHES_ENV = "DAEMON_LAB_CACHES"
STEP_SLEEP_S = 0.3
TOKENS_PER_STEP = PHASE_BASE["batch_size"] * PHASE_BASE["seq_len"]
TRAIN_KEY, EVAL_KEY = "train/lab", "eval/lab"
USER = "user"  # the watched folder's source; its dataset is what Phoenix trains on
FIXED_CACHE_TOKENS = 10**9  # the fixed caches never run out here: no data-driven decision
PHASES = dg.DynamicPartitionsDefinition(name="lab_phases")
PLAN = PhasePlan(
    run="lab",
    first=PhaseSpec(
        name="kestrel",
        warm_start_from=None,
        schedule="wsd",
        mixture={"license": 0.5, "docs": 0.5},
        batch_size=PHASE_BASE["batch_size"],
        hardware="cpu",
        token_budget=8 * TOKENS_PER_STEP,
        peak_lr=3e-3,
    ),
    phase_names=("kestrel", "starling", "phoenix"),
    high_quality_sources=("docs",),
    cooldown_tokens=4 * TOKENS_PER_STEP,
    min_cooldown_tokens=2 * TOKENS_PER_STEP,
    rewarm_mixture={USER: 1.0},
    rewarm_tokens=4 * TOKENS_PER_STEP,
)
# The DataKit over the watched folder: the fixed inputs (stand-ins the test materialises first), the
# sharded steps, and the sensor that turns new files into shard partitions and backfills them.
user_source = watched_source(USER)
user_index, *user_steps = make_datakit_graph({USER: f"sources/{USER}"})
new_user_shards = user_shards_sensor(user_source, user_index, user_steps, minimum_interval_seconds=1)
DATAKIT_INPUTS = [quality_model, eval_ngrams, tokenizer]


class LabPhaseConfig(StageConfig):
    phase: PhaseSpecConfig = versioned(PhaseSpecConfig.of(PLAN.first))
    warm_start_version: str = versioned("")
    attempt: int = versioned(0)
    budget_file: str = ""


@versioned_asset(key=TRAIN_KEY, code_version="1", config_cls=LabPhaseConfig, partitions_def=PHASES, group_name="training")
def lab_train(ctx: StageContext, config: LabPhaseConfig):
    from marin_assets.train.config import config_from_dict
    from marin_assets.train.loop import train

    spec = phase_spec(config.phase.model_dump())
    fixed = json.loads(os.environ[CACHES_ENV])
    user = ctx.store.read_pointer(dataset_key(USER), None)  # the newest datasets/user, if any
    caches = {**fixed, **({USER: os.path.join(user.data_path, INDEX_FILE)} if user else {})}
    warm = ctx.store.load(TRAIN_KEY, spec.warm_start_from, config.warm_start_version).data_path if spec.warm_start_from else None
    result = train(
        phase_train_config(config_from_dict(PHASE_BASE), spec),
        {s: caches[s] for s in spec.mixture},
        ctx.scratch_dir,
        warm_start=warm,
        log_fn=lambda row: time.sleep(STEP_SLEEP_S),
        telemetry_run=phase_telemetry_run(PLAN.run, spec.name),
        stop_check=BudgetStop(config.budget_file) if config.budget_file else None,
    )
    for name in os.listdir(ctx.scratch_dir):
        shutil.move(os.path.join(ctx.scratch_dir, name), os.path.join(ctx.out_dir, name))
    phase_tokens = (result.final_step - result.phase_start_step) * TOKENS_PER_STEP
    return {
        "phase": spec.name,
        "final_step": result.final_step,
        "tokens_trained": result.tokens,
        "phase_tokens": phase_tokens,
        "stopped_by": result.stopped_by or "",
        "last_loss": result.last_loss,
        "recent_losses": [result.last_loss] * 8,
        "tokens_consumed": {},
        # Every source there is, not only the phase's: the controller re-warms onto a source the phase did not train on.
        "tokens_available": {
            **{s: FIXED_CACHE_TOKENS for s in fixed},
            **({USER: user.counts["train_tokens"]} if user else {}),
            **{s: left for s, left in result.tokens_left.items() if s not in fixed},
        },
        "user_shards": [s.key for s in read_dataset(caches[USER]).shards] if USER in spec.mixture else [],
    }


@versioned_asset(key=EVAL_KEY, code_version="1", ins={"ckpt": TRAIN_KEY}, partitions_def=PHASES, group_name="training")
def lab_eval(ctx: StageContext, ckpt):
    """The phase's final step (its result file) and loss (its metrics), read from the trained artifact."""
    from marin_assets.train.metrics import read_metrics

    with open(os.path.join(ckpt.data_path, "train_result.json")) as f:
        final_step = json.load(f)["final_step"]
    last = read_metrics(os.path.join(ckpt.data_path, "metrics.jsonl"))[-1]
    return {"phase": ckpt.counts["phase"], "final_step": final_step, "last_loss": last["loss"], "step": last["step"]}


lab_controller = phase_controller_sensor(
    PLAN,
    lab_train,
    also=[lab_eval],
    name="lab_controller",
    minimum_interval_seconds=1,
    trainer_checks_budget=True,
    datasets={USER: dataset_key(USER)},  # the users' data, as the sensor last built it, at each decision
)
lab_evals = dg.define_asset_job(
    "lab_evals", selection=[lab_eval], partitions_def=PHASES, tags={"marin/accelerator": "cpu", "marin/priority": "batch"}
)
lab_nightly = nightly_evals_schedule(lab_evals, PHASES, name="lab_nightly", cron="* * * * *")

store = ArtifactStoreResource()
defs = dg.Definitions(
    assets=[lab_train, lab_eval, user_source, *DATAKIT_INPUTS, user_index, *user_steps],
    jobs=[lab_evals],
    sensors=[lab_controller, new_user_shards],
    schedules=[lab_nightly],
    resources={"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)},
)
