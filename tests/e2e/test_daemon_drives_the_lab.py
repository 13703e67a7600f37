"""Dagster's daemon drives the lab, with no driver of ours: a real `dagster-daemon` (its backfill loop
at 2 s, daemon_lab/daemon.py), `dagster-webserver` and code server on a temporary instance with the
repository's dagster.yaml (the routing launcher, the queued run coordinator, here looking at its queue
every second). The phase controller and the user-shards sensor are turned on over GraphQL as
the UI's toggle does; the daemon ticks them, launches each run they request through
``RoutingRunLauncher`` (the backfill daemon the DataKit's waves), and the phases of a tiny real model
train, are evaluated in the same run, and are decided (tests/e2e/daemon_lab). The daemon is killed
(SIGKILL) while the first phase trains and started again: the controller goes on from its cursor, no
phase launched twice, none lost. A file dropped into the watched folder becomes datasets/user, and the
phase after the next budget raise (a re-warm) trains on it. The nightly evaluation schedule (every
minute here) launches each phase's evaluation once a tick, cache hits while nothing changed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import dagster as dg
import pytest
import yaml

from assets.partitions import newest_materialisation
from demo.phases import decision_log
from marin_assets.datakit.watched_dir import WATCH_ENV
from marin_assets.local_workers import WORKERS_ENV
from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource
from marin_assets.train.budget import BUDGET_ENV, Budget, write_budget
from tests.assets.shard_corpus import base_records
from tests.assets.test_shard_assets import raw_blobs
from tests.e2e import _ui_util as ui
from tests.e2e.daemon_lab.definitions import CACHES_ENV, DATAKIT_INPUTS, EVAL_KEY, TOKENS_PER_STEP, TRAIN_KEY, USER
from tests.support.caches import stdlib_module_docs, stdlib_paragraphs, write_cache

pytestmark = pytest.mark.slow  # three Dagster processes and the runs they launch

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
LOCATION, REPOSITORY = "lab", "__repository__"
SENSOR, SCHEDULE, USER_SENSOR = "lab_controller", "lab_nightly", "new_user_shards"
USER_DATASET, USER_SHARD = dg.AssetKey(["datasets", USER]), "user-m-00000"
PHASES = ("kestrel", "starling", "phoenix")

START_SENSOR = """mutation($s: SensorSelector!) { startSensor(sensorSelector: $s) { __typename
  ... on Sensor { sensorState { status } } ... on PythonError { message } ... on UnauthorizedError { message } } }"""
START_SCHEDULE = """mutation($s: ScheduleSelector!) { startSchedule(scheduleSelector: $s) { __typename
  ... on ScheduleStateResult { scheduleState { status } } ... on PythonError { message }
  ... on UnauthorizedError { message } } }"""
SCHEDULE_TICKS = """query($s: ScheduleSelector!) { scheduleOrError(scheduleSelector: $s) { __typename
  ... on Schedule { scheduleState { ticks(limit: 20) { status timestamp runIds } } } } }"""


class Lab:
    """The instance, the code server, the webserver and the daemon of one test, each in its own session."""

    def __init__(self, root: Path) -> None:
        self.root, self.home = root, root / "home"
        self.home.mkdir(parents=True)
        (self.home / "dagster.yaml").write_text(lab_instance_yaml())
        with self.instance():  # the storage schema, made once here: three processes making it at once collide
            pass
        caches = {"license": root / "caches" / "license", "docs": root / "caches" / "docs"}
        write_cache(caches["license"], stdlib_paragraphs())
        write_cache(caches["docs"], stdlib_module_docs())
        self.budget = root / "budget.yaml"  # kestrel's 8 steps and 4 more: a cooldown, then the budget is spent
        write_budget(self.budget, Budget(budget_tokens=12 * TOKENS_PER_STEP))
        self.watched = root / "watched"
        self.watched.mkdir()
        prefix = root / "prefix"
        store = ArtifactStoreResource(prefix=str(prefix))  # the DataKit's fixed inputs, there before any file is
        with self.instance() as instance:
            resources = {"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)}
            assert dg.materialize(DATAKIT_INPUTS, instance=instance, resources=resources).success
        self.env = {
            **os.environ,
            "DAGSTER_HOME": str(self.home),
            "MARIN_PREFIX": str(prefix),
            BUDGET_ENV: str(self.budget),
            WATCH_ENV: str(self.watched),
            WORKERS_ENV: "1",  # a range run computes its partitions in its own process: two cores here
            CACHES_ENV: json.dumps({k: str(v) for k, v in caches.items()}),
            "PYTHONPATH": str(REPO),
            "JAX_PLATFORMS": "cpu",
            "PYTHONUNBUFFERED": "1",
        }
        grpc_port, web_port = ui.free_port(), ui.free_port()
        self.url = f"http://127.0.0.1:{web_port}"
        # One code server that the webserver and the daemon share, as a deployment runs it: killing the
        # daemon leaves it, and the runs it started, alone.
        (root / "workspace.yaml").write_text(
            f"load_from:\n  - grpc_server:\n      host: 127.0.0.1\n      port: {grpc_port}\n      location_name: {LOCATION}\n"
        )
        self.code_server = self._start(
            "code_server",
            [
                str(BIN / "dagster"),
                "code-server",
                "start",
                "-h",
                "127.0.0.1",
                "-p",
                str(grpc_port),
                "-f",
                "tests/e2e/daemon_lab/definitions.py",
            ],
        )
        wait_listening(grpc_port, self.code_server, root / "code_server.log", timeout_s=300)
        self.webserver = self._start(
            "webserver",
            [str(BIN / "dagster-webserver"), "-w", str(root / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(web_port)],
        )
        self.daemon = self.start_daemon()

    def _start(self, name: str, argv: list[str]):
        return ui.start_process(argv, REPO, self.env, self.root / f"{name}.log")

    def start_daemon(self):
        # Dagster's daemon CLI with a 2 s backfill loop (daemon_lab/daemon.py says why): the DataKit's 8 waves.
        argv = [sys.executable, "-m", "tests.e2e.daemon_lab.daemon", "run", "-w", str(self.root / "workspace.yaml")]
        return self._start("daemon", argv)

    def kill_daemon(self) -> None:
        os.killpg(self.daemon.pid, signal.SIGKILL)  # no clean shutdown: as a crashed or evicted daemon
        self.daemon.wait(timeout=30)

    def selector(self, kind: str, name: str) -> dict:
        return {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY, f"{kind}Name": name}

    def gql(self, query: str, variables: dict) -> dict:
        return ui.graphql(self.url, query, variables)

    def instance(self) -> dg.DagsterInstance:
        return dg.DagsterInstance.from_config(str(self.home))

    def logs(self) -> str:
        """What a failed wait shows: every run (its status, what asked for it) and the daemon's and code server's logs."""
        with self.instance() as instance:
            runs = [
                f"{r.run_id[:8]} {r.status.value} {r.tags.get('dagster/sensor_name') or r.tags.get('dagster/backfill') or ''} "
                f"{r.tags.get('dagster/run_key') or r.tags.get('dagster/partition') or ''}"
                for r in instance.get_runs()
            ]
        logs = "\n".join(f"--- {n}.log\n{ui.tail(self.root / f'{n}.log')}" for n in ("daemon", "code_server"))
        return "--- runs\n" + "\n".join(runs) + "\n" + logs

    def stop(self) -> None:
        for proc in (self.daemon, self.webserver, self.code_server):
            ui.kill_group(proc, grace_s=15)


def lab_instance_yaml() -> str:
    """The repository's dagster.yaml, its queue looked at every second instead of every 5 (Dagster's
    ``dequeue_interval_seconds``): every run of the test passes through the queue."""
    config = yaml.safe_load((REPO / "dagster.yaml").read_text())
    config["run_coordinator"]["config"]["dequeue_interval_seconds"] = 1
    return yaml.safe_dump(config)


def wait_listening(port: int, proc, log_path: Path, timeout_s: float) -> None:
    """Until something accepts connections on 127.0.0.1:``port`` (the code server has loaded the definitions)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if proc.poll() is not None:
            raise AssertionError(f"the code server exited with {proc.returncode}:\n{ui.tail(log_path)}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(1)
    raise AssertionError(f"nothing listens on port {port} after {timeout_s:.0f}s:\n{ui.tail(log_path)}")


def wait_for(what: str, condition, lab: Lab, timeout_s: float, poll_s: float = 1.0):
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        value = condition()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"{what}: not after {timeout_s:.0f}s\n{lab.logs()}")


