"""Issue 12 item 4 on a fake Kubernetes API: a 64-shard backfill fans out into run pods.

The whole production path runs in this process except Kubernetes itself: an asset backfill
is submitted, Dagster's backfill daemon iteration creates its runs (multi_run: one run per
shard, or per range of 8), MarinQueuedRunCoordinator queues them with their assets'
marin/pool, cpu, memory tags, the run queue daemon dequeues them under the per-pool run
limit from ``run_concurrency_config(fleet)``, and RoutingRunLauncher creates one Job per
run on the fake cluster's batch API, which records it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from pathlib import Path

import kubernetes
import kubernetes_validate
import pytest
from dagster import AssetKey
from dagster._core.events import DagsterEvent, DagsterEventType
from dagster._core.execution.backfill import PartitionBackfill
from dagster._core.storage.dagster_run import DagsterRunStatus, RunsFilter
from dagster._core.storage.tags import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
    BACKFILL_ID_TAG,
    PARTITION_NAME_TAG,
)
from dagster._core.test_utils import instance_for_test
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import PythonFileTarget
from dagster._daemon.backfill import execute_backfill_iteration
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon

from marin_assets.cluster.fleet import load_fleet
from marin_assets.cluster.manifests import round_trip
from marin_assets.orchestration.launcher import BACKEND_TAG, run_concurrency_config
from tests.cluster.k8s_fakes import KUBECONFIG, fake_dagster_k8s_client

DEFS_FILE = str(Path(__file__).with_name("shard_fanout_defs.py"))
SHARDS = [f"web-{i:05d}" for i in range(64)]
POOL_SLOTS = 8  # the datakit pool: 8 CPU nodes -> 8 runs at once (pool_run_slots)
FLEET = f"""\
pools:
  - {{name: datakit, accelerator: cpu, region: us-central1, domains: {POOL_SLOTS}}}
  - {{name: other, accelerator: cpu, region: us-central1, domains: 1}}
"""
# The chain's largest asks (shard_fanout_defs.TAGS): requests = limits, CPU and memory only.
POD_RESOURCES = {"cpu": "2", "memory": "3Gi"}


class RecordingBatchApi:
    """The BatchV1Api calls the launcher makes; every created Job is kept."""

    def __init__(self):
        self.created = []

    def create_namespaced_job(self, body, namespace, **_):
        self.created.append((namespace, body))
        return body


@pytest.fixture(scope="module")
def fanout_env(tmp_path_factory):
    with contextlib.ExitStack() as stack:
        yield from _fanout_env(stack, tmp_path_factory)


def _fanout_env(stack, tmp_path_factory):
    """One instance and one code server for the module (starting a gRPC server costs seconds)."""
    tmp_path = tmp_path_factory.mktemp("fanout")
    # The instance's SQLite files in memory where there is a tmpfs: hundreds of small commits
    # (run, event, tag writes for 64 runs) cost seconds of fsync on a busy disk.
    home = stack.enter_context(tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    (tmp_path / "kubeconfig.yaml").write_text(KUBECONFIG)
    (tmp_path / "fleet.yaml").write_text(FLEET)
    fleet = load_fleet(tmp_path / "fleet.yaml")
    limits = run_concurrency_config(fleet)["runs"]["tag_concurrency_limits"]
    assert limits == [
        {"key": "marin/pool", "value": "datakit", "limit": POOL_SLOTS},
        {"key": "marin/pool", "value": "other", "limit": 1},
    ]
    cluster = {
        "name": "datakit-gke",
        "kubeconfig_file": str(tmp_path / "kubeconfig.yaml"),
        "namespace": "marin",
        "job_image": "marin:test",
        "instance_config_map": "dagster-instance",
        "accelerators": ["cpu"],
    }
    overrides = {
        "run_launcher": {
            "module": "marin_assets.orchestration.launcher",
            "class": "RoutingRunLauncher",
            "config": {"clusters": [cluster], "unmatched": "fail", "fleet_file": str(tmp_path / "fleet.yaml")},
        },
        "run_coordinator": {"module": "marin_assets.orchestration.launcher", "class": "MarinQueuedRunCoordinator"},
        "concurrency": {"runs": {"max_concurrent_runs": -1, "tag_concurrency_limits": limits}},
        # One event log database, as on Postgres in production: the default SQLite log opens
        # (and migrates) one database file per run, ~1 s per run on this box.
        "event_log_storage": {
            "module": "dagster._core.storage.event_log",
            "class": "ConsolidatedSqliteEventLogStorage",
            "config": {"base_dir": str(Path(home) / "event_log")},
        },
    }
    with instance_for_test(overrides=overrides, temp_dir=home) as instance:
        batch = RecordingBatchApi()
        instance.run_launcher.clusters["datakit-gke"].k8s_client = fake_dagster_k8s_client(batch)
        instance.add_dynamic_partitions("fanout_shards", SHARDS)
        target = PythonFileTarget(python_file=DEFS_FILE, attribute=None, working_directory=None, location_name="fanout")
        with WorkspaceProcessContext(instance, target) as process_context:
            yield instance, process_context, batch


@pytest.fixture
def fanout(fanout_env):
    """The module's instance with every earlier run finished and no Job recorded yet."""
    instance, process_context, batch = fanout_env
    assert instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.QUEUED, DagsterRunStatus.STARTING])) == []
    batch.created.clear()
    return fanout_env


