"""A budget cut written mid-phase ends that phase at its next checkpoint; the successor starts there.

End to end on a tiny real model: the phase controller sensor, the demo driver's mid-phase
cut (the person writes the cut at the phase's 4th step, the daemon ticks on a watcher thread),
the routing launcher's local terminate (SIGTERM to the run's process), the trainer's
SIGTERM checkpoint, and the warm start of the decided successor.
"""

import dataclasses
import os
import shutil
import time
from pathlib import Path

import dagster as dg
import pytest

from assets.train_base import PhaseSpecConfig
from demo.phases import decision_log, run_phase_demo
from marin_assets.orchestration import (
    ArtifactIOManager,
    ArtifactStoreResource,
    StageConfig,
    StageContext,
    versioned,
    versioned_asset,
)
from marin_assets.phases.plan import PhasePlan, PhaseSpec, phase_telemetry_run, phase_train_config
from marin_assets.telemetry import TelemetryStore
from marin_assets.train.budget import BUDGET_ENV, Budget
from marin_assets.train.metrics import read_metrics
from sensors.phase_controller import phase_controller_sensor

pytestmark = pytest.mark.slow  # a trainer in a subprocess, cut by SIGTERM mid-phase

TOKENS_PER_STEP = 4 * 32  # the tiny config: batch 4 x seq 32
CHECKPOINT_EVERY = 8
KEY = "train/wc"
PHASES = dg.DynamicPartitionsDefinition(name="wc_test_phases")
PLAN = PhasePlan(
    run="wc",
    first=PhaseSpec(
        name="kestrel",
        warm_start_from=None,
        schedule="wsd",
        mixture={"license": 0.5, "docs": 0.5},
        batch_size=4,
        hardware="cpu",
        token_budget=48 * TOKENS_PER_STEP,
        peak_lr=3e-3,
    ),
    phase_names=("kestrel", "starling"),
    high_quality_sources=("docs",),
    cooldown_tokens=8 * TOKENS_PER_STEP,
    min_cooldown_tokens=2 * TOKENS_PER_STEP,
)


class WcPhaseConfig(StageConfig):
    phase: PhaseSpecConfig = versioned(PhaseSpecConfig.of(PLAN.first))  # the train asset's own phase config
    warm_start_version: str = versioned("")
    attempt: int = versioned(0)


def make_asset(tiny_config, caches):
    @versioned_asset(key=KEY, code_version="wc", config_cls=WcPhaseConfig, partitions_def=PHASES, group_name="training")
    def wc_train(ctx: StageContext, config: WcPhaseConfig):
        from marin_assets.train.loop import train

        spec = PhaseSpec(**config.phase.model_dump())
        train_config = dataclasses.replace(phase_train_config(tiny_config, spec), checkpoint_every_steps=CHECKPOINT_EVERY)
        warm = ctx.store.load(KEY, spec.warm_start_from, config.warm_start_version).data_path if spec.warm_start_from else None
        # ~0.1 s a step, so the person and the controller get a few ticks inside the phase
        result = train(
            train_config,
            {s: caches[s] for s in spec.mixture},
            ctx.scratch_dir,
            warm_start=warm,
            log_fn=lambda row: time.sleep(0.1),
            telemetry_run=phase_telemetry_run(PLAN.run, spec.name),
        )
        for name in os.listdir(ctx.scratch_dir):
            shutil.move(os.path.join(ctx.scratch_dir, name), os.path.join(ctx.out_dir, name))
        rows = read_metrics(Path(ctx.out_dir, "metrics.jsonl"))
        return {
            "phase": spec.name,
            "final_step": result.final_step,
            "first_step": rows[0]["step"],
            "tokens_trained": result.tokens,
            "stopped_by": result.stopped_by or "",
            "phase_tokens": (result.final_step - result.phase_start_step) * TOKENS_PER_STEP,
            "recent_losses": [r["loss"] for r in rows][-32:],
            "last_loss": result.last_loss,
            "tokens_consumed": {},
            "tokens_available": {s: 10**9 for s in spec.mixture},
            "checkpoint": Path(result.checkpoint_dir).name,
        }

    return wc_train


