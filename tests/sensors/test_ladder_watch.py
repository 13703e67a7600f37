"""The ladder watch in the phase controller: each action (warn, hold, rollback) does what it says.

Stand-ins keep it in seconds: a sweep asset whose partitions write the metrics.jsonl of runs that
follow a known law (the ladder), and a train asset that "trains" a phase by logging per-step rows
of the same law to the telemetry store, with a planted fault (the loss 1.5 nats up and the
gradient norm 8x from step 20: what a 100x LR did on real tiny runs) when the phase's peak LR is
above 0.01. The real sensor, decision function, band check, budget file and telemetry store run.
"""

from __future__ import annotations

import dataclasses
import json

import dagster as dg
import pytest

from marin_assets.model import count_params
from marin_assets.model.config import ModelConfig
from marin_assets.orchestration import (
    ArtifactIOManager,
    ArtifactStoreResource,
    StageConfig,
    StageContext,
    versioned,
    versioned_asset,
)
from marin_assets.phases.plan import PhasePlan, PhaseSpec, phase_telemetry_run
from marin_assets.scaling.trajectory import LadderWatchSettings
from marin_assets.store import ArtifactStore
from marin_assets.telemetry import TelemetryWriter
from marin_assets.train.budget import Budget, write_budget
from sensors.ladder_band import ladder_band_check
from sensors.ladder_watch import CHECK_NAME, LadderWatch
from sensors.phase_controller import phase_controller_sensor
from tests.scaling.test_trajectory import TOKENS_PER_STEP, rows
from tests.support.configs import TINY_MODEL

MODEL = TINY_MODEL
PARAMS = float(count_params(ModelConfig(**MODEL))[1])
LADDER = {"C1-d1": PARAMS / 2, "C1-d2": PARAMS * 0.8, "C1-d3": PARAMS * 1.6, "C1-d4": PARAMS * 3}  # one seed each
STEPS, FAULT_AT = 60, 20
TOO_HIGH_LR = 0.5
KESTREL = PhaseSpec(
    name="kestrel",
    warm_start_from=None,
    schedule="wsd",
    mixture={"web": 1.0},
    batch_size=8,
    hardware="cpu",
    token_budget=STEPS * TOKENS_PER_STEP,
    peak_lr=3e-3,
)
phases = dg.DynamicPartitionsDefinition(name="watch_phases")


@versioned_asset(
    key="sweep_stub", code_version="1", partitions_def=dg.StaticPartitionsDefinition(list(LADDER)), group_name="scaling"
)
def sweep_stub(ctx: StageContext):
    from marin_assets.store.artifact_files import write_file

    params = LADDER[ctx.partition_key]
    lines = [json.dumps(r) for r in rows(params, seed=int(ctx.partition_key[-1]))]
    write_file(ctx.out_dir, "metrics.jsonl", "\n".join(lines) + "\n")
    return {"params": params}


class StubConfig(StageConfig):
    phase: dict = versioned({})
    warm_start_version: str = versioned("")
    attempt: int = versioned(0)


def make_train(telemetry_root: str, plan_run: str):
    @versioned_asset(key="train/watched", code_version="1", config_cls=StubConfig, partitions_def=phases, group_name="training")
    def train_watched(ctx: StageContext, config: StubConfig):
        spec = PhaseSpec(**config.phase)
        faulty = spec.peak_lr > 0.01
        steps = rows(
            PARAMS,
            seed=10 + config.attempt,
            loss_shift=lambda s: 1.5 * (faulty and s >= FAULT_AT),
            grad_scale=lambda s: 8.0 if faulty and s >= FAULT_AT else 1.0,
            steps=spec.token_budget // TOKENS_PER_STEP,
        )
        with TelemetryWriter(telemetry_root, phase_telemetry_run(plan_run, spec.name)) as writer:
            for row in steps:
                writer.log(row["step"], {k: v for k, v in row.items() if k != "step"}, phase=spec.name)
        tokens = steps[-1]["tokens"]
        return {
            "phase": spec.name,
            "tokens_trained": tokens,
            "phase_tokens": tokens,
            "final_step": steps[-1]["step"],
            "tokens_consumed": {"web": tokens},
            "tokens_available": {"web": 10**9},
            "recent_losses": [r["loss"] for r in steps[-32:]],
            "is_cooldown": spec.is_cooldown,
        }

    return train_watched


