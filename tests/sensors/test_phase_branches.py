"""Branches off the main run: a phase that leaves from one of its checkpoints (an early cooldown, an SFT-like
phase on another mix) runs as a partition of its own and leaves the main run as it was.

The stand-in train asset of test_phase_controller.py "trains" by arithmetic, so these drive the real sensor,
decision function, budget file and driver in seconds; test_branch_bytes.py trains for real.
"""

import dataclasses

import dagster as dg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from assets.partitions import demo_phases as phases
from assets.training import DEMO_PLAN, TRAIN_KEY
from demo.phases import decision_log, demo_budget, demo_raise
from jobs import train_phase_job
from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource, StageContext, versioned_asset
from marin_assets.phases.branches import branch_phase, is_branch_partition
from marin_assets.phases.controller import ControllerState, PhaseEntry
from marin_assets.phases.job import phase_spec
from marin_assets.phases.plan import BranchSpec, PhasePlan, PhaseSpec
from marin_assets.train.budget import BUDGET_ENV, load_budget, write_budget
from sensors.phase_controller import phase_controller_sensor
from tests.sensors.test_phase_controller import (
    CACHE_TOKENS,
    SWITCH_PLAN,
    StubPhaseConfig,
    spiking_train,
    stub_eval,
    stub_train,
    switch_phases,
)

EARLY_COOLDOWN = BranchSpec(name="early_cooldown", from_phase="kestrel", token_budget=8 * 512)
SFT = BranchSpec(
    name="sft",
    from_phase="phoenix",
    token_budget=4 * 512,
    schedule="constant",
    is_cooldown=False,
    mixture={"shakespeare": 1.0},
    peak_lr=1e-3,
)
PLAIN_PLAN = dataclasses.replace(DEMO_PLAN, branches=())  # the demo's plan without its SFT branch
BRANCHED_PLAN = dataclasses.replace(DEMO_PLAN, branches=(EARLY_COOLDOWN, SFT))
TRAIN = dg.AssetKey(TRAIN_KEY.split("/"))


def _run_demo(tmp_path, plan: PhasePlan) -> tuple[dg.DagsterInstance, list[dg.RunRequest]]:
    """The demo's Tootsie run under ``plan``, in its own instance and store: the user raises the budget once,
    when the main run first stops, by ``demo_raise`` of the tokens its newest phase trained."""
    tmp_path.mkdir()
    budget = tmp_path / "budget.yaml"
    write_budget(budget, demo_budget())
    store = ArtifactStoreResource(prefix=str(tmp_path / "prefix"))
    sensor = phase_controller_sensor(plan, stub_train, also=[stub_eval], budget_file=lambda: budget)
    defs = dg.Definitions(
        assets=[stub_train, stub_eval],
        jobs=[train_phase_job],
        sensors=[sensor],
        resources={"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)},
    )
    instance, cursor, raised, requests = dg.DagsterInstance.ephemeral(), None, False, []
    for _ in range(16):
        result, cursor, done = _tick(sensor, defs, "train_phase", instance, cursor)
        requests += [request for request, _ in done]
        if done:
            continue
        if raised:
            break
        newest = ControllerState.from_json(cursor).phases[-1].spec.name
        write_budget(
            budget, demo_raise(load_budget(budget), store.store.read_pointer(TRAIN_KEY, newest).counts["tokens_trained"])
        )
        raised = True
    return instance, requests


def _versions(instance: dg.DagsterInstance, key: dg.AssetKey) -> dict[str, str]:
    records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key), limit=100).records
    return {r.partition_key: r.event_log_entry.asset_materialization.metadata["version"].value for r in records}


def _config(run: dg.RunRequest) -> dict:
    return run.run_config["ops"]["train__demo"]["config"]


