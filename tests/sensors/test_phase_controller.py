"""The phase controller sensor drives a run through Tootsie-like phases.

The training asset is replaced by a stand-in with the same key, partitions and metadata
contract that "trains" by arithmetic (tokens per source = budget x mix weight), so the
test exercises the real sensor, decision function, budget file and driver in seconds.
The real training asset runs in `make demo`.
"""

import dataclasses
import json

import dagster as dg
import pytest

from assets.partitions import demo_phases as phases
from assets.training import DEMO_PLAN, TRAIN_KEY, PhaseConfig, PhaseSpecConfig
from demo.phases import decision_log, demo_budget, demo_cut, demo_raise, run_phase_demo
from jobs import train_phase_job
from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource, StageConfig, StageContext, versioned, versioned_asset
from marin_assets.phases.budget import load_budget
from marin_assets.phases.plan import PhaseSpec
from sensors.phase_controller import BUDGET_ENV, phase_controller_sensor

CACHE_TOKENS = 1_000_000


class StubPhaseConfig(StageConfig):
    phase: PhaseSpecConfig = versioned(PhaseSpecConfig.of(DEMO_PLAN.first))
    warm_start_version: str = versioned("")
    attempt: int = versioned(0)


@versioned_asset(key=TRAIN_KEY, code_version="stub", config_cls=StubPhaseConfig, partitions_def=phases, group_name="training")
def stub_train(ctx: StageContext, config: StubPhaseConfig):
    spec = config.phase.to_spec()
    before, consumed = 0, {}
    if spec.warm_start_from:
        prev = ctx.store.load(TRAIN_KEY, spec.warm_start_from, config.warm_start_version).counts
        before, consumed = prev["tokens_trained"], dict(prev["tokens_consumed"])
    total = sum(spec.mixture.values())
    for source, weight in spec.mixture.items():
        consumed[source] = consumed.get(source, 0) + int(spec.token_budget * weight / total)
    return {"phase": spec.name, "tokens_trained": before + spec.token_budget, "phase_tokens": spec.token_budget,
            "tokens_consumed": consumed, "tokens_available": {s: CACHE_TOKENS - consumed.get(s, 0) for s in spec.mixture},
            "recent_losses": [3.0, 2.9, 2.95, 2.9, 2.92, 2.91, 2.9, 2.93, 2.9], "last_loss": 2.9, "is_cooldown": spec.is_cooldown}


@versioned_asset(key="eval/demo", code_version="stub", ins={"ckpt": TRAIN_KEY}, partitions_def=phases, group_name="training")
def stub_eval(ctx: StageContext, ckpt):
    return {"evaluated": ckpt.counts["phase"]}


# The factory is what the demo uses too (definitions.py); here it drives the stand-in asset.
phase_controller = phase_controller_sensor(DEMO_PLAN, stub_train, also=[stub_eval])