def phase_runs(instance: dg.DagsterInstance) -> list[dg.DagsterRun]:
    return instance.get_runs(dg.RunsFilter(tags={"dagster/sensor_name": SENSOR}))


def materialisations(instance: dg.DagsterInstance, key: str, partition: str | None = None) -> list:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(key.split("/")), asset_partitions=[partition] if partition else None),
        limit=100,
    ).records
    return [r.event_log_entry.asset_materialization for r in records]


def decided(lab: Lab, phase: str, decision: str):
    """The controller's decision log once it holds ``decision`` for ``phase``, else None."""
    with lab.instance() as instance:
        log = decision_log(instance, dg.AssetKey(TRAIN_KEY.split("/")))
    return any(d["phase"] == phase and d["decision"] == decision for d in log) and log


def test_the_daemon_drives_the_phases_through_our_launcher_and_survives_its_own_death(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "lab" / "home"))  # the test reads the instance: dagster.yaml needs it
    lab = Lab(tmp_path / "lab")
    try:
        ui.wait_location_loaded(lab.url, lab.webserver, tmp_path / "lab" / "webserver.log", LOCATION, timeout_s=300)
        # The UI's toggle: the controller is off by default (DefaultSensorStatus.STOPPED).
        for sensor in (SENSOR, USER_SENSOR):
            on = lab.gql(START_SENSOR, {"s": lab.selector("sensor", sensor)})["startSensor"]
            assert on["__typename"] == "Sensor" and on["sensorState"]["status"] == "RUNNING", on
        # A user drops a file into the watched folder: the sensor's runs (and the daemon's death) go on beside kestrel's.
        (lab.watched / "m.jsonl").write_text(raw_blobs({"m.jsonl": base_records()})["m.jsonl"])

        def kestrel_training():
            with lab.instance() as instance:
                runs = [r for r in phase_runs(instance) if r.tags.get("marin/phase") == "kestrel"]
                return runs and runs[0].status == dg.DagsterRunStatus.STARTED and runs[0]

        run = wait_for("the daemon launches kestrel", kestrel_training, lab, timeout_s=300)
        lab.kill_daemon()
        with lab.instance() as instance:  # the run is the code server's child: the daemon's death leaves it running
            assert instance.get_run_by_id(run.run_id).status in (dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.SUCCESS)
        lab.daemon = lab.start_daemon()

        wait_for("the controller decides the run to its end", lambda: decided(lab, "starling", "stop"), lab, timeout_s=420)

        def user_dataset():
            with lab.instance() as instance:
                return instance.get_latest_materialization_event(USER_DATASET)

        wait_for("the daemon's backfill builds datasets/user from the dropped file", user_dataset, lab, timeout_s=420, poll_s=2)
        # A person raises the budget by 4 steps: the controller re-warms on the users' data.
        write_budget(lab.budget, Budget(budget_tokens=16 * TOKENS_PER_STEP))
        decisions = wait_for("phoenix trains and the run ends", lambda: decided(lab, "phoenix", "stop"), lab, timeout_s=300)

        # The schedule, turned on once both phases are trained: each tick (every minute here) evaluates each phase once.
        on = lab.gql(START_SCHEDULE, {"s": lab.selector("schedule", SCHEDULE)})["startSchedule"]
        assert on["__typename"] == "ScheduleStateResult" and on["scheduleState"]["status"] == "RUNNING", on

        def two_ticks_evaluated():
            state = lab.gql(SCHEDULE_TICKS, {"s": lab.selector("schedule", SCHEDULE)})["scheduleOrError"]["scheduleState"]
            ticks = sorted((t for t in state["ticks"] if t["runIds"]), key=lambda t: t["timestamp"])[:2]
            with lab.instance() as instance:
                runs = [[instance.get_run_by_id(i) for i in t["runIds"]] for t in ticks]
            return len(ticks) == 2 and all(r.is_finished for tick in runs for r in tick) and runs

        tick_runs = wait_for("two schedule ticks, their evaluations finished", two_ticks_evaluated, lab, timeout_s=240, poll_s=5)
        with lab.instance() as instance:
            cache_hits = [
                sorted((r.tags["dagster/partition"], _cache_hit(instance, r.run_id)) for r in tick) for tick in tick_runs
            ]
            runs = phase_runs(instance)
            train = {p: newest_materialisation(instance, dg.AssetKey(TRAIN_KEY.split("/")), p) for p in PHASES}
            evaluated = {p: newest_materialisation(instance, dg.AssetKey(EVAL_KEY.split("/")), p) for p in PHASES}
            user_runs = instance.get_runs(dg.RunsFilter(tags={"dagster/sensor_name": USER_SENSOR}))
            backfills = instance.get_backfills()
            built = {
                k: materialisations(instance, k, p) for k, p in (("shards/tokenized", USER_SHARD), (f"datasets/{USER}", None))
            }
    finally:
        lab.stop()

    # Each phase launched once (none twice across the daemon's death, none lost), through our launcher, and it succeeded.
    assert sorted(r.tags["marin/phase"] for r in runs) == sorted(PHASES)
    assert all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs), [(r.tags["marin/phase"], r.status) for r in runs]
    assert all(r.tags.get("marin/backend") == "local" for r in runs), [r.tags for r in runs]
    # Trained, evaluated and decided: kestrel's 8 steps, a cooldown in the 4 the budget left, then the stop.
    meta = {p: m.metadata for p, m in train.items()}
    assert [meta[p]["count/final_step"].value for p in PHASES] == [8, 12, 16]
    for phase, m in evaluated.items():
        assert m.metadata["count/last_loss"].value == pytest.approx(meta[phase]["count/last_loss"].value)
    assert {p: m.metadata["count/final_step"].value for p, m in evaluated.items()} == {
        "kestrel": 8,
        "starling": 12,
        "phoenix": 16,
    }
    said = [(d["phase"], d["decision"]) for d in decisions if d.get("decision")]
    assert [
        said.count(d) for d in (("kestrel", "cool_down"), ("starling", "stop"), ("starling", "re_warm"), ("phoenix", "stop"))
    ] == [1] * 4, said
    # The dropped file: one source + index run and one backfill of the shard steps, through the daemons; each shard
    # step built once; Phoenix (and only Phoenix) trained on the dataset holding the file's shard.
    file_runs = [r.tags["dagster/run_key"].split("@")[0] for r in user_runs if "dagster/run_key" in r.tags]
    assert file_runs == ["user-files-1"] and all(r.status == dg.DagsterRunStatus.SUCCESS for r in user_runs), user_runs
    assert len(backfills) == 1 and backfills[0].status.value == "COMPLETED_SUCCESS", backfills
    assert {k: len(v) for k, v in built.items()} == {"shards/tokenized": 1, f"datasets/{USER}": 1}
    assert {p: list(meta[p]["count/user_shards"].value) for p in PHASES} == {
        "kestrel": [],
        "starling": [],
        "phoenix": [USER_SHARD],
    }
    # The schedule: each tick evaluated each phase once, and with nothing changed since the phase runs evaluated
    # them, every one was a cache hit.
    assert [[r.status for r in tick] for tick in tick_runs] == [[dg.DagsterRunStatus.SUCCESS] * 3] * 2
    assert cache_hits == [sorted((p, True) for p in PHASES)] * 2


def _cache_hit(instance: dg.DagsterInstance, run_id: str) -> bool:
    (event,) = instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
    return bool(event.asset_materialization.metadata["cache_hit"].value)
