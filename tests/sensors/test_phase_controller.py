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
from assets.train_base import PhaseSpecConfig
from assets.training import DEMO_PLAN, TRAIN_KEY, PhaseConfig
from demo.phases import decision_log, demo_budget, demo_cut, demo_raise, run_phase_demo
from jobs import train_phase_job
from marin_assets.orchestration import (
    ArtifactIOManager,
    ArtifactStoreResource,
    StageConfig,
    StageContext,
    versioned,
    versioned_asset,
)
from marin_assets.phases.controller import ControllerState
from marin_assets.phases.job import phase_spec
from marin_assets.phases.plan import LAYOUT_FIELDS, RECORDED_WHEN_SET, ArchitectureSwitch, PhasePlan, PhaseSpec
from marin_assets.train.budget import BUDGET_ENV
from sensors.phase_controller import phase_controller_sensor

CACHE_TOKENS = 1_000_000


class StubPhaseConfig(StageConfig):
    phase: PhaseSpecConfig = versioned(PhaseSpecConfig.of(DEMO_PLAN.first))
    warm_start_version: str = versioned("")
    attempt: int = versioned(0)


@versioned_asset(key=TRAIN_KEY, code_version="stub", config_cls=StubPhaseConfig, partitions_def=phases, group_name="training")
def stub_train(ctx: StageContext, config: StubPhaseConfig):
    spec = phase_spec(config.phase.model_dump())
    before, consumed = 0, {}
    if spec.warm_start_from:
        prev = ctx.store.load(TRAIN_KEY, spec.warm_start_from, config.warm_start_version).counts
        before, consumed = prev["tokens_trained"], dict(prev["tokens_consumed"])
    total = sum(spec.mixture.values())
    for source, weight in spec.mixture.items():
        consumed[source] = consumed.get(source, 0) + int(spec.token_budget * weight / total)
    return {
        "phase": spec.name,
        "tokens_trained": before + spec.token_budget,
        "phase_tokens": spec.token_budget,
        "tokens_consumed": consumed,
        "tokens_available": {s: CACHE_TOKENS - consumed.get(s, 0) for s in spec.mixture},
        "recent_losses": [3.0, 2.9, 2.95, 2.9, 2.92, 2.91, 2.9, 2.93, 2.9],
        "last_loss": 2.9,
        "is_cooldown": spec.is_cooldown,
    }


@versioned_asset(key="eval/demo", code_version="stub", ins={"ckpt": TRAIN_KEY}, partitions_def=phases, group_name="training")
def stub_eval(ctx: StageContext, ckpt):
    return {"evaluated": ckpt.counts["phase"]}


# The factory is what the demo uses too (definitions.py); here it drives the stand-in asset.
phase_controller = phase_controller_sensor(DEMO_PLAN, stub_train, also=[stub_eval])


