"""Kubernetes manifests for multi-host JAX jobs, built from the ``kubernetes`` client models.

Shape (one per domain, so the scheduler can never spread a domain's pods elsewhere):

* a headless Service selecting every pod of the job, so pod ``<job>-<i>`` of an Indexed
  Job is reachable as ``<job>-<i>.<service>``; process 0's address is the JAX coordinator;
* one Indexed Job per interconnect domain (a TPU slice, a GB200 rack), one pod per host.
  Kubernetes sets ``JOB_COMPLETION_INDEX`` in each pod; the pod's JAX process id is
  ``MARIN_PROCESS_OFFSET + JOB_COMPLETION_INDEX`` (the offset is domain * hosts per
  domain), which ``jax_distributed_args`` turns into ``jax.distributed.initialize``
  arguments together with ``JAX_COORDINATOR_ADDRESS`` and ``JAX_NUM_PROCESSES``.

TPU pods select their slice with the GKE labels ``cloud.google.com/gke-tpu-accelerator`` and
``cloud.google.com/gke-tpu-topology`` and request ``google.com/tpu`` chips per host. GB200
pods request ``nvidia.com/gpu`` and are pinned to one NVLink domain per rack with a required
pod affinity on ``nvidia.com/gpu.clique``; NCCL is told to use multi-node NVLink.

Commands are argument lists (never a shell string). Names and the image are checked before
any object is built, against the rules the API server and the container runtime apply
(``check_k8s_name``, ``check_image``), so a bad one is a one-line ValueError here, not a
rejected object halfway through a launch.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from marin_assets.cluster.fleet import ACCELERATOR_SPECS, Pool
from marin_assets.cluster.tags import check_name
from marin_assets.knobs import knob


class _KubernetesClient:
    """``kubernetes.client``, imported on first use: the ``marin`` command reads this module's
    knobs (ManifestConfig) for its flags on every start, and the client took 0.7 s to import."""

    def __getattr__(self, name: str) -> Any:
        from kubernetes import client

        return getattr(client, name)


if TYPE_CHECKING:
    from kubernetes import client as k8s
else:
    k8s = _KubernetesClient()

COORDINATOR_PORT = 8476
JOB_LABEL = "marin/job"
DOMAIN_LABEL = "marin/domain"
GPU_CLIQUE_KEY = "nvidia.com/gpu.clique"  # the NVLink domain of a GB200 node
NCCL_ENV = {
    "NCCL_MNNVL_ENABLE": "1",  # multi-node NVLink across the 18 trays of a rack
    "NCCL_NVLS_ENABLE": "1",  # NVLink SHARP for all-reduce inside the NVLink domain
    "NCCL_CUMEM_ENABLE": "1",
    "NCCL_DEBUG": "WARN",
}


def _check_command(command: Sequence[str]) -> list[str]:
    if isinstance(command, str) or not command or not all(isinstance(a, str) for a in command):
        raise ValueError("command must be a non-empty list of strings (it is never run through a shell)")
    return list(command)


# Object-name rules, from https://kubernetes.io/docs/concepts/overview/working-with-objects/names/
# (fullmatch; "$" would accept a trailing newline). Each value: (pattern, max length, what it says).
K8S_NAME_RULES = {
    # Service names; a Service name becomes a DNS label, so it must start with a letter.
    "DNS-1035 label": (re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?"), 63,
                       "lower-case letters, digits and '-', starting with a letter and ending with a letter or digit"),
    # Namespaces and pod hostnames.
    "DNS-1123 label": (re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"), 63,
                       "lower-case letters, digits and '-', starting and ending with a letter or digit"),
}


def check_k8s_name(field: str, value: str, rule: str) -> str:
    """``value`` if it is a valid ``rule`` name (a key of K8S_NAME_RULES), else a ValueError naming ``field``."""
    pattern, max_len, says = K8S_NAME_RULES[rule]
    if not isinstance(value, str) or not pattern.fullmatch(value) or len(value) > max_len:
        shown = repr(value[:80]) if isinstance(value, str) else repr(value)
        raise ValueError(f"{field} {shown} is not a {rule} (at most {max_len} characters: {says})")
    return value


# The image reference grammar of github.com/distribution/reference (reference.go), which the
# container runtime parses before a pull: [domain/]path[:tag][@digest], the name at most 255 characters.
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[_.]|__|-+)[a-z0-9]+)*"
_IMAGE_RE = re.compile(
    rf"(?P<name>(?:{_HOST}(?::[0-9]+)?/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    r"(?::[\w][\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?",
    re.ASCII,  # the grammar's \w is [A-Za-z0-9_]; Python's would take any Unicode letter
)
IMAGE_NAME_MAX = 255


def check_image(image: str) -> str:
    """``image`` if it is a container image reference (``[registry/]path[:tag][@digest]``), else a ValueError."""
    match = _IMAGE_RE.fullmatch(image) if isinstance(image, str) else None
    if match is None or len(match.group("name")) > IMAGE_NAME_MAX:
        shown = repr(image[:80]) if isinstance(image, str) else repr(image)
        raise ValueError(f"image {shown} is not a container image reference like 'us-docker.pkg.dev/p/repo/marin:1' "
                         f"([registry/]path[:tag][@digest], lower-case path, name at most {IMAGE_NAME_MAX} characters)")
    return image


def _check_job_name(name: str) -> str:
    # The job name is also the headless Service's name, so it must be a DNS-1035 label.
    return check_k8s_name("job name", name, "DNS-1035 label")


def _check_pod_hostnames(name: str, domains: int, hosts: int) -> None:
    # Indexed Job pods are named and hostnamed <job>-<index> with <job> = <name>-r<domain>. The Job docs
    # (kubernetes.io/docs/concepts/workloads/controllers/job/) ask for DNS-label Job names of at most
    # 63 characters, and a pod hostname is a DNS-1123 label: the longest of them decides.
    longest = f"{name}-r{domains - 1}-{hosts - 1}"
    if len(longest) > 63:
        raise ValueError(f"job name {name!r} is too long for {domains} domain(s) of {hosts} host(s): "
                         f"pod hostname {longest!r} would be {len(longest)} characters, and a pod hostname "
                         f"is a DNS-1123 label of at most 63 (shorten the name by {len(longest) - 63})")


def _env(values: Mapping[str, str]) -> list[k8s.V1EnvVar]:
    return [k8s.V1EnvVar(name=k, value=str(v)) for k, v in values.items()]


def headless_service(name: str, namespace: str) -> k8s.V1Service:
    return k8s.V1Service(
        api_version="v1",
        kind="Service",
        metadata=k8s.V1ObjectMeta(name=name, namespace=namespace, labels={JOB_LABEL: name}),
        spec=k8s.V1ServiceSpec(
            cluster_ip="None",  # headless: DNS records per pod, no load balancing
            selector={JOB_LABEL: name},
            publish_not_ready_addresses=True,  # workers resolve the coordinator before it is Ready
            ports=[k8s.V1ServicePort(name="coordinator", port=COORDINATOR_PORT)],
        ),
    )


TPU_TAINT = "google.com/tpu"  # GKE taints TPU nodes so only pods that ask for chips land there
GPU_TAINT = "nvidia.com/gpu"  # likewise for GPU node pools
COMPUTE_DOMAIN_API = ("resource.nvidia.com", "v1beta1", "computedomains")  # group, version, plural
IMEX_CLAIM = "imex-channel"  # the pod's name for its ComputeDomain channel claim
SPEC_MOUNT = "/etc/marin"  # where the training spec ConfigMap is mounted in each pod
SPEC_FILE = "spec.json"


@dataclass(frozen=True)
class JobShape:
    """How a job of ``chips`` chips sits on a pool: whole domains, hosts per domain, chips per host."""

    pool: Pool
    domains: int
    hosts_per_domain: int
    chips_per_host: int

    @property
    def chips(self) -> int:
        return self.domains * self.hosts_per_domain * self.chips_per_host

    @property
    def processes(self) -> int:
        return self.domains * self.hosts_per_domain


def job_shape(pool: Pool, chips: int) -> JobShape:
    """The shape of a ``chips``-chip job on ``pool``; ValueError naming the pool if it has none.

    A job larger than a domain, or any job on a whole-domain pool (a TPU slice), takes whole
    domains, so its size must be a multiple of the domain. A smaller job on a shared pool
    (GPU nodes, a GB200 rack) takes whole hosts of one domain, or part of a single host.
    """
    where = f"pool {pool.name} ({pool.accelerator}, {pool.domain_chips} chips per domain)"
    if isinstance(chips, bool) or not isinstance(chips, int) or chips < 1:
        raise ValueError(f"{where}: chips must be a positive integer, got {chips!r}")
    if pool.whole_domain or chips > pool.domain_chips:
        if chips % pool.domain_chips:
            raise ValueError(f"{where}: {chips} chips is not a whole number of domains; "
                             f"ask for a multiple of {pool.domain_chips}")
        domains = chips // pool.domain_chips
        if domains > pool.domains:
            raise ValueError(f"{where}: {chips} chips needs {domains} domains but the pool has {pool.domains}")
        return JobShape(pool, domains, pool.hosts_per_domain, pool.chips_per_host)
    if chips < pool.chips_per_host:
        return JobShape(pool, 1, 1, chips)
    if chips % pool.chips_per_host:
        raise ValueError(f"{where}: {chips} chips is not a whole number of hosts; "
                         f"ask for a multiple of {pool.chips_per_host}")
    return JobShape(pool, 1, chips // pool.chips_per_host, pool.chips_per_host)


def compute_domain(name: str, namespace: str, job: str) -> dict[str, Any]:
    """A ComputeDomain (NVIDIA DRA driver CRD) whose channel template gives pods IMEX channels.

    Multi-node NVLink between the trays of a GB200 rack needs an IMEX channel in every pod;
    ``numNodes: 0`` lets the domain follow whichever nodes the pods land on. A CRD, so a dict
    (the kubernetes client has no model for it); its fields are checked in the tests.
    """
    group, version, _ = COMPUTE_DOMAIN_API
    return {
        "apiVersion": f"{group}/{version}",
        "kind": "ComputeDomain",
        "metadata": {"name": name, "namespace": namespace, "labels": {JOB_LABEL: job}},
        "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": f"{name}-channel"}}},
    }


def spec_config_map(name: str, namespace: str, spec_json: str) -> k8s.V1ConfigMap:
    """The training spec handed to every worker pod as ``SPEC_MOUNT/SPEC_FILE``."""
    if len(spec_json.encode()) > 900_000:  # the API server refuses objects over ~1 MiB
        raise ValueError(f"{name}: training spec is {len(spec_json.encode())} bytes; a ConfigMap holds < 1 MiB")
    return k8s.V1ConfigMap(
        api_version="v1", kind="ConfigMap",
        metadata=k8s.V1ObjectMeta(name=f"{name}-spec", namespace=namespace, labels={JOB_LABEL: name}),
        data={SPEC_FILE: spec_json},
    )


def _tolerations(spec_is_tpu: bool) -> list[k8s.V1Toleration]:
    key = TPU_TAINT if spec_is_tpu else GPU_TAINT
    return [k8s.V1Toleration(key=key, operator="Exists", effect="NoSchedule")]


def _domain_job(
    *, name: str, namespace: str, domain: int, hosts: int, image: str, command: list[str],
    env: Mapping[str, str], resources: Mapping[str, str], node_selector: Mapping[str, str] | None,
    affinity: k8s.V1Affinity | None, service: str, tolerations: list[k8s.V1Toleration],
    claim_template: str | None, spec_map: str | None,
) -> k8s.V1Job:
    job_name = f"{name}-r{domain}"
    labels = {JOB_LABEL: name, DOMAIN_LABEL: str(domain)}
    volumes, mounts = None, None
    if spec_map is not None:
        volumes = [k8s.V1Volume(name="spec", config_map=k8s.V1ConfigMapVolumeSource(name=spec_map))]
        mounts = [k8s.V1VolumeMount(name="spec", mount_path=SPEC_MOUNT, read_only=True)]
    container = k8s.V1Container(
        name="jax",
        image=image,
        command=command,
        env=_env(env) + [
            k8s.V1EnvVar(name="MARIN_PROCESS_OFFSET", value=str(domain * hosts)),
            # The completion index doubles as the TPU worker id within the slice.
            k8s.V1EnvVar(
                name="TPU_WORKER_ID",
                value_from=k8s.V1EnvVarSource(
                    field_ref=k8s.V1ObjectFieldSelector(
                        field_path="metadata.annotations['batch.kubernetes.io/job-completion-index']"
                    )
                ),
            ),
        ],
        ports=[k8s.V1ContainerPort(container_port=COORDINATOR_PORT, name="coordinator")],
        resources=k8s.V1ResourceRequirements(
            limits=dict(resources), requests=dict(resources),
            claims=[k8s.CoreV1ResourceClaim(name=IMEX_CLAIM)] if claim_template else None,
        ),
        volume_mounts=mounts,
    )
    return k8s.V1Job(
        api_version="batch/v1",
        kind="Job",
        metadata=k8s.V1ObjectMeta(name=job_name, namespace=namespace, labels=labels),
        spec=k8s.V1JobSpec(
            completion_mode="Indexed",
            completions=hosts,
            parallelism=hosts,  # all hosts of a domain start together or the collective hangs
            backoff_limit=0,  # a lost host fails the domain; the router re-submits from a checkpoint
            template=k8s.V1PodTemplateSpec(
                metadata=k8s.V1ObjectMeta(labels=labels),
                spec=k8s.V1PodSpec(
                    subdomain=service,
                    restart_policy="Never",
                    node_selector=dict(node_selector) if node_selector else None,
                    affinity=affinity,
                    tolerations=tolerations,
                    containers=[container],
                    volumes=volumes,
                    resource_claims=[k8s.V1PodResourceClaim(name=IMEX_CLAIM, resource_claim_template_name=claim_template)]
                    if claim_template else None,
                ),
            ),
        ),
    )


@dataclass(frozen=True)
class ManifestConfig:
    """Where a multi-host job goes. Knobs (marin_assets/knobs.py): `marin cluster manifest` flags
    and ``multihost_jax_manifests``'s defaults (which checks the values)."""

    domains: int = knob(1, help="whole domains (slices/racks)")
    namespace: str = knob("default", help="Kubernetes namespace of the objects")