def test_a_branch_runs_as_its_own_partition_and_the_main_run_is_unchanged(tmp_path):
    plain, plain_runs = _run_demo(tmp_path / "plain", PLAIN_PLAN)
    branched, branched_runs = _run_demo(tmp_path / "branched", BRANCHED_PLAN)
    main_runs = [r for r in branched_runs if "marin/branch_of" not in r.tags]
    # The main run asked for the same phases, in the same order, under the same run keys and configs.
    assert [(r.partition_key, r.run_key, r.tags, _config(r)) for r in main_runs] == [
        (r.partition_key, r.run_key, r.tags, _config(r)) for r in plain_runs
    ]
    assert [r.tags["marin/phase"] for r in plain_runs] == ["kestrel", "jellyfish", "phoenix", "starling"]
    # ... and every main phase (and its eval) got the same content version.
    for key in (TRAIN, stub_eval.key):
        with_branches = _versions(branched, key)
        assert {p: v for p, v in with_branches.items() if not is_branch_partition(p)} == _versions(plain, key)
        assert sorted(p for p in with_branches if is_branch_partition(p)) == ["kestrel+early_cooldown", "phoenix+sft"]
    # The main run's decisions read the same: a branch is no phase of its history.
    said = [(d["phase"], d["decision"], d["reason"]) for d in decision_log(plain, TRAIN)]
    assert [(d["phase"], d["decision"], d["reason"]) for d in decision_log(branched, TRAIN) if d["decision"] != "branch"] == said

    # Each branch ran once, as a partition of its own, warm-started from its source's version.
    versions = _versions(branched, TRAIN)
    branch_runs = {r.tags["marin/phase"]: r for r in branched_runs if "marin/branch_of" in r.tags}
    assert sorted(branch_runs) == ["kestrel+early_cooldown", "phoenix+sft"]
    assert set(branched.get_dynamic_partitions(phases.name)) == {*versions}
    for branch in (EARLY_COOLDOWN, SFT):
        run = branch_runs[branch.partition]
        config = _config(run)
        assert run.tags["marin/branch_of"] == branch.from_phase and run.tags["marin/action"] == "branch"
        assert run.run_key == f"demo-branch-{branch.partition}" and run.partition_key == branch.partition
        assert config["warm_start_version"] == versions[branch.from_phase] and config["attempt"] == 0
        source = PhaseSpec(**_config(next(r for r in main_runs if r.tags["marin/phase"] == branch.from_phase))["phase"])
        assert PhaseSpec(**config["phase"]) == branch_phase(branch, source)
        # its lineage, recorded on its partition: the source phase and the content version it left from
        obs = branched.fetch_observations(
            dg.AssetRecordsFilter(asset_key=TRAIN, asset_partitions=[branch.partition]), limit=5
        ).records
        (meta,) = [{k: v.value for k, v in o.event_log_entry.asset_observation.metadata.items()} for o in obs]
        assert meta["decision"] == "branch" and meta["from_phase"] == branch.from_phase
        assert meta["from_version"] == versions[branch.from_phase]
    cooldown = PhaseSpec(**_config(branch_runs["kestrel+early_cooldown"])["phase"])
    assert cooldown.schedule == "linear_decay" and cooldown.is_cooldown and cooldown.mixture == DEMO_PLAN.first.mixture
    sft = PhaseSpec(**_config(branch_runs["phoenix+sft"])["phase"])
    assert sft.mixture == {"shakespeare": 1.0} and sft.peak_lr == 1e-3 and not sft.is_cooldown
    # The stand-in carried its source's tokens on: it started from kestrel's checkpoint, not from scratch.
    store = ArtifactStoreResource(prefix=str(tmp_path / "branched" / "prefix")).store
    kestrel = store.read_pointer(TRAIN_KEY, "kestrel").counts["tokens_trained"]
    assert store.read_pointer(TRAIN_KEY, "kestrel+early_cooldown").counts["tokens_trained"] == kestrel + 8 * 512
    # No main phase warm-started from a branch.
    assert all(not is_branch_partition(_config(r)["phase"]["warm_start_from"] or "") for r in main_runs)


def _tick(sensor, defs: dg.Definitions, job: str, instance: dg.DagsterInstance, cursor: str | None):
    """One controller tick, with every run it requests executed: (result, cursor, [(request, version)])."""
    result = sensor(dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs))
    done = []
    for add in (result.dynamic_partitions_requests or []) if isinstance(result, dg.SensorResult) else []:
        instance.add_dynamic_partitions(add.partitions_def_name, list(add.partition_keys))
    for request in result.run_requests or [] if isinstance(result, dg.SensorResult) else []:
        run = defs.resolve_job_def(job).execute_in_process(
            run_config=request.run_config,
            partition_key=request.partition_key,
            instance=instance,
            tags={**request.tags, "dagster/run_key": request.run_key},
        )
        [event] = [e for e in run.get_asset_materialization_events() if e.asset_key.path[0] == "train"]
        done.append((request, event.materialization.metadata["version"].value))
    return result, (result.cursor if isinstance(result, dg.SensorResult) and result.cursor else cursor), done


