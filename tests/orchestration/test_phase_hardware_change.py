"""The phase controller moves a run to GB200 and the phase lands there, end to end.

sensor tick (migrate decision, RunRequest tags) -> the routing launcher of
dagster.cluster.yaml picks the GB200 cluster -> the real train/demo asset runs that request
(its run config, partition and tags) with the Kubernetes backend against the recording fake
API of test_kubernetes_backend.py, which creates the Service and Jobs sized for the tags.
Artifacts live on fsspec's memory filesystem, an object store as far as the backend knows.
"""

import dataclasses
import json
import uuid
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._config import process_config

import tests.orchestration.test_kubernetes_backend as kube_test
from assets.datakit.datasets import mixture_asset
from assets.partitions import demo_phases
from assets.training import train_phase
from marin_assets.cluster.tags import CHIPS_TAG, classify_tags
from marin_assets.datakit.shards import join, write_json
from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource
from marin_assets.orchestration.launcher import BACKEND_TAG, RoutingRunLauncher
from marin_assets.phases.plan import PhasePlan
from marin_assets.train.budget import Budget, write_budget
from sensors.phase_controller import phase_controller_sensor
from tests.orchestration.phase_job import BASE, phase_spec
from tests.support.datasets import byte_datasets, mixture_run_config

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "examples" / "fleet.yaml"
WARM_VERSION = "ab" * 32
# GB200 pool of examples/fleet.yaml (72 GPUs per rack, 4 per tray): chips -> (racks, pods per rack,
# GPUs per pod, ComputeDomains: IMEX channels only when a rack's trays talk over NVLink)
# Index and counts only: the fake cluster trains nothing, and memory:// holds no tensorstore caches.
DATASETS = byte_datasets({"sotu": (["s" * 4999], []), "shakespeare": (["k" * 6999], [])}, caches=False)
mixture = mixture_asset(["sotu", "shakespeare"])
GB200_SHAPES = {1: (1, 1, "1", 0), 4: (1, 1, "4", 0), 72: (1, 18, "4", 1), 144: (2, 18, "4", 2)}


def _launcher(monkeypatch) -> RoutingRunLauncher:
    """The production example's launcher (two clusters, the fleet), built offline."""
    monkeypatch.setenv("MARIN_FLEET_FILE", str(FLEET))
    section = yaml.safe_load((ROOT / "dagster.cluster.yaml").read_text())["run_launcher"]
    result = process_config(RoutingRunLauncher.config_type(), section["config"])
    assert result.success, [e.message for e in result.errors]
    return RoutingRunLauncher.from_config_value(None, result.value)


def _finished_first_phase(instance, store, plan, run_key):
    """What the controller sees after kestrel: its committed checkpoint and its materialisation
    (half its budget trained, so bigger hardware is still worth moving to)."""
    store.store.materialize(
        "train/demo",
        "kestrel",
        WARM_VERSION,
        lambda out: write_json({"step": 4}, join(out, "checkpoints", "meta.json")) or {},
        {},
    )

    @dg.asset(key=["train", "demo"], partitions_def=demo_phases)
    def kestrel_done():
        return dg.MaterializeResult(
            metadata={
                "version": WARM_VERSION,
                "count/phase_tokens": plan.first.token_budget // 2,
                "count/tokens_trained": plan.first.token_budget // 2,
                "count/tokens_consumed": dg.MetadataValue.json({"sotu": 100, "shakespeare": 100}),
                "count/tokens_available": dg.MetadataValue.json({"sotu": 4900, "shakespeare": 6900}),
                "count/recent_losses": dg.MetadataValue.json([5.0, 4.9, 4.8]),
            }
        )

    assert dg.materialize([kestrel_done], partition_key="kestrel", instance=instance, tags={"dagster/run_key": run_key}).success


