"""The Kubernetes training backend against a recording fake API (no cluster, no network).

The fake plays API server and kubelet: it records every create/delete/read call, turns
each created Indexed Job into pods, and "runs" process 0 by starting standin_worker.py
(helper H9's worker is not there yet) with the environment from the Job's own container
spec, so the Pipes bootstrap variables travel exactly as they would in a pod. Its stderr
becomes the pod log that the backend's Pipes reader consumes.
"""

import json
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
from kubernetes import client as k8s

from marin_assets.cluster.fleet import fleet_from_dict
from marin_assets.cluster.manifests import jax_distributed_args, round_trip, trainer_rbac
from marin_assets.orchestration.training_backends import (
    WORKER_MODULE,
    KubernetesTrainingBackend,
    choose_pool,
    pool_tags,
)
from tests.orchestration.training_backend_helpers import materialize_with, step_error_text, tiny_spec

STANDIN = str(Path(__file__).with_name("standin_worker.py"))
FLEET = {
    "pools": [
        {"name": "v5p-16", "accelerator": "tpu-v5p", "region": "us-east5", "domains": 2, "topology": "2x2x4"},
        {"name": "gb200", "accelerator": "gb200-nvl72", "region": "us-central1", "domains": 11, "ep_domain_chips": 64},
    ]
}
FAKE = None  # the FakeKube the backend under test talks to


