"""The demo's story does not depend on the machine's load: the person cuts the budget at a training step
(a hook of the running phase) and the trainer ends the phase at its next permanent checkpoint, so an idle
and a saturated machine see the same phases, decisions and tokens.

End to end on a tiny real model: the phase controller sensor (the trainer checks the budget), the demo
driver with its watcher thread ticking the sensor during the run, the asset handing the run config's
budget file to ``train``; once idle, once with a busy loop on every core."""

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from demo.phases import decision_log, run_phase_demo
from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource, StageContext, versioned_asset
from marin_assets.phases.plan import PhaseSpec, phase_telemetry_run, phase_train_config
from marin_assets.train.budget import BUDGET_ENV, Budget, BudgetStop
from tests.train.test_sigterm_phase_controller import PLAN, TOKENS_PER_STEP, WcPhaseConfig

pytestmark = pytest.mark.slow  # two phase demos of a real trainer, one beside a busy loop per core

CHECKPOINT_EVERY = 8
KEY = "train/wcb"
PHASES = dg.DynamicPartitionsDefinition(name="wcb_test_phases")


class BudgetedPhaseConfig(WcPhaseConfig):
    budget_file: str = ""


def make_asset(tiny_config, caches):
    @versioned_asset(key=KEY, code_version="wcb", config_cls=BudgetedPhaseConfig, partitions_def=PHASES, group_name="training")
    def wcb_train(ctx: StageContext, config: BudgetedPhaseConfig):
        from marin_assets.train.loop import train

        spec = PhaseSpec(**config.phase.model_dump())
        train_config = dataclasses.replace(phase_train_config(tiny_config, spec), checkpoint_every_steps=CHECKPOINT_EVERY)
        warm = ctx.store.load(KEY, spec.warm_start_from, config.warm_start_version).data_path if spec.warm_start_from else None
        result = train(
            train_config,
            {s: caches[s] for s in spec.mixture},
            ctx.scratch_dir,
            warm_start=warm,
            telemetry_run=phase_telemetry_run(PLAN.run, spec.name),
            stop_check=BudgetStop(config.budget_file) if config.budget_file else None,
        )
        for name in os.listdir(ctx.scratch_dir):
            shutil.move(os.path.join(ctx.scratch_dir, name), os.path.join(ctx.out_dir, name))
        return {
            "phase": spec.name,
            "final_step": result.final_step,
            "tokens_trained": result.tokens,
            "stopped_by": result.stopped_by or "",
            "recent_losses": [3.0] * 8,
            "last_loss": result.last_loss,
            "phase_tokens": (result.final_step - result.phase_start_step) * TOKENS_PER_STEP,
            "tokens_consumed": {},
            "tokens_available": {s: 10**9 for s in spec.mixture},
        }

    return wcb_train


def _story(asset, root: Path, monkeypatch) -> tuple[list, list]:
    """One fresh demo of the run: (phases run as (phase, action, final step, tokens, cut step), decisions)."""
    from sensors.phase_controller import phase_controller_sensor

    root.mkdir()
    monkeypatch.setenv("MARIN_PREFIX", str(root / "prefix"))
    monkeypatch.setenv(BUDGET_ENV, str(root / "budget.yaml"))
    store = ArtifactStoreResource(prefix=str(root / "prefix"))
    sensor = phase_controller_sensor(PLAN, asset, name="wcb_controller", trainer_checks_budget=True)
    defs = dg.Definitions(
        assets=[asset],
        jobs=[dg.define_asset_job("train_phase", selection=[asset])],
        sensors=[sensor],
        resources={"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)},
    )
    with dg.instance_for_test() as instance:
        ticks = run_phase_demo(
            defs,
            instance,
            root / "budget.yaml",
            Budget(budget_tokens=10**6),
            lambda b, t: b,
            lambda b, tokens: dataclasses.replace(b, budget_tokens=tokens + 12 * TOKENS_PER_STEP),
            sensor_name="wcb_controller",
            log=lambda _: None,
            cut_during="continue",
            cut_after_steps=4,
        )
        decisions = [(d["phase"], d["decision"], d["reason"]) for d in decision_log(instance, dg.AssetKey(KEY.split("/")))]
    ran = [(t["phase"], t["action"], t["final_step"], t["tokens_trained"], t.get("cut_step")) for t in ticks if "phase" in t]
    return ran, decisions


def test_a_busy_machine_tells_the_same_story_as_an_idle_one(caches, tiny_config, tmp_path, monkeypatch):
    asset = make_asset(tiny_config, caches)
    idle = _story(asset, tmp_path / "idle", monkeypatch)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        busy = _story(asset, tmp_path / "busy", monkeypatch)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert busy == idle
    ran, decisions = idle
    # Cut after kestrel's 4th step to 12 more steps: its check at step 8 (one checkpoint interval later at most)
    # finds 8 steps of budget for 40 left, ends kestrel there; starling cools down in those 8; the run stops.
    assert ran == [("kestrel", "continue", 8, 8 * TOKENS_PER_STEP, 4), ("starling", "cool_down", 16, 16 * TOKENS_PER_STEP, None)]
    reasons = {(phase, action): reason for phase, action, reason in decisions}
    assert reasons[("kestrel", "cool_down")].startswith(
        f"budget cut: kestrel ended early at step 8 (budget cut at step 8 to {16 * TOKENS_PER_STEP:,} tokens: "
        f"{8 * TOKENS_PER_STEP:,} left but kestrel needs {40 * TOKENS_PER_STEP:,} more)"
    )
    assert ("starling", "stop") in reasons
    # the controller left the cut to the trainer: no end_phase of its own
    assert not any(action == "end_phase" for _, action, _ in decisions)