_DEFAULTS = ManifestConfig()


def multihost_jax_manifests(
    name: str, pool: Pool, *, image: str, command: Sequence[str], domains: int = _DEFAULTS.domains,
    namespace: str = _DEFAULTS.namespace, env: Mapping[str, str] | None = None, chips: int | None = None,
    spec_json: str | None = None,
) -> list[Any]:
    """Everything a JAX job on ``pool`` needs, in creation order.

    Size: ``chips`` (shaped by ``job_shape``), or else ``domains`` whole domains.
    Objects: a ComputeDomain per GB200 rack (CRD dicts; multi-node NVLink needs IMEX
    channels), a ConfigMap holding ``spec_json`` if given (mounted at SPEC_MOUNT), the
    headless Service, and one Indexed Job per domain.
    """
    _check_job_name(name)
    check_k8s_name("namespace", namespace, "DNS-1123 label")
    check_image(image)
    command = _check_command(command)
    spec = ACCELERATOR_SPECS[pool.accelerator]
    if pool.accelerator == "cpu":
        raise ValueError("use cpu_pod for CPU work")
    if chips is not None:
        shape = job_shape(pool, chips)
    else:
        if not 1 <= domains <= pool.domains:
            raise ValueError(f"{name}: pool {pool.name} has {pool.domains} domains, asked for {domains}")
        shape = JobShape(pool, domains, pool.hosts_per_domain, pool.chips_per_host)
    domains, hosts = shape.domains, shape.hosts_per_domain
    _check_pod_hostnames(name, domains, hosts)
    service = name
    coordinator = f"{name}-r0-0.{service}.{namespace}.svc:{COORDINATOR_PORT}"
    base_env = {
        "JAX_COORDINATOR_ADDRESS": coordinator,
        "JAX_NUM_PROCESSES": str(shape.processes),
        "MARIN_HOSTS_PER_DOMAIN": str(hosts),
        "MARIN_NUM_DOMAINS": str(domains),
    }
    node_selector = None
    affinity = None
    if spec.is_tpu:
        node_selector = {
            "cloud.google.com/gke-tpu-accelerator": spec.gke_accelerator,
            "cloud.google.com/gke-tpu-topology": pool.topology,
        }
        base_env["TPU_WORKER_HOSTNAMES"] = ",".join(f"{name}-r0-{i}.{service}" for i in range(hosts))
        if domains > 1:  # multislice: slices talk over DCN through the megascale coordinator
            base_env["MEGASCALE_NUM_SLICES"] = str(domains)
            base_env["MEGASCALE_COORDINATOR_ADDRESS"] = f"{name}-r0-0.{service}.{namespace}.svc"
    else:
        base_env.update(NCCL_ENV)
    base_env.update(env or {})
    # Racks of a GB200 pool need IMEX channels for multi-node NVLink; one ComputeDomain per rack.
    nvlink_racks = pool.accelerator == "gb200-nvl72" and hosts > 1
    objects: list[Any] = []
    if nvlink_racks:
        objects += [compute_domain(f"{name}-r{d}", namespace, name) for d in range(domains)]
    spec_map = None
    if spec_json is not None:
        config_map = spec_config_map(name, namespace, spec_json)
        spec_map = config_map.metadata.name
        objects.append(config_map)
    objects.append(headless_service(service, namespace))
    for d in range(domains):
        if not spec.is_tpu:
            # Every pod of rack d lands in the same NVLink domain as its siblings.
            affinity = k8s.V1Affinity(
                pod_affinity=k8s.V1PodAffinity(
                    required_during_scheduling_ignored_during_execution=[
                        k8s.V1PodAffinityTerm(
                            topology_key=GPU_CLIQUE_KEY,
                            label_selector=k8s.V1LabelSelector(match_labels={JOB_LABEL: name, DOMAIN_LABEL: str(d)}),
                        )
                    ]
                )
            )
        domain_env = dict(base_env)
        if spec.is_tpu and domains > 1:
            domain_env["MEGASCALE_SLICE_ID"] = str(d)
            domain_env["TPU_WORKER_HOSTNAMES"] = ",".join(f"{name}-r{d}-{i}.{service}" for i in range(hosts))
        objects.append(
            _domain_job(
                name=name, namespace=namespace, domain=d, hosts=hosts, image=image, command=command,
                env=domain_env, resources={spec.chip_resource: str(shape.chips_per_host)},
                node_selector=node_selector, affinity=affinity, service=service,
                tolerations=_tolerations(spec.is_tpu),
                claim_template=f"{name}-r{d}-channel" if nvlink_racks else None, spec_map=spec_map,
            )
        )
    return objects