def _backfill(instance, process_context, prefix, steps=("normalized", "filtered", "tokenized")):
    """Submit an asset backfill of the chain over all 64 shards; run the daemon once."""
    workspace = process_context.create_request_context()
    keys = [AssetKey([prefix, name]) for name in steps]
    backfill = PartitionBackfill.from_asset_partitions(
        backfill_id=f"fanout{prefix}",
        asset_graph=workspace.asset_graph,
        partition_names=SHARDS,
        asset_selection=keys,
        backfill_timestamp=0.0,
        tags={},
        dynamic_partitions_store=instance,
        all_partitions=False,
        title=None,
        description=None,
        run_config=None,
    )
    instance.add_backfill(backfill)
    errors = [e for e in execute_backfill_iteration(process_context, logging.getLogger("backfill")) if e]
    assert errors == []
    return backfill.backfill_id, set(keys)


def _runs(instance, backfill_id, status=None):
    statuses = [status] if status else None
    return instance.get_runs(RunsFilter(tags={BACKFILL_ID_TAG: backfill_id}, statuses=statuses))


def _run_shards(run) -> list[str]:
    """The shard keys a run covers, from its partition tags (a key, or a range of keys)."""
    start, end = run.tags.get(ASSET_PARTITION_RANGE_START_TAG), run.tags.get(ASSET_PARTITION_RANGE_END_TAG)
    if start is None:
        return [run.tags[PARTITION_NAME_TAG]]
    assert PARTITION_NAME_TAG not in run.tags
    return SHARDS[SHARDS.index(start) : SHARDS.index(end) + 1]


def _finish(instance, runs):
    """The run workers report success (what the pods would do), freeing their pool slots."""
    for run in runs:
        instance.report_dagster_event(
            DagsterEvent(DagsterEventType.RUN_SUCCESS.value, job_name=run.job_name, message="done (fake pod)"), run_id=run.run_id
        )


def _dequeue(process_context):
    list(QueuedRunCoordinatorDaemon(interval_seconds=1).run_iteration(process_context))