@pytest.fixture
def defs(tmp_path, monkeypatch):
    monkeypatch.setenv(BUDGET_ENV, str(tmp_path / "budget.yaml"))
    store = ArtifactStoreResource(prefix=str(tmp_path / "prefix"))
    return dg.Definitions(
        assets=[stub_train, stub_eval],
        jobs=[train_phase_job],
        sensors=[phase_controller],
        resources={"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)},
    )


def test_controller_decides_the_tootsie_sequence(defs, tmp_path):
    instance = dg.DagsterInstance.ephemeral()
    ran_tags = []
    ticks = run_phase_demo(
        defs,
        instance,
        tmp_path / "budget.yaml",
        demo_budget(),
        demo_raise,
        demo_cut,
        log=lambda _: None,
        execute=lambda run, tags: (ran_tags.append(tags), run(tags))[1],
    )
    ran = [(t["phase"], t["action"]) for t in ticks if "phase" in t]
    # (the plan's SFT and long-context branches leave once Jellyfish is accepted: the tick that re-warms the main run)
    assert ran == [
        ("kestrel", "continue"),
        ("jellyfish", "cool_down"),
        ("jellyfish+sft", "branch"),
        ("jellyfish+long", "branch"),
        ("phoenix", "re_warm"),
        ("starling", "cool_down"),
    ]
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
        if any(phase.get(k) is not None for k in RECORDED_WHEN_SET):
            continue  # the long-context branch: a phase with seq_len set had no text before that field
        # (the architecture fields and seq_len came later still: unset, they stay out of the text; a layout never counts)
        dropped = (*RECORDED_WHEN_SET, *LAYOUT_FIELDS)
        before = {k: v for k, v in dataclasses.asdict(PhaseSpec(**phase)).items() if k not in dropped}
        old_text = json.dumps(before, sort_keys=True)
        assert PhaseConfig(phase=PhaseSpecConfig(**phase)).versioned_fields()["phase"] == old_text
    # Starling's cooldown is as long as the cut budget allows, with z-loss on.
    run = instance.get_runs(dg.RunsFilter(tags={"marin/phase": "starling"}))[0]
    starling = PhaseSpec(**run.run_config["ops"]["train__demo"]["config"]["phase"])
    assert starling.is_cooldown and starling.z_loss == DEMO_PLAN.late_cooldown_z_loss
    # The stand-in ends before a mid-phase cut can land; cut after it, the 16 steps left are the planned cooldown.
    assert starling.token_budget == DEMO_PLAN.cooldown_tokens == 16 * 512


def test_replayed_tick_requests_the_same_run_and_waits(defs, tmp_path):
    from marin_assets.train.budget import write_budget

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
    assert sorted((r.partition_key, r.run_key) for r in requests) == [
        ("jellyfish", "eval-jellyfish-2026-11-29"),
        ("kestrel", "eval-kestrel-2026-11-29"),
    ]


def test_the_factory_takes_op_and_partitions_from_the_asset(tmp_path, monkeypatch):
    """Another run's asset (another key, its own partition set) gets requests for its own op."""
    from marin_assets.train.budget import write_budget

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


def test_phase_run_tags_size_the_backend_and_carry_the_retry_policy():
    from marin_assets.phases.controller import phase_run_tags
    from marin_assets.phases.plan import PhaseSpec

    spec = PhaseSpec(
        name="ocelot",
        warm_start_from="kestrel",
        schedule="wsd",
        mixture={"web": 1.0},
        batch_size=8,
        hardware="tpu-v5p",
        token_budget=4096,
        peak_lr=1e-3,
    )
    tags = phase_run_tags(spec, "migrate", {"tpu-v5p": 16}, {"dagster/max_retries": "2", "marin/phase": "spoofed"})
    assert tags == {
        "dagster/max_retries": "2",
        "marin/phase": "ocelot",
        "marin/action": "migrate",
        "marin/accelerator": "tpu-v5p",
        "marin/chips": "16",
        "marin/priority": "production",
    }
    # Hardware the sensor was not told the size of gets no chips tag (the launcher's default).
    assert "marin/chips" not in phase_run_tags(spec, "migrate", {"gb200-nvl72": 72}, {})


# ---- switch_architecture: roll-backs that do not cure a spike end in a transplant ----------------

switch_phases = dg.DynamicPartitionsDefinition(name="switch_phases")
SWITCH_PLAN = PhasePlan(
    run="sw",
    first=PhaseSpec(
        name="kestrel",
        warm_start_from=None,
        schedule="wsd",
        mixture={"web": 1.0},
        batch_size=8,
        hardware="cpu",
        token_budget=1000,
        peak_lr=1e-3,
    ),
    phase_names=("kestrel", "ocelot", "jellyfish", "phoenix"),
    cooldown_tokens=500,
    min_cooldown_tokens=100,
    architecture_switch=ArchitectureSwitch(mapping="qk_norm", model_changes={"qk_norm": True}, after_rollbacks=2),
)


@versioned_asset(key="train/sw", code_version="stub", config_cls=StubPhaseConfig, partitions_def=switch_phases)
def spiking_train(ctx: StageContext, config: StubPhaseConfig):
    """Every phase after the first spikes at its last step, unless it was transplanted into the new architecture."""
    spec = phase_spec(config.phase.model_dump())
    before = (
        ctx.store.load("train/sw", spec.warm_start_from, config.warm_start_version).counts["tokens_trained"]
        if spec.warm_start_from
        else 0
    )
    spikes = spec.warm_start_from is not None and spec.transplant is None
    losses = [2.9 + 0.01 * (i % 3) for i in range(12)] + ([50.0] if spikes else [])
    return {
        "phase": spec.name,
        "tokens_trained": before + spec.token_budget,
        "phase_tokens": spec.token_budget,
        "tokens_consumed": {"web": before + spec.token_budget},
        "tokens_available": {"web": CACHE_TOKENS},
        "recent_losses": losses,
        "last_loss": losses[-1],
        "is_cooldown": spec.is_cooldown,
    }


def test_roll_backs_that_do_not_cure_a_spike_switch_the_architecture_once(tmp_path):
    from marin_assets.train.budget import Budget, write_budget

    write_budget(tmp_path / "budget.yaml", Budget(budget_tokens=1500))
    store = ArtifactStoreResource(prefix=str(tmp_path / "prefix"))
    job = dg.define_asset_job("sw_phase", selection=[spiking_train])
    defs = dg.Definitions(
        assets=[spiking_train],
        jobs=[job],
        resources={"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)},
    )
    sensor = phase_controller_sensor(
        SWITCH_PLAN, spiking_train, name="sw_controller", budget_file=lambda: tmp_path / "budget.yaml"
    )
    instance, cursor, ran, versions = dg.DagsterInstance.ephemeral(), None, [], {}
    for _ in range(8):
        result = sensor(dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs))
        cursor = result.cursor or cursor
        if not result.run_requests:
            break
        (request,) = result.run_requests
        instance.add_dynamic_partitions(switch_phases.name, [request.partition_key])
        done = defs.resolve_job_def("sw_phase").execute_in_process(
            run_config=request.run_config,
            partition_key=request.partition_key,
            instance=instance,
            tags={**request.tags, "dagster/run_key": request.run_key},
        )
        [event] = done.get_asset_materialization_events()
        versions[request.partition_key] = event.materialization.metadata["version"].value
        ran.append((request.partition_key, request.tags["marin/action"], request.run_config["ops"]["train__sw"]["config"]))
    assert [(phase, action) for phase, action, _ in ran] == [
        ("kestrel", "continue"),
        ("ocelot", "cool_down"),
        ("ocelot", "roll_back"),
        ("ocelot", "roll_back"),
        ("jellyfish", "switch_architecture"),
    ]
    switched = ran[-1][2]
    # the switch starts where ocelot's roll-backs did: kestrel's checkpoint (its version), carried over by qk_norm
    assert switched["warm_start_version"] == versions["kestrel"] == ran[2][2]["warm_start_version"]
    assert switched["attempt"] == 0 and switched["phase"]["warm_start_from"] == "kestrel"
    assert switched["phase"]["transplant"] == "qk_norm" and switched["phase"]["model_changes"] == {"qk_norm": True}
    # jellyfish trained on and the budget is spent
    assert result.skip_reason.skip_message.startswith("stop: budget spent: 1,500 of 1,500 tokens")
    phases = ControllerState.from_json(cursor).phases
    assert [p.spec.name for p in phases] == ["kestrel", "jellyfish"] and phases[-1].replaces == ("ocelot",)
    assert phases[-1].tokens_before == 1000
    log = {(d["phase"], d["decision"]): d["reason"] for d in decision_log(instance, spiking_train.key)}
    reason = log[("ocelot", "switch_architecture")]
    assert "2 roll-back(s) of ocelot did not cure it: switch to the qk_norm architecture" in reason