def test_a_branch_leaves_only_from_a_checkpoint_the_main_run_accepted(tmp_path):
    """Ocelot is rolled back twice and then replaced (switch_architecture): no branch leaves from it. Jellyfish,
    the run's last phase, is accepted by the tick that stops the run, and its branch leaves then."""
    from marin_assets.train.budget import Budget, write_budget

    plan = dataclasses.replace(SWITCH_PLAN, branches=(BranchSpec("cool", "ocelot", 100), BranchSpec("cool", "jellyfish", 100)))
    write_budget(tmp_path / "budget.yaml", Budget(budget_tokens=1500))
    store = ArtifactStoreResource(prefix=str(tmp_path / "prefix"))
    job = dg.define_asset_job("sw_phase", selection=[spiking_train])
    defs = dg.Definitions(
        assets=[spiking_train],
        jobs=[job],
        resources={"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)},
    )
    sensor = phase_controller_sensor(plan, spiking_train, name="sw_controller", budget_file=lambda: tmp_path / "budget.yaml")
    instance, cursor, ran, versions = dg.DagsterInstance.ephemeral(), None, [], {}
    for _ in range(10):
        result, cursor, done = _tick(sensor, defs, "sw_phase", instance, cursor)
        if not done:
            break
        for request, version in done:
            versions[request.partition_key] = version
            ran.append((request.partition_key, request.tags["marin/action"], request.run_config["ops"]["train__sw"]["config"]))
    assert [(phase, action) for phase, action, _ in ran] == [
        ("kestrel", "continue"),
        ("ocelot", "cool_down"),
        ("ocelot", "roll_back"),
        ("ocelot", "roll_back"),
        ("jellyfish", "switch_architecture"),
        ("jellyfish+cool", "branch"),
    ]
    assert result.skip_reason.skip_message.startswith("stop: budget spent")
    branch_config = ran[-1][2]
    assert branch_config["warm_start_version"] == versions["jellyfish"]
    assert branch_config["phase"]["model_changes"] == {"qk_norm": True} and branch_config["phase"]["transplant"] is None
    state = ControllerState.from_json(cursor)
    assert list(state.branches) == ["jellyfish+cool"] and "ocelot+cool" not in instance.get_dynamic_partitions(switch_phases.name)
    assert [p.spec.name for p in state.phases] == ["kestrel", "jellyfish"]


def test_until_a_branch_leaves_the_state_holds_none(tmp_path, monkeypatch):
    from marin_assets.train.budget import write_budget

    write_budget(tmp_path / "budget.yaml", demo_budget())
    monkeypatch.setenv(BUDGET_ENV, str(tmp_path / "budget.yaml"))
    result = phase_controller_sensor(DEMO_PLAN, stub_train)(dg.build_sensor_context(instance=dg.DagsterInstance.ephemeral()))
    assert ControllerState.from_json(result.cursor) == ControllerState(phases=(PhaseEntry(DEMO_PLAN.first, "demo-0-kestrel-0"),))


def _first(name: str = "kestrel") -> PhaseSpec:
    return PhaseSpec(
        name=name,
        warm_start_from=None,
        schedule="wsd",
        mixture={"web": 1.0},
        batch_size=8,
        hardware="cpu",
        token_budget=1000,
        peak_lr=1e-3,
    )


@pytest.mark.parametrize(
    ("branches", "phase_names", "message"),
    [
        ((BranchSpec("a", "nowhere", 10),), ("kestrel",), "leaves from 'nowhere', which is not a phase of the main run"),
        ((BranchSpec("a", "kestrel", 10), BranchSpec("a", "kestrel", 20)), ("kestrel",), "two branches share a partition"),
        ((), ("kestrel", "ocelot+x"), "main phase names must not contain '\\+'"),
        ([BranchSpec("a", "kestrel", 10)], ("kestrel",), "must be a tuple of BranchSpec"),
    ],
)
def test_the_plan_refuses_branches_that_could_not_run_or_could_collide(branches, phase_names, message):
    with pytest.raises(ValueError, match=message):
        PhasePlan(run="r", first=_first(), phase_names=phase_names, branches=branches)


def test_a_branch_may_leave_from_any_name_the_main_run_can_give_a_phase():
    plan = PhasePlan(
        run="r",
        first=_first(),
        phase_names=("kestrel", "ocelot"),
        branches=(BranchSpec("a", "ocelot", 10), BranchSpec("b", "phase7", 10)),
    )
    assert [b.partition for b in plan.branches] == ["ocelot+a", "phase7+b"]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "a+b"}, "must not contain '\\+'"),
        ({"name": "../x"}, "invalid branch name"),
        ({"name": "a" * 127}, "invalid branch partition key"),
        ({"token_budget": 0}, "token_budget must be > 0"),
        ({"schedule": "cosin"}, "schedule must be one of"),
        ({"peak_lr": float("nan")}, "peak_lr must be finite"),
        ({"peak_lr": -1.0}, "peak_lr must be > 0"),
        ({"start_fraction": 0.0}, "start_fraction must be in"),
        ({"mixture": {"web": -1.0}}, "BranchSpec 'a'"),
    ],
)
def test_a_branch_spec_names_the_field_it_refuses(fields, message):
    with pytest.raises(ValueError, match=message):
        BranchSpec(**{"name": "a", "from_phase": "kestrel", "token_budget": 10, **fields})