@pytest.fixture
def defs(tmp_path, monkeypatch):
    monkeypatch.setenv(BUDGET_ENV, str(tmp_path / "budget.yaml"))
    store = ArtifactStoreResource(prefix=str(tmp_path / "prefix"))
    return dg.Definitions(assets=[stub_train, stub_eval], jobs=[train_phase_job], sensors=[phase_controller],
                          resources={"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)})


def test_controller_decides_the_tootsie_sequence(defs, tmp_path):
    instance = dg.DagsterInstance.ephemeral()
    ran_tags = []
    ticks = run_phase_demo(defs, instance, tmp_path / "budget.yaml", demo_budget(), demo_raise, demo_cut, log=lambda _: None,
                           execute=lambda run, tags: (ran_tags.append(tags), run(tags))[1])
    ran = [(t["phase"], t["action"]) for t in ticks if "phase" in t]
    assert ran == [("kestrel", "continue"), ("jellyfish", "cool_down"), ("phoenix", "re_warm"), ("starling", "cool_down")]
    # Every run went through the driver's execute hook (the demo's progress reporter), with the sensor's run key.
    assert [t["marin/phase"] for t in ran_tags] == [p for p, _ in ran]
    assert all(t["dagster/run_key"].startswith(f"{DEMO_PLAN.run}-") for t in ran_tags)
    log = decision_log(instance, dg.AssetKey(TRAIN_KEY.split("/")))
    by_phase = {(d["phase"], d["decision"]): d["reason"] for d in log}
    assert "data running out" in by_phase[("kestrel", "cool_down")]
    assert "30% high-quality" in by_phase[("kestrel", "cool_down")]
    assert "budget raised" in by_phase[("jellyfish", "re_warm")]
    assert "z-loss" in by_phase[("phoenix", "cool_down")]
    assert ("starling", "stop") in by_phase
    # Every phase's config hashes as the JSON text it had when it was a string, so no phase's
    # version changed when PhaseConfig.phase became a nested config.
    runs = [r for r in instance.get_runs() if "train__demo" in r.run_config.get("ops", {})]
    assert len(runs) == len(ran)
    for run in runs:
        phase = run.run_config["ops"]["train__demo"]["config"]["phase"]
        old_text = json.dumps(dataclasses.asdict(PhaseSpec(**phase)), sort_keys=True)
        assert PhaseConfig(phase=PhaseSpecConfig(**phase)).versioned_fields()["phase"] == old_text
    # Starling's cooldown is as long as the cut budget allows, with z-loss on.
    run = instance.get_runs(dg.RunsFilter(tags={"marin/phase": "starling"}))[0]
    starling = PhaseSpec(**run.run_config["ops"]["train__demo"]["config"]["phase"])
    assert starling.is_cooldown and starling.z_loss == DEMO_PLAN.late_cooldown_z_loss
    # The stand-in ends before a mid-phase cut can land; cut after it, the 16 steps left are the planned cooldown.
    assert starling.token_budget == DEMO_PLAN.cooldown_tokens == 16 * 512


def test_replayed_tick_requests_the_same_run_and_waits(defs, tmp_path):
    from marin_assets.phases.budget import write_budget

    write_budget(tmp_path / "budget.yaml", demo_budget())
    instance = dg.DagsterInstance.ephemeral()
    first = phase_controller(dg.build_sensor_context(instance=instance, definitions=defs))
    again = phase_controller(dg.build_sensor_context(instance=instance, definitions=defs))
    assert [r.run_key for r in first.run_requests] == [r.run_key for r in again.run_requests]  # same key: runs once
    waiting = phase_controller(dg.build_sensor_context(instance=instance, cursor=first.cursor, definitions=defs))
    assert isinstance(waiting, dg.SkipReason) and "waiting for phase kestrel" in waiting.skip_message


def test_nightly_eval_schedule_requests_every_phase_and_is_off_by_default():
    from datetime import datetime, timezone

    from sensors.schedules import nightly_evals

    assert nightly_evals.default_status == dg.DefaultScheduleStatus.STOPPED
    when = datetime(2026, 11, 29, 3, tzinfo=timezone.utc)
    with dg.instance_for_test() as instance:
        empty = nightly_evals(dg.build_schedule_context(instance=instance, scheduled_execution_time=when))
        assert isinstance(empty, dg.SkipReason)
        instance.add_dynamic_partitions(phases.name, ["kestrel", "jellyfish"])
        requests = nightly_evals(dg.build_schedule_context(instance=instance, scheduled_execution_time=when))
    assert sorted((r.partition_key, r.run_key) for r in requests) == [("jellyfish", "eval-jellyfish-2026-11-29"), ("kestrel", "eval-kestrel-2026-11-29")]


def test_the_factory_takes_op_and_partitions_from_the_asset(tmp_path, monkeypatch):
    """Another run's asset (another key, its own partition set) gets requests for its own op."""
    from marin_assets.phases.budget import write_budget

    other_phases = dg.DynamicPartitionsDefinition(name="other_phases")

    @versioned_asset(key="train/other", code_version="stub", config_cls=StubPhaseConfig, partitions_def=other_phases)
    def other_train(ctx: StageContext, config: StubPhaseConfig):
        return {}

    monkeypatch.setenv(BUDGET_ENV, str(tmp_path / "budget.yaml"))
    write_budget(tmp_path / "budget.yaml", demo_budget())
    sensor = phase_controller_sensor(DEMO_PLAN, other_train, name="other_controller")
    result = sensor(dg.build_sensor_context(instance=dg.DagsterInstance.ephemeral()))
    (request,) = result.run_requests
    assert sensor.name == "other_controller" and list(request.run_config["ops"]) == ["train__other"]
    assert PhaseSpec(**request.run_config["ops"]["train__other"]["config"]["phase"]) == DEMO_PLAN.first
    assert result.dynamic_partitions_requests[0].partitions_def_name == "other_phases"

    @versioned_asset(key="train/static", code_version="stub", partitions_def=dg.StaticPartitionsDefinition(["a"]))
    def static_train(ctx: StageContext):
        return {}

    with pytest.raises(ValueError, match="train/static must be partitioned by a DynamicPartitionsDefinition"):
        phase_controller_sensor(DEMO_PLAN, static_train)