def _check_job(namespace, job, run):
    assert namespace == "marin"
    assert job.metadata.name == f"dagster-run-{run.run_id}"
    assert round_trip(job) == job
    manifest = kubernetes.client.ApiClient().sanitize_for_serialization(job)
    assert kubernetes_validate.validate(manifest, "1.32", strict=True) == "1.32"
    [container] = job.spec.template.spec.containers
    assert container.resources.requests == container.resources.limits == POD_RESOURCES
    assert job.spec.template.metadata.labels["marin/pool"] == "datakit"
    pod = job.spec.template.spec
    assert not pod.node_selector and not pod.tolerations and not pod.affinity  # no accelerator anywhere
    assert container.args[:3] == ["dagster", "api", "execute_run"]


@pytest.mark.slow
@pytest.mark.parametrize("prefix, shards_per_run", [("fan1", 1), ("fan8", 8)])
def test_64_shard_backfill_fans_out_into_pool_limited_run_pods(fanout, prefix, shards_per_run):
    instance, process_context, batch = fanout
    backfill_id, keys = _backfill(instance, process_context, prefix)
    n_runs = len(SHARDS) // shards_per_run

    # The backfill daemon made one run per shard range, each for the whole 3-asset chain,
    # and queued them holding nothing: no Job exists yet.
    queued = _runs(instance, backfill_id)
    assert len(queued) == n_runs
    assert {r.status for r in queued} == {DagsterRunStatus.QUEUED}
    assert batch.created == []
    covered = []
    for run in queued:
        assert run.asset_selection == keys
        # Asset tags became run tags at queue time: the pool limit below keys on them.
        assert (run.tags["marin/pool"], run.tags["marin/cpu"], run.tags["marin/memory"]) == ("datakit", "2", "3Gi")
        span = _run_shards(run)
        assert len(span) == shards_per_run
        covered.extend(span)
    assert sorted(covered) == SHARDS  # every shard once, in exactly one run

    # The run queue starts at most POOL_SLOTS runs of the pool; the rest stay QUEUED, with
    # no Job (so no pod, no node) until running ones finish.
    launched_ids = []
    while len(launched_ids) < n_runs:
        _dequeue(process_context)
        started = [
            r for r in _runs(instance, backfill_id) if r.status != DagsterRunStatus.QUEUED and r.run_id not in launched_ids
        ]
        waiting = _runs(instance, backfill_id, DagsterRunStatus.QUEUED)
        assert len(started) == min(POOL_SLOTS, n_runs - len(launched_ids))
        assert len(waiting) == n_runs - len(launched_ids) - len(started)
        launched_ids += [r.run_id for r in started]
        assert len(batch.created) == len(launched_ids)
        _dequeue(process_context)  # nothing more starts while the pool is full
        assert len(batch.created) == len(launched_ids)
        _finish(instance, started)

    by_run = {job.metadata.name.removeprefix("dagster-run-"): (ns, job) for ns, job in batch.created}
    assert sorted(by_run) == sorted(launched_ids)
    for run in _runs(instance, backfill_id):
        assert run.tags[BACKEND_TAG] == "datakit-gke"
        _check_job(*by_run[run.run_id], run)


@pytest.mark.slow
def test_a_run_whose_assets_name_two_pools_fails_naming_them_and_creates_no_job(fanout):
    instance, process_context, batch = fanout
    backfill_id, _ = _backfill(instance, process_context, "mixed", steps=("normalized", "filtered"))
    [run] = _runs(instance, backfill_id)
    assert run.status == DagsterRunStatus.QUEUED and "marin/pool" not in run.tags  # queued untagged...
    _dequeue(process_context)
    run = instance.get_run_by_id(run.run_id)
    assert run.status == DagsterRunStatus.FAILURE  # ...and refused at launch: it never holds a pod
    assert batch.created == []
    needle = "tag marin/pool: the assets of one run name different pools (mixed/filtered=other, mixed/normalized=datakit)"
    messages = [e.message or "" for e in instance.all_logs(run.run_id)]
    assert any(needle in m and m.startswith("[MarinQueuedRunCoordinator] queued without") for m in messages)
    assert any(needle in m and m.startswith("[RoutingRunLauncher] RoutingRunLauncher refused run") for m in messages)