def test_a_branch_phase_takes_its_sources_model_batch_and_hardware():
    source = dataclasses.replace(
        _first("ocelot"),
        warm_start_from="kestrel",
        model_changes={"qk_norm": True},
        transplant="qk_norm",
        z_loss=1e-4,
        warmup_start_fraction=0.1,
    )
    spec = branch_phase(BranchSpec("cool", "ocelot", 300, start_fraction=0.5), source)
    assert spec == PhaseSpec(
        name="ocelot+cool",
        warm_start_from="ocelot",
        schedule="linear_decay",
        mixture={"web": 1.0},
        batch_size=8,
        hardware="cpu",
        token_budget=300,
        peak_lr=1e-3,
        is_cooldown=True,
        z_loss=1e-4,
        start_fraction=0.5,
        model_changes={"qk_norm": True},
    )
    with pytest.raises(ValueError, match="leaves from 'kestrel', not from 'ocelot'"):
        branch_phase(BranchSpec("cool", "kestrel", 300), source)


hold_phases = dg.DynamicPartitionsDefinition(name="hold_phases")


@versioned_asset(key="train/hold", code_version="stub", config_cls=StubPhaseConfig, partitions_def=hold_phases)
def dropping_train(ctx: StageContext, config: StubPhaseConfig):
    """A MoE whose router drops 90% of its tokens in every phase: the plan's max_drop_rate holds the run."""
    spec = phase_spec(config.phase.model_dump())
    return {
        "phase": spec.name,
        "tokens_trained": 1000,
        "phase_tokens": spec.token_budget,
        "tokens_consumed": {"web": 1000},
        "tokens_available": {"web": CACHE_TOKENS},
        "recent_losses": [2.9, 2.91, 2.9],
        "last_loss": 2.9,
        "recent_drop_rates": [0.9, 0.9],
        "is_cooldown": spec.is_cooldown,
    }