def trainer_rbac(namespace: str, service_account: str) -> list[Any]:
    """Role + RoleBinding that let the run worker's service account launch training jobs.

    Exactly what ``KubernetesTrainingBackend`` calls: create/delete Jobs, Services, ConfigMaps
    and ComputeDomains; read Job status; list pods and read their logs (Pipes and failures).
    """
    check_name("namespace", namespace)
    check_name("service account", service_account)
    name = f"{service_account}-trainer"
    group, _, plural = COMPUTE_DOMAIN_API
    rules = [
        k8s.V1PolicyRule(api_groups=["batch"], resources=["jobs"], verbs=["create", "delete", "get"]),
        k8s.V1PolicyRule(api_groups=["batch"], resources=["jobs/status"], verbs=["get"]),
        k8s.V1PolicyRule(api_groups=[""], resources=["services", "configmaps"], verbs=["create", "delete"]),
        k8s.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=["list", "get"]),
        k8s.V1PolicyRule(api_groups=[""], resources=["pods/log"], verbs=["get"]),
        k8s.V1PolicyRule(api_groups=[group], resources=[plural], verbs=["create", "delete"]),
    ]
    role = k8s.V1Role(api_version="rbac.authorization.k8s.io/v1", kind="Role",
                      metadata=k8s.V1ObjectMeta(name=name, namespace=namespace), rules=rules)
    binding = k8s.V1RoleBinding(
        api_version="rbac.authorization.k8s.io/v1", kind="RoleBinding",
        metadata=k8s.V1ObjectMeta(name=name, namespace=namespace),
        role_ref=k8s.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=name),
        subjects=[k8s.RbacV1Subject(kind="ServiceAccount", name=service_account, namespace=namespace)],
    )
    return [role, binding]