def test_cut_mid_phase_ends_it_at_a_checkpoint_and_the_successor_starts_after_it(caches, tiny_config, tmp_path, monkeypatch):
    monkeypatch.setenv("MARIN_PREFIX", str(tmp_path / "prefix"))
    monkeypatch.setenv(BUDGET_ENV, str(tmp_path / "budget.yaml"))
    asset = make_asset(tiny_config, caches)
    store = ArtifactStoreResource(prefix=str(tmp_path / "prefix"))
    defs = dg.Definitions(
        assets=[asset],
        jobs=[dg.define_asset_job("train_phase", selection=[asset])],
        sensors=[phase_controller_sensor(PLAN, asset, name="wc_controller")],
        resources={"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)},
    )
    routing = {
        "module": "marin_assets.orchestration.launcher",
        "class": "RoutingRunLauncher",
        "config": {"local": {"accelerators": ["cpu"]}, "unmatched": "local"},
    }
    lines = []
    with dg.instance_for_test(overrides={"run_launcher": routing}) as instance:
        ticks = run_phase_demo(
            defs,
            instance,
            tmp_path / "budget.yaml",
            Budget(budget_tokens=10**6),
            lambda b, t: b,  # no raise: the run ends when the cut budget is spent
            lambda b, tokens: dataclasses.replace(b, budget_tokens=tokens + 16 * TOKENS_PER_STEP),
            sensor_name="wc_controller",
            log=lines.append,
            cut_during="continue",
            cut_after_steps=4,
        )
        log = decision_log(instance, dg.AssetKey(["train", "wc"]))
        mats = {
            r.event_log_entry.asset_materialization.partition: r.event_log_entry.asset_materialization.metadata
            for r in instance.fetch_materializations(dg.AssetKey(["train", "wc"]), limit=10).records
        }

    ran = [t for t in ticks if "phase" in t]
    assert [(t["phase"], t["action"]) for t in ran] == [("kestrel", "continue"), ("starling", "cool_down")]
    kestrel, starling = ran
    cut_step, end_step = kestrel["cut_step"], kestrel["final_step"]
    assert cut_step == 4  # the person acts at a step, not a moment
    assert kestrel["reaction"].startswith("end_phase: budget cut at step ")
    # ended at the SIGTERM checkpoint, within one checkpoint interval of the cut, long before its 48 steps
    assert mats["kestrel"]["count/stopped_by"].value == "SIGTERM"
    assert mats["kestrel"]["count/checkpoint"].value == f"step-{end_step:09d}"
    assert cut_step < end_step <= cut_step + CHECKPOINT_EVERY and end_step < 48
    # the successor warm-starts from that checkpoint: its first step is the checkpoint's step + 1
    assert mats["starling"]["count/first_step"].value == end_step + 1
    assert mats["starling"]["count/stopped_by"].value == ""
    # decided by the cut, at the step of the cut, and the reason says so
    reasons = {(d["phase"], d["decision"]): d["reason"] for d in log}
    assert reasons[("kestrel", "end_phase")].endswith("ending it at its next checkpoint")
    why = reasons[("kestrel", "cool_down")]
    assert why.startswith(f"budget cut: kestrel ended early at step {end_step} (budget cut at step ")
    assert ("starling", "stop") in reasons
    # the live telemetry holds both phases, kestrel up to its checkpoint
    frame = TelemetryStore(str(tmp_path / "prefix" / "telemetry")).query(run="wc-kestrel", metric="loss", latest=True)
    assert frame["step"].max() == end_step
    print(f"cut seen at step {cut_step}, kestrel stopped at step {end_step} ({end_step - cut_step} steps later)")