def test_a_migration_to_gb200_creates_gb200_jobs(tmp_path, monkeypatch, store):
    global_fake = kube_test.FakeKube(tmp_path)
    monkeypatch.setattr(kube_test, "FAKE", global_fake)
    instance = dg.DagsterInstance.ephemeral()
    first = dataclasses.replace(phase_spec("kestrel", 8), hardware="cpu")
    plan = PhasePlan(run="demo", first=first, phase_names=("kestrel", "ocelot"), hardware_ladder={"cpu": 1.0, "gb200-nvl72": 4.0})
    budget = tmp_path / "budget.yaml"
    write_budget(
        budget,
        Budget(
            budget_tokens=10**6,
            data_allotment_tokens={"sotu": 5000, "shakespeare": 7000},
            hardware_available=("cpu", "gb200-nvl72"),
        ),
    )
    sensor = phase_controller_sensor(plan, train_phase, budget_file=lambda: budget)

    tick1 = sensor(dg.build_sensor_context(instance=instance))
    [start] = tick1.run_requests
    assert start.tags["marin/accelerator"] == "cpu" and start.partition_key == "kestrel"
    instance.add_dynamic_partitions(demo_phases.name, ["kestrel"])
    _finished_first_phase(instance, store, plan, start.run_key)

    tick2 = sensor(dg.build_sensor_context(instance=instance, cursor=tick1.cursor))
    [move] = tick2.run_requests
    assert move.tags["marin/action"] == "migrate" and move.partition_key == "ocelot"
    assert move.tags["marin/accelerator"] == "gb200-nvl72"
    phase = move.run_config["ops"]["train__demo"]["config"]["phase"]
    assert (phase["hardware"], phase["batch_size"], phase["warm_start_from"]) == ("gb200-nvl72", 16, "kestrel")

    # The launcher routes the request to the GB200 cluster; its run worker pod holds no GPU.
    launcher = _launcher(monkeypatch)
    request = classify_tags(move.tags)
    launcher.check_pool_tag(move.tags, request)
    cluster = launcher.choose_backend(request)
    assert cluster.name == "gke-us-central1"
    worker = cluster.run_worker_k8s_config()["container_config"]["resources"]
    assert set(worker["requests"]) == set(worker["limits"]) == {"cpu", "memory"}

    # Inside that run: the train asset on the Kubernetes backend, with the request's tags.
    instance.add_dynamic_partitions(demo_phases.name, ["ocelot"])
    resources = {
        "artifact_store": store,
        "artifact_io": ArtifactIOManager(artifact_store=store),
        "training_backend": kube_test.FakeClusterBackend(
            fleet_file=str(FLEET), namespace="marin", image="marin:test", poll_interval_s=0.01, log_reader_join_s=30
        ),
    }
    mix = mixture_run_config({"sotu": 1.0, "shakespeare": 1.0})
    assert dg.materialize([*DATASETS, mixture], instance=instance, resources=resources, run_config=mix).success
    config = {"ops": {"train__demo": {"config": {**move.run_config["ops"]["train__demo"]["config"], "base": BASE}}}}
    created: dict[str, list] = {}
    record = global_fake._create
    global_fake._create = lambda kind, ns, body: (record(kind, ns, body), created.setdefault(kind, []).append(body))
    result = dg.materialize(
        [*DATASETS, mixture, train_phase],
        selection=[train_phase],
        partition_key=move.partition_key,
        instance=instance,
        resources=resources,
        run_config=config,
        tags={**move.tags, BACKEND_TAG: cluster.name},
    )
    assert result.success
    [event] = [e for e in result.get_asset_materialization_events() if e.asset_key.path[0] == "train"]  # not its checkpoints
    meta = {k: v.value for k, v in event.materialization.metadata.items()}

    chips = int(move.tags.get(CHIPS_TAG, "1"))  # the sensor sets no marin/chips today: one GPU
    racks, pods, gpus, domains = GB200_SHAPES[chips]
    assert len(created.get("ComputeDomain", [])) == domains and len(created["Job"]) == racks
    for job in created["Job"]:
        kube_test._validate(job)
        assert job.spec.completions == job.spec.parallelism == pods
        [container] = job.spec.template.spec.containers
        assert container.resources.limits == {"nvidia.com/gpu": gpus}
        assert job.spec.template.spec.affinity.pod_affinity is not None  # the NVLink clique
        assert kube_test._env(job)["JAX_NUM_PROCESSES"] == str(racks * pods)
    [config_map] = created["ConfigMap"]
    spec = json.loads(config_map.data["spec.json"])
    assert spec["warm_start"].startswith(store.prefix) and spec["config"]["batch_size"] == 16
    assert spec["out_dir"].startswith(store.prefix) and spec["out_dir"].endswith("/.work")
    # Process 0's Pipes report became the phase's metadata (the stand-in worker "trains" num_steps).
    steps = spec["config"]["num_steps"]
    assert meta["count/backend"].startswith("kubernetes(train-") and meta["count/final_step"] == steps
    assert meta["count/tokens_trained"] == steps * 512 and meta["count/steps_reported"] == steps
    kube_test._validate(created["Service"][0])
    assert global_fake.objects == {}  # all deleted when the step ended


@pytest.fixture
def store():
    import fsspec

    resource = ArtifactStoreResource(prefix=f"memory:///wa-hw-{uuid.uuid4().hex[:8]}")
    yield resource
    fsspec.filesystem("memory").rm(resource.prefix, recursive=True)