class FakeKube:
    """CoreV1Api + BatchV1Api + CustomObjectsApi in one object, recording calls."""

    def __init__(self, tmp: Path, fail: tuple[int, int] | None = None):
        self.tmp, self.fail = tmp, fail
        self.calls: list[tuple[str, str, str]] = []  # (verb, kind, name)
        self.objects: dict[tuple[str, str], object] = {}
        self.pods: list[k8s.V1Pod] = []
        self.logs: dict[str, str] = {}
        self.spec_json: str | None = None

    # -- create --
    def _create(self, kind, namespace, body):
        name = body["metadata"]["name"] if isinstance(body, dict) else body.metadata.name
        assert namespace == "marin"
        self.calls.append(("create", kind, name))
        self.objects[(kind, name)] = body

    def create_namespaced_custom_object(self, group, version, namespace, plural, body):
        assert (group, version, plural) == ("resource.nvidia.com", "v1beta1", "computedomains")
        self._create("ComputeDomain", namespace, body)

    def create_namespaced_config_map(self, namespace, body):
        self._create("ConfigMap", namespace, body)
        self.spec_json = body.data["spec.json"]

    def create_namespaced_service(self, namespace, body):
        self._create("Service", namespace, body)

    def create_namespaced_job(self, namespace, body):
        self._create("Job", namespace, body)
        self._kubelet(body)

    # -- the kubelet: pods for each completion index; process 0 really runs --
    def _kubelet(self, job: k8s.V1Job):
        labels = job.spec.template.metadata.labels
        domain = int(labels["marin/domain"])
        [container] = job.spec.template.spec.containers
        env = {e.name: e.value for e in container.env if e.value is not None}
        assert container.command == ["python", "-m", WORKER_MODULE, "--spec", "/etc/marin/spec.json"]
        for index in range(job.spec.completions):
            name = f"{job.metadata.name}-{index}-x7k2p"
            failed = self.fail == (domain, index)
            pod_env = {**env, "JOB_COMPLETION_INDEX": str(index)}
            if jax_distributed_args(pod_env)["process_id"] == 0:
                self.logs[name] = self._run_standin(pod_env)
            elif failed:
                self.logs[name] = "\n".join(f"worker line {i}" for i in range(100)) + "\nRuntimeError: NCCL timeout"
            self.pods.append(
                k8s.V1Pod(
                    metadata=k8s.V1ObjectMeta(
                        name=name, labels=dict(labels), annotations={"batch.kubernetes.io/job-completion-index": str(index)}
                    ),
                    status=k8s.V1PodStatus(
                        phase="Failed" if failed else "Succeeded",
                        container_statuses=[
                            k8s.V1ContainerStatus(
                                name="jax",
                                image="x",
                                image_id="x",
                                ready=False,
                                restart_count=0,
                                state=k8s.V1ContainerState(
                                    terminated=k8s.V1ContainerStateTerminated(
                                        exit_code=1 if failed else 0, reason="Error" if failed else "Completed"
                                    )
                                ),
                            )
                        ],
                    ),
                )
            )

    def _run_standin(self, pod_env) -> str:
        spec = json.loads(self.spec_json)
        spec["out_dir"] = str(self.tmp / "bucket")  # the object store the pods would share
        path = self.tmp / "spec.json"
        path.write_text(json.dumps(spec))
        proc = subprocess.run(
            [sys.executable, STANDIN, "--spec", str(path)],
            env={"PATH": "/usr/bin:/bin", **pod_env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stderr

    # -- read --
    def list_namespaced_pod(self, namespace, label_selector=None, field_selector=None, **_):
        self.calls.append(("list", "Pod", label_selector or field_selector))
        key, _, value = (label_selector or "").partition("=")
        if getattr(self, "pods_hidden", False):
            return k8s.V1PodList(items=[])
        return k8s.V1PodList(items=[p for p in self.pods if p.metadata.labels.get(key) == value])

    def read_namespaced_pod_log(
        self, name, namespace, follow=False, timestamps=False, tail_lines=None, _preload_content=True, **_
    ):
        self.calls.append(("read_log", "Pod", name))
        lines = self.logs.get(name, "").splitlines()
        if tail_lines is not None:
            lines = lines[-tail_lines:]
        if timestamps:
            lines = [f"2026-11-30T03:00:00.{i:06d}Z {line}" for i, line in enumerate(lines)]  # kubelet stamps
        text = "\n".join(lines) + "\n"
        return [text.encode()] if not _preload_content else text

    def read_namespaced_job_status(self, name, namespace, **_):
        self.calls.append(("read_status", "Job", name))
        job = self.objects[("Job", name)]
        mine = [p for p in self.pods if p.metadata.name.startswith(f"{name}-")]
        return k8s.V1Job(
            status=k8s.V1JobStatus(
                succeeded=sum(p.status.phase == "Succeeded" for p in mine),
                failed=sum(p.status.phase == "Failed" for p in mine),
                active=0,
            )
        )

    # -- delete --
    def _delete(self, kind, name):
        self.calls.append(("delete", kind, name))
        self.objects.pop((kind, name))

    def delete_namespaced_job(self, name, namespace, propagation_policy=None, **_):
        assert propagation_policy == "Background"  # its pods go too
        self._delete("Job", name)

    def delete_namespaced_service(self, name, namespace, **_):
        self._delete("Service", name)

    def delete_namespaced_config_map(self, name, namespace, **_):
        self._delete("ConfigMap", name)

    def delete_namespaced_custom_object(self, group, version, namespace, plural, name, **_):
        self._delete("ComputeDomain", name)


class FakeClusterBackend(KubernetesTrainingBackend):
    def apis(self):
        from marin_assets.orchestration.training_backends import KubeApis

        return KubeApis(FAKE, FAKE, FAKE)


@pytest.fixture
def fake(tmp_path):
    global FAKE
    fleet = tmp_path / "fleet.json"
    fleet.write_text(json.dumps(FLEET))
    FAKE = FakeKube(tmp_path)
    yield (
        FAKE,
        FakeClusterBackend(
            fleet_file=str(fleet),
            namespace="marin",
            image="marin:test",
            poll_interval_s=0.01,
            log_reader_join_s=30,
            log_tail_lines=4,
        ),
    )
    FAKE = None


def _remote_spec():
    return tiny_spec("gs://marin-ckpt/train/demo/kestrel", caches={"sotu": "gs://marin-data/sotu/train"})


def _validate(obj):
    d = k8s.ApiClient().sanitize_for_serialization(obj)
    assert kubernetes_validate.validate(d, "1.32", strict=True) == "1.32"
    assert round_trip(obj) == obj


def _check_compute_domain(cd: dict, namespace: str):
    """ComputeDomain is a CRD (no schema in kubernetes-validate): its documented fields only."""
    assert cd["apiVersion"] == "resource.nvidia.com/v1beta1" and cd["kind"] == "ComputeDomain"
    assert set(cd) == {"apiVersion", "kind", "metadata", "spec"}
    assert cd["metadata"]["namespace"] == namespace
    assert set(cd["spec"]) <= {"numNodes", "channel"} and cd["spec"]["numNodes"] == 0
    assert set(cd["spec"]["channel"]) <= {"resourceClaimTemplate", "allocationMode"}
    assert set(cd["spec"]["channel"]["resourceClaimTemplate"]) == {"name"}


def _env(job):
    return {e.name: e.value for e in job.spec.template.spec.containers[0].env if e.value is not None}


def _check_success_and_cleanup(fake, result):
    assert result.success
    [mat] = result.asset_materializations_for_node("phase")
    meta = {k: getattr(v, "value", v) for k, v in mat.metadata.items()}
    assert meta["final_step"] == 5 and meta["tokens_trained"] == 5 * 512 and meta["steps_reported"] == 5
    assert meta["backend"].startswith("kubernetes(train-")
    created = [(k, n) for v, k, n in fake.calls if v == "create"]
    deleted = [(k, n) for v, k, n in fake.calls if v == "delete"]
    assert deleted == created[::-1] and fake.objects == {}


def test_tpu_v5p_16_chips(fake):
    kube, backend = fake
    tags = {"marin/accelerator": "tpu-v5p", "marin/chips": "16"}
    objects = {}
    original = kube._create

    def keep(kind, namespace, body):  # keep a copy: cleanup empties kube.objects
        original(kind, namespace, body)
        objects.setdefault(kind, []).append(body)

    kube._create = keep
    result = materialize_with(backend, _remote_spec(), tags=tags)
    _check_success_and_cleanup(kube, result)
    assert sorted(objects) == ["ConfigMap", "Job", "Service"]  # no ComputeDomain on TPU
    [service], [config_map], [job] = objects["Service"], objects["ConfigMap"], objects["Job"]
    for obj in (service, config_map, job):
        _validate(obj)
    name = service.metadata.name
    assert (job.spec.completion_mode, job.spec.completions, job.spec.parallelism) == ("Indexed", 4, 4)
    pod = job.spec.template.spec
    assert pod.subdomain == name
    assert pod.node_selector == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
        "cloud.google.com/gke-tpu-topology": "2x2x4",
    }
    assert [(t.key, t.operator, t.effect) for t in pod.tolerations] == [("google.com/tpu", "Exists", "NoSchedule")]
    [c] = pod.containers
    assert c.resources.limits == c.resources.requests == {"google.com/tpu": "4"}
    env = _env(job)
    assert env["JAX_COORDINATOR_ADDRESS"] == f"{name}-r0-0.{name}.marin.svc:8476"
    assert env["JAX_NUM_PROCESSES"] == "4" and env["MARIN_PROCESS_OFFSET"] == "0"
    assert {"DAGSTER_PIPES_CONTEXT", "DAGSTER_PIPES_MESSAGES"} <= set(env)
    spec = json.loads(config_map.data["spec.json"])
    assert spec["out_dir"] == "gs://marin-ckpt/train/demo/kestrel" and spec["config"]["num_steps"] == 5
    assert pod.volumes[0].config_map.name == config_map.metadata.name
    assert c.volume_mounts[0].mount_path == "/etc/marin"


def test_two_rack_gb200(fake):
    kube, backend = fake
    objects = {}
    original = kube._create
    kube._create = lambda kind, ns, body: (original(kind, ns, body), objects.setdefault(kind, []).append(body))
    result = materialize_with(backend, _remote_spec(), tags={"marin/accelerator": "gb200-nvl72", "marin/chips": "144"})
    _check_success_and_cleanup(kube, result)
    kinds = [k for v, k, _ in kube.calls if v == "create"]
    assert kinds == ["ComputeDomain", "ComputeDomain", "ConfigMap", "Service", "Job", "Job"]  # claims exist before pods
    for cd in objects["ComputeDomain"]:
        _check_compute_domain(cd, "marin")
    _validate(objects["Service"][0])
    _validate(objects["ConfigMap"][0])
    ids = set()
    for rack, job in enumerate(objects["Job"]):
        _validate(job)
        assert job.spec.completions == job.spec.parallelism == 18
        pod = job.spec.template.spec
        [c] = pod.containers
        assert c.resources.limits == {"nvidia.com/gpu": "4"}
        assert pod.node_selector is None
        term = pod.affinity.pod_affinity.required_during_scheduling_ignored_during_execution[0]
        assert term.topology_key == "nvidia.com/gpu.clique"
        assert term.label_selector.match_labels["marin/domain"] == str(rack)
        [claim] = pod.resource_claims
        assert (
            claim.resource_claim_template_name
            == objects["ComputeDomain"][rack]["spec"]["channel"]["resourceClaimTemplate"]["name"]
        )
        assert [cl.name for cl in c.resources.claims] == [claim.name]
        env = _env(job)
        assert env["JAX_NUM_PROCESSES"] == "36" and env["NCCL_MNNVL_ENABLE"] == "1"
        for i in range(18):
            ids.add(jax_distributed_args({**env, "JOB_COMPLETION_INDEX": str(i)})["process_id"])
    assert ids == set(range(36))
    _check_rbac_covers(kube.calls)


# (verb, kind) recorded by the fake -> (apiGroup, resource, verb) the API server checks
_PERMISSION = {
    ("create", "Job"): ("batch", "jobs", "create"),
    ("delete", "Job"): ("batch", "jobs", "delete"),
    ("read_status", "Job"): ("batch", "jobs/status", "get"),
    ("create", "Service"): ("", "services", "create"),
    ("delete", "Service"): ("", "services", "delete"),
    ("create", "ConfigMap"): ("", "configmaps", "create"),
    ("delete", "ConfigMap"): ("", "configmaps", "delete"),
    ("list", "Pod"): ("", "pods", "list"),
    ("read_log", "Pod"): ("", "pods/log", "get"),
    ("create", "ComputeDomain"): ("resource.nvidia.com", "computedomains", "create"),
    ("delete", "ComputeDomain"): ("resource.nvidia.com", "computedomains", "delete"),
}


def _check_rbac_covers(calls):
    """The Role from trainer_rbac grants every call the backend made (and the fake saw them all)."""
    [role, _] = trainer_rbac("marin", "marin-trainer")
    granted = {(g, r, v) for rule in role.rules for g in rule.api_groups for r in rule.resources for v in rule.verbs}
    needed = {_PERMISSION[(verb, kind)] for verb, kind, _ in calls}
    assert needed <= granted, needed - granted
    assert len(needed) == len(_PERMISSION)  # the 2-rack GB200 launch exercises every kind of call


def test_a_failed_pod_fails_the_step_with_its_last_lines_and_cleans_up(fake):
    kube, backend = fake
    kube.fail = (1, 3)  # rack 1, host 3
    result = materialize_with(
        backend, _remote_spec(), tags={"marin/accelerator": "gb200-nvl72", "marin/chips": "144"}, raise_on_error=False
    )
    text = step_error_text(result)
    assert "-r1-3-x7k2p (domain 1 index 3) failed (Error, exit code 1)" in text
    assert "RuntimeError: NCCL timeout" in text and "worker line 97" in text and "worker line 96" not in text
    created = [(k, n) for v, k, n in kube.calls if v == "create"]
    assert len(created) == 6 and kube.objects == {}
    assert [(k, n) for v, k, n in kube.calls if v == "delete"] == created[::-1]


def test_a_failed_job_without_pods_fails_the_step(fake):
    """A Job that failed (deadline, evicted pods already gone) still ends the watch, and cleanup runs."""
    kube, backend = fake
    original = kube.read_namespaced_job_status

    def deadline_exceeded(name, namespace, **kw):
        original(name, namespace, **kw)
        return k8s.V1Job(
            status=k8s.V1JobStatus(
                failed=0,
                conditions=[
                    k8s.V1JobCondition(
                        type="Failed", status="True", reason="DeadlineExceeded", message="Job was active longer than specified"
                    )
                ],
            )
        )

    kube.read_namespaced_job_status = deadline_exceeded
    kube.pods_hidden = True
    result = materialize_with(
        backend, _remote_spec(), tags={"marin/accelerator": "tpu-v5p", "marin/chips": "16"}, raise_on_error=False
    )
    assert "-r0 failed (DeadlineExceeded: Job was active longer than specified)" in step_error_text(result)
    assert kube.objects == {} and len([c for c in kube.calls if c[0] == "delete"]) == 3


def test_bad_requests_are_refused_before_anything_is_created(fake):
    kube, backend = fake
    cases = [
        ({"marin/accelerator": "tpu-v5p", "marin/chips": "20"}, _remote_spec(), "not a whole number of domains"),
        ({"marin/accelerator": "cpu"}, _remote_spec(), "train CPU runs with the local"),
        ({"marin/accelerator": "tpu-v5p", "marin/chips": "64"}, _remote_spec(), "largest matching pool"),
        ({"marin/accelerator": "tpu-v5p", "marin/chips": "16"}, tiny_spec("/tmp/out"), "local paths the pods cannot see"),
        ({"marin/accelerator": "tpu-v5p", "marin/chips": "16", "marin/pool": "gb200"}, _remote_spec(), "marin/pool"),
    ]
    for tags, spec, needle in cases:
        result = materialize_with(backend, spec, tags=tags, raise_on_error=False)
        assert needle in step_error_text(result), tags
    assert [c for c in kube.calls if c[0] == "create"] == []


def test_choose_pool_prefers_the_pool_tag():
    fleet = fleet_from_dict(
        {
            "pools": [
                *FLEET["pools"],
                {"name": "v5p-16b", "accelerator": "tpu-v5p", "region": "us-east5", "domains": 1, "topology": "2x2x4"},
            ]
        }
    )
    assert choose_pool(fleet, {"marin/accelerator": "tpu-v5p", "marin/chips": "16"})[0].name == "v5p-16"
    tags = {"marin/accelerator": "tpu-v5p", "marin/chips": "16", "marin/pool": "v5p-16b"}
    assert choose_pool(fleet, tags)[0].name == "v5p-16b"
    assert pool_tags(fleet, {"marin/accelerator": "gb200-nvl72", "marin/chips": "8"}) == {"marin/pool": "gb200"}
    with pytest.raises(ValueError, match="not a valid name"):
        choose_pool(fleet, {**tags, "marin/pool": "v5p;rm"})


def test_real_api_clients_come_from_the_named_kubeconfig_context(tmp_path):
    """Without a fake: the backend builds its clients from its own kubeconfig and context."""
    kubeconfig = tmp_path / "kubeconfig.yaml"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://tpu.example.invalid:6443'}\n"
        "users:\n- name: u\n  user: {token: not-a-real-token}\ncontexts:\n- name: ctx\n  context: {cluster: c, user: u}\n"
        "current-context: ctx\n"
    )
    before = k8s.Configuration.get_default_copy().host
    apis = KubernetesTrainingBackend(fleet_file="unused", kubeconfig_file=str(kubeconfig), kube_context="ctx").apis()
    assert {a.api_client.configuration.host for a in (apis.core, apis.batch, apis.custom)} == {"https://tpu.example.invalid:6443"}
    assert k8s.Configuration.get_default_copy().host == before
    with pytest.raises(Exception, match="[Ss]ervice"):  # not in a pod: no service account to load
        KubernetesTrainingBackend(fleet_file="unused").apis()