def cpu_step_k8s_config(cores: int, memory_gib: int, *, node_pool: str | None = None) -> dict[str, Any]:
    """The ``dagster-k8s/config`` for one data-processing step pod under ``k8s_job_executor``."""
    if cores < 1 or memory_gib < 1:
        raise ValueError("cores and memory_gib must be >= 1")
    resources = {"cpu": str(cores), "memory": f"{memory_gib}Gi"}
    config: dict[str, Any] = {"container_config": {"resources": {"requests": resources, "limits": resources}}}
    if node_pool is not None:
        check_name("node pool", node_pool)
        config["pod_spec_config"] = {"node_selector": {"cloud.google.com/gke-nodepool": node_pool}}
    return config


def cpu_pod(name: str, *, image: str, command: Sequence[str], cores: int, memory_gib: int,
            namespace: str = "default", node_pool: str | None = None) -> k8s.V1Pod:
    """The pod that ``cpu_step_k8s_config`` describes, as a model object (for validation and dry runs)."""
    check_k8s_name("pod name", name, "DNS-1123 label")  # it is also the pod's hostname and a label value
    check_k8s_name("namespace", namespace, "DNS-1123 label")
    check_image(image)
    config = cpu_step_k8s_config(cores, memory_gib, node_pool=node_pool)
    res = config["container_config"]["resources"]
    return k8s.V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=k8s.V1ObjectMeta(name=name, namespace=namespace, labels={JOB_LABEL: name}),
        spec=k8s.V1PodSpec(
            restart_policy="Never",
            node_selector=config.get("pod_spec_config", {}).get("node_selector"),
            containers=[
                k8s.V1Container(
                    name="step", image=image, command=_check_command(command),
                    resources=k8s.V1ResourceRequirements(requests=res["requests"], limits=res["limits"]),
                )
            ],
        ),
    )