def test_no_branch_leaves_from_a_held_phase_until_a_person_releases_it(tmp_path):
    from marin_assets.train.budget import Budget

    plan = dataclasses.replace(
        SWITCH_PLAN, run="hold", architecture_switch=None, max_drop_rate=0.5, branches=(BranchSpec("cool", "kestrel", 100),)
    )
    budget = tmp_path / "budget.yaml"
    write_budget(budget, Budget(budget_tokens=1500))
    store = ArtifactStoreResource(prefix=str(tmp_path / "prefix"))
    defs = dg.Definitions(
        assets=[dropping_train],
        jobs=[dg.define_asset_job("hold_phase", selection=[dropping_train])],
        resources={"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)},
    )
    sensor = phase_controller_sensor(plan, dropping_train, name="hold_controller", budget_file=lambda: budget)
    instance = dg.DagsterInstance.ephemeral()
    _, cursor, [(first, kestrel)] = _tick(sensor, defs, "hold_phase", instance, None)
    for _ in range(2):  # held: no next phase, and no branch from a checkpoint a person has yet to look at
        held, cursor, done = _tick(sensor, defs, "hold_phase", instance, cursor)
        assert done == [] and held.skip_reason.skip_message.startswith("hold: MoE drop rate 90.00%")
    write_budget(budget, Budget(budget_tokens=1500, released_holds=("kestrel",)))
    _, cursor, done = _tick(sensor, defs, "hold_phase", instance, cursor)
    assert [(r.partition_key, r.tags["marin/action"]) for r, _ in done] == [("ocelot", "cool_down"), ("kestrel+cool", "branch")]
    assert all(r.run_config["ops"]["train__hold"]["config"]["warm_start_version"] == kestrel for r, _ in done)


# ---- what reads "the newest phase" reads the main run's, not a branch added after it ----------------


def test_the_newest_main_phase_mapping_skips_branches_that_lastpartitionmapping_would_pick():
    from assets.partitions import NewestMainPhase

    instance = dg.DagsterInstance.ephemeral()
    tasks = dg.StaticPartitionsDefinition(["copa", "piqa"])

    def upstream(mapping: dg.PartitionMapping) -> list[str]:
        result = mapping.get_upstream_mapped_partitions_result_for_partitions(
            tasks.subset_with_partition_keys(["copa"]), tasks, phases, dynamic_partitions_store=instance
        )
        return list(result.partitions_subset.get_partition_keys())

    assert upstream(NewestMainPhase()) == []  # no phase yet: nothing to read
    instance.add_dynamic_partitions(phases.name, ["kestrel", "jellyfish", "jellyfish+cool", "kestrel+sft"])
    assert upstream(dg.LastPartitionMapping()) == ["kestrel+sft"]  # what eval/demo/tasks read before
    assert upstream(NewestMainPhase()) == ["jellyfish"]
    # Downstream: a new materialisation of the newest main phase touches every task; one of a branch, none.
    for changed, expected in (("jellyfish", ["copa", "piqa"]), ("jellyfish+cool", []), ("kestrel", [])):
        downstream = NewestMainPhase().get_downstream_partitions_for_partitions(
            phases.subset_with_partition_keys([changed]), phases, tasks, dynamic_partitions_store=instance
        )
        assert sorted(downstream.get_partition_keys()) == expected
    with pytest.raises(ValueError, match="maps from a phase set"):
        NewestMainPhase().validate_partition_mapping(tasks, tasks)
    # With the asset it reads: a phase the plan added but the run never materialised (a failed or cancelled run,
    # a budget cut before it) is passed over for the newest one that was.
    train = dg.AssetKey(["train", "demo"])
    materialised = NewestMainPhase(materialised=train)
    assert upstream(materialised) == []  # nothing materialised yet
    for phase in ("kestrel", "jellyfish+cool"):
        instance.report_runless_asset_event(dg.AssetMaterialization(train, partition=phase))
    assert upstream(materialised) == ["kestrel"]  # jellyfish was added last, but never materialised
    instance.report_runless_asset_event(dg.AssetMaterialization(train, partition="jellyfish"))
    assert upstream(materialised) == ["jellyfish"]
    assert materialised == NewestMainPhase(materialised=train) != NewestMainPhase()


def test_the_task_suite_scores_the_newest_main_phase_not_a_branch_added_after_it(tmp_path):
    from assets.evals import eval_task
    from tests.evaluation.test_eval_assets import stub_tokenizer
    from tests.evaluation.test_eval_assets import stub_train as checkpoint_train

    store = ArtifactStoreResource(prefix=str(tmp_path))
    resources = {"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)}
    instance = dg.DagsterInstance.ephemeral()
    dg.materialize([stub_tokenizer], instance=instance, resources=resources)
    for phase, step in (("kestrel", 10), ("jellyfish", 20), ("jellyfish+early_cooldown", 30)):
        instance.add_dynamic_partitions(phases.name, [phase])
        dg.materialize(
            [checkpoint_train],
            partition_key=phase,
            instance=instance,
            resources=resources,
            run_config={"ops": {checkpoint_train.op.name: {"config": {"step": step}}}},
        )
    result = dg.materialize(
        [checkpoint_train, stub_tokenizer, eval_task],
        selection=[eval_task],
        partition_key="copa",
        instance=instance,
        resources=resources,
        run_config={"ops": {eval_task.op.name: {"config": {"limit": 2}}}},
    )
    (event,) = result.get_asset_materialization_events()
    meta = {k: v.value for k, v in event.materialization.metadata.items()}
    assert meta["count/phase"] == "jellyfish" and meta["count/step"] == 20


_NAME = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.=-]{0,40}", fullmatch=True).filter(lambda n: ".." not in n)


@settings(max_examples=200, deadline=None)
@given(source=_NAME, name=_NAME, used=st.lists(_NAME, max_size=8))
def test_a_branch_partition_never_names_a_main_phase_and_names_its_source(source, name, used):
    plan = PhasePlan(
        run="r",
        first=_first(),
        phase_names=("kestrel", source) if source != "kestrel" else ("kestrel",),
        branches=(BranchSpec(name, source, 10),),
    )
    (branch,) = plan.branches
    assert is_branch_partition(branch.partition) and branch.partition.split("+") == [source, name]
    main = plan.name_after(tuple(used))  # whatever the main run has used, its next name is no branch's
    assert not is_branch_partition(main) and plan.is_main_phase_name(main)
