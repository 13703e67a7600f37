"""RoutingRunLauncher on a real DagsterInstance: a local run completes; k8s runs go to the right cluster."""

from __future__ import annotations

from pathlib import Path

import kubernetes
import kubernetes_validate
import pytest
from dagster._core.launcher.base import WorkerStatus
from dagster._core.storage.dagster_run import DagsterRunStatus
from dagster._core.test_utils import create_run_for_test, instance_for_test, poll_for_finished_run
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import PythonFileTarget

from marin_assets.cluster.tags import classify_tags
from marin_assets.orchestration.launcher import BACKEND_TAG, RoutingRunLauncher
from tests.cluster.k8s_fakes import fake_dagster_k8s_client

JOBS_FILE = str(Path(__file__).with_name("launcher_jobs.py"))
LAUNCHER = {"module": "marin_assets.orchestration.launcher", "class": "RoutingRunLauncher"}

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: east
  cluster: {server: "https://east.example.invalid:6443"}
- name: west
  cluster: {server: "https://west.example.invalid:6443"}
users:
- name: u
  user: {token: "not-a-real-token"}
contexts:
- name: ctx-east
  context: {cluster: east, user: u}
- name: ctx-west
  context: {cluster: west, user: u}
current-context: ctx-east
"""


def _cluster(name, kubeconfig, context, accelerators, regions=()):
    return {
        "name": name,
        "kubeconfig_file": str(kubeconfig),
        "context": context,
        "namespace": "marin",
        "job_image": "marin:test",
        "instance_config_map": "dagster-instance",
        "accelerators": list(accelerators),
        "regions": list(regions),
    }


class FakeBatchApi:
    def __init__(self):
        self.created = []
        self.deleted = []

    def create_namespaced_job(self, body, namespace, **_):
        self.created.append((namespace, body))

    def delete_namespaced_job(self, name, namespace, **_):
        self.deleted.append((namespace, name))

    def read_namespaced_job_status(self, name, namespace, **_):
        status = kubernetes.client.V1JobStatus(active=1)
        return kubernetes.client.V1Job(status=status)


class FakeCoreApi:
    def list_namespaced_pod(self, namespace, label_selector=None, **_):
        return kubernetes.client.V1PodList(items=[])


def _fake_client():
    batch = FakeBatchApi()
    return fake_dagster_k8s_client(batch, FakeCoreApi()), batch


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """One instance + one code server for the module: starting a gRPC server costs seconds."""
    kubeconfig = tmp_path_factory.mktemp("kube") / "kubeconfig.yaml"
    kubeconfig.write_text(KUBECONFIG)
    config = {
        "clusters": [
            _cluster("east", kubeconfig, "ctx-east", ["tpu-v5p"], ["us-east5"]),
            _cluster("west", kubeconfig, "ctx-west", ["tpu-v5e", "tpu-v5p"], ["us-west4"]),
        ]
    }
    with instance_for_test(overrides={"run_launcher": {**LAUNCHER, "config": config}}) as instance:
        launcher = instance.run_launcher
        fakes = {}
        for name in ("east", "west"):
            launcher.clusters[name].k8s_client, fakes[name] = _fake_client()
        target = PythonFileTarget(python_file=JOBS_FILE, attribute=None, working_directory=None, location_name="marin_test")
        with WorkspaceProcessContext(instance, target) as ctx:
            yield instance, ctx.create_request_context(), fakes


def _run(instance, workspace, tags):
    remote_job = workspace.get_code_location("marin_test").get_repository("__repository__").get_full_job("tiny_job")
    return create_run_for_test(
        instance,
        job_name="tiny_job",
        tags=tags,
        remote_job_origin=remote_job.get_remote_origin(),
        job_code_origin=remote_job.get_python_origin(),
    )


@pytest.mark.slow
def test_local_backend_really_runs_a_job(env):
    instance, workspace, fakes = env
    assert isinstance(instance.run_launcher, RoutingRunLauncher)
    run = _run(instance, workspace, {"marin/accelerator": "cpu", "marin/priority": "interactive"})
    instance.launch_run(run.run_id, workspace)
    finished = poll_for_finished_run(instance, run.run_id, timeout=120)
    assert finished.status == DagsterRunStatus.SUCCESS
    assert finished.tags[BACKEND_TAG] == "local"
    logs = instance.all_logs(run.run_id)
    assert any("to backend local" in (e.message or "") for e in logs)
    assert any(e.dagster_event and e.dagster_event.event_type_value == "STEP_SUCCESS" for e in logs)
    assert all(f.created == [] for f in fakes.values())


@pytest.mark.slow
@pytest.mark.parametrize(
    "tags, needle",
    [
        ({"marin/accelerator": "tpu-v9"}, "marin/accelerator"),
        ({"marin/chips": "8; rm -rf /"}, "marin/chips"),
        ({"marin/region": "us-east1 && curl x"}, "marin/region"),
        ({"marin/priority": "$(reboot)"}, "marin/priority"),
        ({"marin/cluster": "west`id`"}, "marin/cluster"),
        ({"marin/pool": "v5p;reboot"}, "marin/pool"),
        ({"marin/pool": "v5p-16"}, "no fleet_file"),
        ({"marin/cpu": "2; reboot"}, "marin/cpu"),
        ({"marin/memory": "4GB"}, "marin/memory"),
        ({"marin/accelerator": "tpu-v5p", "marin/memory": "4Gi\n"}, "marin/memory"),
    ],
)
def test_bad_tags_fail_the_run_with_a_clear_message(env, tags, needle):
    instance, workspace, fakes = env
    run = _run(instance, workspace, tags)
    with pytest.raises(Exception, match=needle):
        instance.launch_run(run.run_id, workspace)
    failed = instance.get_run_by_id(run.run_id)
    assert failed.status == DagsterRunStatus.FAILURE
    assert BACKEND_TAG not in failed.tags
    assert any(needle in (e.message or "") for e in instance.all_logs(run.run_id))
    assert all(f.created == [] for f in fakes.values())


@pytest.mark.slow
def test_k8s_tagged_runs_go_to_the_right_cluster(env):
    instance, workspace, fakes = env
    launcher = instance.run_launcher
    run = _run(
        instance,
        workspace,
        {"marin/accelerator": "tpu-v5p", "marin/chips": "256", "marin/region": "us-west4", "marin/priority": "production"},
    )
    instance.launch_run(run.run_id, workspace)
    assert fakes["east"].created == []
    [(namespace, job)] = fakes["west"].created
    assert namespace == "marin"
    assert job.metadata.name == f"dagster-run-{run.run_id}"
    container = job.spec.template.spec.containers[0]
    assert container.image == "marin:test"
    assert container.args[:3] == ["dagster", "api", "execute_run"]
    assert job.spec.template.metadata.labels["marin/accelerator"] == "tpu-v5p"
    assert job.spec.template.metadata.labels["marin/priority"] == "production"
    # The run worker is a small CPU pod even for a 256-chip TPU run: the training backend
    # inside it creates the TPU pods. No chip request, no accelerator selector or toleration.
    assert container.resources.requests == container.resources.limits == {"cpu": "1", "memory": "4Gi"}
    pod = job.spec.template.spec
    assert not pod.node_selector and not pod.tolerations and not pod.affinity
    env = {e.name: e.value for e in container.env if e.value is not None}
    assert (env["MARIN_CLUSTER"], env["MARIN_K8S_NAMESPACE"], env["MARIN_K8S_IMAGE"]) == ("west", "marin", "marin:test")
    job_dict = kubernetes.client.ApiClient().sanitize_for_serialization(job)
    assert kubernetes_validate.validate(job_dict, "1.32", strict=True) == "1.32"
    run = instance.get_run_by_id(run.run_id)
    assert run.tags[BACKEND_TAG] == "west"

    # Health and terminate go back to the same cluster.
    assert launcher.check_run_worker_health(run).status == WorkerStatus.RUNNING
    launcher.terminate(run.run_id)
    assert fakes["west"].deleted == [("marin", f"dagster-run-{run.run_id}")]
    assert fakes["east"].deleted == []

    # Without a region the first cluster serving tpu-v5p (config order) takes it.
    run2 = _run(instance, workspace, {"marin/accelerator": "tpu-v5p", "marin/chips": "16"})
    instance.launch_run(run2.run_id, workspace)
    assert len(fakes["east"].created) == 1
    assert instance.get_run_by_id(run2.run_id).tags[BACKEND_TAG] == "east"


def test_each_cluster_gets_its_own_kubeconfig_context(tmp_path):
    kubeconfig = tmp_path / "kubeconfig.yaml"
    kubeconfig.write_text(KUBECONFIG)
    before = kubernetes.client.Configuration.get_default_copy().host
    launcher = RoutingRunLauncher.from_config_value(
        None,
        {
            "clusters": [
                _cluster("east", kubeconfig, "ctx-east", ["tpu-v5p"]),
                _cluster("west", kubeconfig, "ctx-west", ["tpu-v5e"]),
            ]
        },
    )
    east = launcher.clusters["east"].api_client().configuration.host
    west = launcher.clusters["west"].api_client().configuration.host
    assert east == "https://east.example.invalid:6443"
    assert west == "https://west.example.invalid:6443"
    assert kubernetes.client.Configuration.get_default_copy().host == before


def test_choose_backend_rules(tmp_path):
    from marin_assets.cluster.tags import JobRequest

    kubeconfig = tmp_path / "k.yaml"
    kubeconfig.write_text(KUBECONFIG)
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "pools:\n  - {name: v5e, accelerator: tpu-v5e, region: us-west4, domains: 1, topology: 16x16}\n"
        "  - {name: cpu, accelerator: cpu, region: us-west4, domains: 2}\n"
    )
    launcher = RoutingRunLauncher.from_config_value(
        None, {"clusters": [_cluster("west", kubeconfig, "ctx-west", ["tpu-v5e"], ["us-west4"])], "fleet_file": str(fleet)}
    )
    assert launcher.choose_backend(JobRequest("tpu-v5e", 256)).name == "west"
    assert launcher.choose_backend(JobRequest("cpu", 8)).name == "local"
    assert launcher.choose_backend(JobRequest("cpu", 8, cluster="local")).name == "local"
    assert launcher.choose_backend(JobRequest("tpu-v5e", 256, region="us-west4")).name == "west"
    with pytest.raises(ValueError, match="largest matching pool"):
        launcher.choose_backend(JobRequest("tpu-v5e", 512))  # larger than any pool
    with pytest.raises(ValueError, match="no tpu-v4 pool"):
        launcher.choose_backend(JobRequest("tpu-v4", 8))
    with pytest.raises(ValueError, match="does not serve"):
        launcher.choose_backend(JobRequest("cpu", 1, cluster="west"))
    with pytest.raises(ValueError, match="no backend named"):
        launcher.choose_backend(JobRequest("cpu", 1, cluster="nope"))


def test_unmatched_local_and_fail(tmp_path):
    from marin_assets.cluster.tags import JobRequest

    default = RoutingRunLauncher.from_config_value(None, {})
    assert default.choose_backend(JobRequest("gb200-nvl72", 8)).name == "local"  # embedded default

    launcher = RoutingRunLauncher.from_config_value(None, {"unmatched": "fail"})
    assert launcher.choose_backend(JobRequest("cpu", 2)).name == "local"
    with pytest.raises(ValueError, match="no backend serves accelerator gb200-nvl72"):
        launcher.choose_backend(JobRequest("gb200-nvl72", 8))


def test_config_validation(tmp_path):
    with pytest.raises(ValueError, match="unknown accelerator"):
        RoutingRunLauncher.from_config_value(None, {"local": {"accelerators": ["tpu-v9"]}})
    with pytest.raises(ValueError, match="reserved"):
        RoutingRunLauncher.from_config_value(None, {"clusters": [_cluster("local", "k", None, ["cpu"])]})
    with pytest.raises(ValueError, match="unmatched"):
        RoutingRunLauncher.from_config_value(None, {"unmatched": "maybe"})


def test_run_worker_pod_settings(tmp_path):
    cluster = _cluster("west", tmp_path / "k", None, ["tpu-v5p"])
    launcher = RoutingRunLauncher.from_config_value(
        None,
        {"clusters": [{**cluster, "run_worker_cpu": "500m", "run_worker_memory": "2Gi", "run_worker_node_pool": "cpu-pool"}]},
    )
    config = launcher.clusters["west"].run_worker_k8s_config()
    assert config == {
        "container_config": {
            "resources": {"requests": {"cpu": "500m", "memory": "2Gi"}, "limits": {"cpu": "500m", "memory": "2Gi"}}
        },
        "pod_spec_config": {"node_selector": {"cloud.google.com/gke-nodepool": "cpu-pool"}},
    }
    for field, value, needle in [
        ("run_worker_cpu", "1\n", "CPU quantity"),
        ("run_worker_memory", "4GB", "quantity like"),
        ("run_worker_node_pool", "Pool!", "not a valid name"),
    ]:
        with pytest.raises(ValueError, match=needle):
            RoutingRunLauncher.from_config_value(None, {"clusters": [{**cluster, field: value}]})


def test_pool_tag_is_checked_against_the_fleet(tmp_path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "pools:\n  - {name: v5p-16, accelerator: tpu-v5p, region: us-east5, domains: 2, topology: 2x2x4}\n"
        "  - {name: v5e, accelerator: tpu-v5e, region: us-west4, domains: 1, topology: 16x16}\n"
    )
    launcher = RoutingRunLauncher.from_config_value(None, {"fleet_file": str(fleet)})
    tags = {"marin/accelerator": "tpu-v5p", "marin/chips": "16"}
    launcher.check_pool_tag({**tags, "marin/pool": "v5p-16"}, classify_tags(tags))
    launcher.check_pool_tag(tags, classify_tags(tags))  # no pool tag: nothing to check
    with pytest.raises(ValueError, match="pool 'v5e' cannot hold 16 x tpu-v5p"):
        launcher.check_pool_tag({**tags, "marin/pool": "v5e"}, classify_tags(tags))


def test_without_a_fleet_an_asset_pool_tag_runs_locally_and_a_run_pool_tag_is_refused():
    """The embedded default (dagster.yaml: no fleet) runs the DataKit's runs, whose assets ask for the cluster's
    data pool; a person who tags a run with a pool there is told there are none."""
    launcher = RoutingRunLauncher.from_config_value(None, {"local": {"accelerators": ["cpu"]}, "unmatched": "local"})
    tags = {"marin/pool": "cpu-data", "marin/cpu": "1", "marin/memory": "2Gi"}
    launcher.check_pool_tag(tags, classify_tags(tags), from_assets=True)
    with pytest.raises(ValueError, match="'cpu-data' given but the launcher has no fleet_file"):
        launcher.check_pool_tag(tags, classify_tags(tags))
    with pytest.raises(ValueError, match="not a valid name"):  # a malformed name is refused wherever it came from
        launcher.check_pool_tag({"marin/pool": "Data Pool!"}, classify_tags({}), from_assets=True)


@pytest.mark.slow
def test_run_pod_size_comes_from_the_run_tags(env):
    instance, workspace, fakes = env
    before = len(fakes["west"].created)
    run = _run(
        instance, workspace, {"marin/accelerator": "tpu-v5e", "marin/chips": "256", "marin/cpu": "8", "marin/memory": "32Gi"}
    )
    instance.launch_run(run.run_id, workspace)
    namespace, job = fakes["west"].created[before]
    container = job.spec.template.spec.containers[0]
    # CPU and memory from the tags, requests = limits; still no chip on the run worker pod.
    assert container.resources.requests == container.resources.limits == {"cpu": "8", "memory": "32Gi"}
    assert "marin/pool" not in job.spec.template.metadata.labels
    job_dict = kubernetes.client.ApiClient().sanitize_for_serialization(job)
    assert kubernetes_validate.validate(job_dict, "1.32", strict=True) == "1.32"
    assert any("(cpu 8, memory 32Gi)" in (e.message or "") for e in instance.all_logs(run.run_id))


class _FakeAssetGraph:
    def __init__(self, tags_by_key):
        self.tags_by_key = tags_by_key

    def has(self, key):
        return key in self.tags_by_key

    def get(self, key):
        from types import SimpleNamespace

        return SimpleNamespace(tags=self.tags_by_key[key])


def test_effective_run_tags_take_the_assets_tags_under_the_runs_own():
    from types import SimpleNamespace

    from dagster import AssetKey

    from marin_assets.orchestration.launcher import effective_run_tags

    a, b = AssetKey(["shards", "normalized"]), AssetKey(["shards", "tokenized"])
    workspace = SimpleNamespace(
        asset_graph=_FakeAssetGraph(
            {
                a: {"marin/pool": "datakit", "marin/cpu": "1", "marin/memory": "2Gi"},
                b: {"marin/pool": "datakit", "marin/cpu": "2", "marin/memory": "1Gi"},
            }
        )
    )
    run = SimpleNamespace(asset_selection=frozenset({a, b}), tags={"dagster/partition": "web-00001"})
    assert effective_run_tags(run, workspace) == {
        "marin/pool": "datakit",
        "marin/cpu": "2",
        "marin/memory": "2Gi",
        "dagster/partition": "web-00001",
    }
    override = SimpleNamespace(asset_selection=frozenset({a}), tags={"marin/memory": "8Gi"})
    assert effective_run_tags(override, workspace) == {"marin/pool": "datakit", "marin/cpu": "1", "marin/memory": "8Gi"}
    # No workspace or no asset selection (an op job): the run's own tags only.
    assert effective_run_tags(run, None) == run.tags
    assert effective_run_tags(SimpleNamespace(asset_selection=None, tags={"x": "y"}), workspace) == {"x": "y"}
    workspace.asset_graph.tags_by_key[b] = {"marin/pool": "other"}
    with pytest.raises(ValueError, match="different pools"):
        effective_run_tags(run, workspace)