# ---- validation and the pod side ------------------------------------------------------------


class _Response:
    def __init__(self, data: str) -> None:
        self.data = data


def round_trip(obj: Any) -> Any:
    """Serialize a model to its API JSON and parse it back into the same model class.

    This is what the API server would receive; a wrong field name or type is lost or
    raises here, so equality with the original proves the manifest is well formed.
    """
    api = k8s.ApiClient()
    data = api.sanitize_for_serialization(obj)
    return api.deserialize(_Response(json.dumps(data)), type(obj).__name__)


def to_dicts(objects: Sequence[Any]) -> list[dict[str, Any]]:
    api = k8s.ApiClient()
    return [api.sanitize_for_serialization(o) for o in objects]


def jax_distributed_args(env: Mapping[str, str]) -> dict[str, Any]:
    """``jax.distributed.initialize`` keyword arguments from a pod's environment."""
    try:
        process_id = int(env.get("MARIN_PROCESS_OFFSET", "0")) + int(env["JOB_COMPLETION_INDEX"])
        num = int(env["JAX_NUM_PROCESSES"])
        coordinator = env["JAX_COORDINATOR_ADDRESS"]
    except KeyError as err:
        raise ValueError(f"pod environment lacks {err}; was it started from a marin manifest?") from None
    if not 0 <= process_id < num:
        raise ValueError(f"process id {process_id} is outside [0, {num})")
    return {"coordinator_address": coordinator, "num_processes": num, "process_id": process_id}