@pytest.fixture(scope="module")
def ladder_store(tmp_path_factory) -> str:
    """The ladder's runs, materialised once into a store of their own."""
    root = str(tmp_path_factory.mktemp("ladder_store"))
    store = ArtifactStoreResource(prefix=root)
    resources = {"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)}
    instance = dg.DagsterInstance.ephemeral()
    for key in LADDER:
        assert dg.materialize([sweep_stub], partition_key=key, instance=instance, resources=resources).success
    return root


class Harness:
    """A controller with a watch over the stand-ins, ticked and executed by hand."""

    def __init__(self, tmp_path, ladder_store: str, action: str, lr: float, instance=None, **settings):
        self.budget = tmp_path / "budget.yaml"
        write_budget(self.budget, Budget(budget_tokens=10 * STEPS * TOKENS_PER_STEP))
        store = ArtifactStoreResource(prefix=str(tmp_path / "store"))
        telemetry = str(tmp_path / "telemetry")
        plan = PhasePlan(run="watched", first=dataclasses.replace(KESTREL, peak_lr=lr), cooldown_tokens=16 * TOKENS_PER_STEP)
        self.train = make_train(telemetry, plan.run)
        self.watch = LadderWatch(
            "sweep_stub",
            list(LADDER),
            MODEL,
            LadderWatchSettings(action=action, **settings),
            store=lambda: ArtifactStore(ladder_store),
        )
        self.sensor = phase_controller_sensor(
            plan, self.train, budget_file=lambda: self.budget, telemetry_root=lambda: telemetry, watch=self.watch
        )
        check = ladder_band_check(self.train, self.watch, plan.run, telemetry_root=lambda: telemetry)
        self.job = dg.define_asset_job("watched_phase", selection=dg.AssetSelection.groups("training"))
        self.defs = dg.Definitions(
            assets=[self.train],
            asset_checks=[check],
            jobs=[self.job],
            sensors=[self.sensor],
            resources={"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)},
        )
        self.instance = instance or dg.DagsterInstance.ephemeral()
        self.cursor = None

    def tick(self):
        result = self.sensor(dg.build_sensor_context(instance=self.instance, cursor=self.cursor, definitions=self.defs))
        self.cursor = getattr(result, "cursor", None) or self.cursor
        return result

    def execute(self, request: dg.RunRequest) -> None:
        self.instance.add_dynamic_partitions(phases.name, [request.partition_key])
        job = self.defs.resolve_job_def("watched_phase")
        run = job.execute_in_process(
            run_config=request.run_config,
            partition_key=request.partition_key,
            instance=self.instance,
            tags={**request.tags, "dagster/run_key": request.run_key},
        )
        assert run.success

    def first_phase(self) -> dg.RunRequest:
        (request,) = self.tick().run_requests
        self.execute(request)
        return request

    def observations(self, key: str) -> list[dict]:
        records = self.instance.fetch_observations(dg.AssetRecordsFilter(asset_key=self.train.key), limit=50).records
        found = [{k: v.value for k, v in r.event_log_entry.asset_observation.metadata.items()} for r in reversed(records)]
        return [o for o in found if key in o]

    def check_evaluations(self) -> list:
        key = dg.AssetCheckKey(self.train.key, CHECK_NAME)
        history = self.instance.event_log_storage.get_asset_check_execution_history(key, limit=20)
        return [h.event.asset_check_evaluation for h in reversed(history) if h.event and h.event.asset_check_evaluation]


def _skip(result) -> str:
    return result.skip_message if isinstance(result, dg.SkipReason) else result.skip_reason.skip_message


@pytest.mark.parametrize("action", ["warn", "hold", "rollback"])
def test_a_normal_run_is_judged_inside_and_the_plan_goes_on(tmp_path, ladder_store, action):
    h = Harness(tmp_path, ladder_store, action, lr=3e-3)
    h.first_phase()
    (nxt,) = h.tick().run_requests  # kestrel reached its token budget: the planned cooldown
    assert nxt.tags["marin/action"] == "cool_down" and nxt.partition_key != "kestrel"
    (in_run,) = h.check_evaluations()  # the check, in kestrel's run
    assert in_run.passed and in_run.partition == "kestrel" and in_run.description.startswith("inside the ladder's band")
    (seen,) = h.observations("ladder_watch")
    assert seen["ladder_watch"] == "inside" and seen["action"] == "none (inside)" and "trajectory" in seen


def test_warn_records_the_verdict_with_its_plot_and_changes_nothing(tmp_path, ladder_store):
    h = Harness(tmp_path, ladder_store, "warn", lr=TOO_HIGH_LR)
    h.first_phase()
    in_run = h.check_evaluations()[0]  # the phase's own check failed, as a warning
    assert not in_run.passed and in_run.severity == dg.AssetCheckSeverity.WARN
    assert "loss left the ladder's band at step" in in_run.description
    assert "![Main run against the ladder's band](data:image/png;base64," in in_run.metadata["trajectory"].value
    (nxt,) = h.tick().run_requests
    assert nxt.tags["marin/action"] == "cool_down"  # what the plan does anyway
    (seen,) = h.observations("ladder_watch")
    assert seen["ladder_watch"] == "outside" and seen["action"] == "warn" and seen["judged"] == "final, attempt 0"
    first = seen["first_step_outside"]
    assert FAULT_AT <= first <= FAULT_AT + 3 and seen["reason"].startswith(f"loss left the ladder's band at step {first}: ")
    assert "gradient norm left the ladder's band" in seen["reason"] and seen["verdict"]["metrics"]["loss"]["inside"] is False
    assert "![Main run against the ladder's band](data:image/png;base64," in seen["trajectory"]


def test_hold_requests_no_next_phase_until_the_budget_file_releases_it(tmp_path, ladder_store):
    h = Harness(tmp_path, ladder_store, "hold", lr=TOO_HIGH_LR)
    h.first_phase()
    for _ in range(2):  # a second tick holds too, and records nothing new
        held = h.tick()
        assert not getattr(held, "run_requests", None)
        assert _skip(held).startswith("hold: off the ladder's band: loss left the ladder's band at step")
    assert len(h.observations("ladder_watch")) == 1
    decisions = [o for o in h.observations("decision") if o["decision"] == "hold"]
    assert len(decisions) == 1 and "released_holds names kestrel" in decisions[0]["reason"]
    assert [(e.passed, e.severity) for e in h.check_evaluations()] == [(False, dg.AssetCheckSeverity.ERROR)]
    write_budget(h.budget, Budget(budget_tokens=10 * STEPS * TOKENS_PER_STEP, released_holds=("kestrel",)))
    (nxt,) = h.tick().run_requests
    assert nxt.tags["marin/action"] == "cool_down"
    assert h.observations("ladder_watch")[-1]["action"] == "none (hold released)"


def test_rollback_restarts_the_phase_then_holds_after_max_rollbacks(tmp_path, ladder_store):
    h = Harness(tmp_path, ladder_store, "rollback", lr=TOO_HIGH_LR, max_rollbacks=1)
    first = h.first_phase()
    (again,) = h.tick().run_requests
    assert again.partition_key == "kestrel" and again.tags["marin/action"] == "roll_back"
    assert again.run_key == first.run_key[:-1] + "1" and again.run_config["ops"]["train__watched"]["config"]["attempt"] == 1
    rolled = [o for o in h.observations("decision") if o["decision"] == "roll_back"]
    assert rolled[0]["reason"].startswith("off the ladder's band: loss left the ladder's band at step")
    h.execute(again)  # the same LR, fresh randomness: out again; one roll-back was allowed
    held = h.tick()
    assert not getattr(held, "run_requests", None)
    assert _skip(held).startswith("hold: off the ladder's band") and "(rolled back 1 times already: holding)" in _skip(held)
    assert [o["judged"] for o in h.observations("ladder_watch")] == ["final, attempt 0", "final, attempt 1"]


def test_rollback_ends_a_running_phase_mid_way_like_a_loss_spike(tmp_path, ladder_store):
    launcher = {
        "module": "marin_assets.orchestration.launcher",
        "class": "RoutingRunLauncher",
        "config": {"local": {"accelerators": ["cpu"]}, "unmatched": "local"},
    }
    with dg.instance_for_test(overrides={"run_launcher": launcher}) as instance:
        _end_mid_phase(Harness(tmp_path, ladder_store, "rollback", lr=TOO_HIGH_LR, instance=instance), tmp_path)


def _end_mid_phase(h: Harness, tmp_path) -> None:
    from dagster._core.storage.dagster_run import DagsterRun, DagsterRunStatus

    (request,) = h.tick().run_requests
    # The phase's run has started and logged 30 steps, off the band from step 20.
    h.instance.add_run(
        DagsterRun(
            job_name="watched_phase",
            run_id="running-kestrel",
            status=DagsterRunStatus.STARTED,
            tags={"dagster/run_key": request.run_key},
        )
    )
    live = rows(PARAMS, seed=10, loss_shift=lambda s: 1.5 * (s >= FAULT_AT), grad_scale=lambda s: 8.0 if s >= FAULT_AT else 1.0)
    with TelemetryWriter(str(tmp_path / "telemetry"), phase_telemetry_run("watched", "kestrel")) as writer:
        for row in live[:30]:
            writer.log(row["step"], {k: v for k, v in row.items() if k != "step"}, phase="kestrel")
    coordinator = h.instance.run_coordinator
    cancel, verdicts_when_cancelled = coordinator.cancel_run, []

    def cancel_run(run_id: str) -> bool:
        verdicts_when_cancelled.append(len(h.observations("ladder_watch")))
        return cancel(run_id)

    coordinator.cancel_run = cancel_run
    ended = h.tick()  # this stand-in run has no process to signal: the controller says so and waits for it
    assert _skip(ended).startswith("end_phase: off the ladder's band at step 30: loss left the ladder's band at step")
    assert _skip(ended).endswith("could not terminate its run; it runs its course")
    # It asked the run to stop before it drew and recorded the verdict (a plot costs ~1.7 s of training here).
    assert verdicts_when_cancelled == [0]
    (seen,) = h.observations("ladder_watch")
    assert seen["judged"] == "live, attempt 0" and seen["action"] == "rollback"
    ending = [o for o in h.observations("decision") if o["decision"] == "end_phase"]
    assert len(ending) == 1 and ending[0]["reason"].startswith("off the ladder's band at step 30")


@pytest.mark.slow
def test_the_check_judges_a_real_train_demo_phase_in_its_run(tmp_path, monkeypatch, ladder_store):
    """The real train/demo asset (a 12-step tiny MoE phase on byte datasets) and the real check: the
    run's config, materialisation and live telemetry are what the check reads."""
    from assets.training import RUN, train_phase
    from marin_assets.orchestration.training_backends import LocalTrainingBackend
    from tests.orchestration.phase_job import BASE, MIXTURE_CONFIG, byte_caches, mixture, phase_spec

    monkeypatch.setenv("MARIN_PREFIX", str(tmp_path / "prefix"))  # the store and the telemetry the trainer logs to
    assert BASE["model"] == MODEL  # the watch's N is this model's
    watch = LadderWatch("sweep_stub", list(LADDER), MODEL, store=lambda: ArtifactStore(ladder_store))
    check = ladder_band_check(train_phase, watch, RUN)
    store = ArtifactStoreResource()
    resources = {
        "artifact_store": store,
        "artifact_io": ArtifactIOManager(artifact_store=store),
        "training_backend": LocalTrainingBackend(),
    }
    instance = dg.DagsterInstance.ephemeral()
    assert dg.materialize([*byte_caches, mixture], instance=instance, resources=resources, run_config=MIXTURE_CONFIG).success
    instance.add_dynamic_partitions(train_phase.partitions_def.name, ["kestrel"])
    config = {"phase": dataclasses.asdict(phase_spec("kestrel", 12)), "base": BASE, "warm_start_version": ""}
    result = dg.materialize(
        [*byte_caches, mixture, train_phase, check],
        selection=[train_phase, check],
        partition_key="kestrel",
        instance=instance,
        resources=resources,
        run_config={"ops": {"train__demo": {"config": config}}},
    )
    assert result.success
    (evaluation,) = result.get_asset_check_evaluations()
    meta = {k: v.value for k, v in evaluation.metadata.items()}
    assert meta["ladder_watch"] in ("inside", "outside") and meta["judged"] == "final, attempt 0"
    assert meta["verdict"]["metrics"]["loss"]["judged"] == 11  # steps 2-12: step 1 is the first 10% of 12
    assert meta["expected"]["params"] == PARAMS and "data:image/png;base64," in meta["trajectory"]
    assert evaluation.passed == (meta["ladder_watch"] == "inside")


def test_before_the_ladder_has_run_nothing_is_judged_and_the_plan_goes_on(tmp_path):
    """`make demo` today: the MoE ladder the demo's watch reads is not materialised."""
    h = Harness(tmp_path, str(tmp_path / "empty_store"), "rollback", lr=TOO_HIGH_LR)
    h.first_phase()
    (nxt,) = h.tick().run_requests
    assert nxt.tags["marin/action"] == "cool_down"
    (in_run,) = h.check_evaluations()
    assert in_run.passed and in_run.severity == dg.AssetCheckSeverity.WARN
    assert in_run.description == (
        "not judged: no ladder trajectory yet: the ladder watch needs runs of >= 2 model sizes, "
        "got [] from 0 run(s) (left out 4 of 4 ladder runs: C1-d1, C1-d2, C1-d3, C1-d4)"
    )
    assert h.observations("ladder_watch") == []


def test_the_code_locations_watch_reads_the_ladder_the_demo_runs():
    """The demo materialises its ladder's sweep before the main run: the watch judges the demo's run
    against those runs (a ladder the demo did not run would leave every phase not judged)."""
    from assets.scaling_ladders import DEMO_LADDER
    from definitions import ladder_watch

    assert ladder_watch.sweep_key == f"scaling/{DEMO_LADDER.name}/sweep"
    assert list(ladder_watch.partitions) == DEMO_LADDER.keys()
    assert DEMO_LADDER.targets[-1].observed == "train/demo"  # and its last prediction is that run's final loss
