"""Kubernetes manifests: everything a multi-host JAX job needs (``multihost_jax_manifests``), a CPU
step pod, and the RBAC that lets the training backend launch jobs.

Shape of a JAX job (one per domain, so the scheduler can never spread a domain's pods elsewhere):

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
pod affinity on ``nvidia.com/gpu.clique``; NCCL is told to use multi-node NVLink. A pool's
``ep_domain_chips`` reaches every pod as ``MARIN_EP_DOMAIN_CHIPS``, the bound of the training
mesh's expert axis (which then spans the processes of one EP domain).

Commands are argument lists (never a shell string). Names and the image are checked before
any object is built, against the rules the API server and the container runtime apply
(``check_k8s_name``, ``check_image``), so a bad one is a one-line ValueError here, not a
rejected object halfway through a launch.

Where the parts live: the checks in k8s_checks.py, the job's size in job_shape.py, each
object's builder in job_objects.py, the pods' environment (and ``jax_distributed_args``) in
jax_env.py, the lazily imported client and ``round_trip``/``to_dicts`` in k8s_client.py. The
names other code imports from here are re-exported.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from marin_assets.cluster.fleet import ACCELERATOR_SPECS, Pool
from marin_assets.cluster.jax_env import jax_distributed_args, pod_env
from marin_assets.cluster.job_objects import (
    COMPUTE_DOMAIN_API,
    DOMAIN_LABEL,
    JOB_LABEL,
    SPEC_FILE,
    SPEC_MOUNT,
    compute_domain,
    domain_job,
    headless_service,
    spec_config_map,
    spec_map_name,
    tolerations,
)
from marin_assets.cluster.job_shape import JobShape, job_shape
from marin_assets.cluster.k8s_checks import (
    check_command,
    check_image,
    check_job_name,
    check_k8s_name,
    check_pod_hostnames,
)
from marin_assets.cluster.k8s_client import k8s, round_trip, to_dicts
from marin_assets.cluster.tags import check_name
from marin_assets.knobs import knob

__all__ = [
    "COMPUTE_DOMAIN_API",
    "DOMAIN_LABEL",
    "JOB_LABEL",
    "SPEC_FILE",
    "SPEC_MOUNT",
    "JobShape",
    "ManifestConfig",
    "check_image",
    "check_k8s_name",
    "compute_domain",
    "cpu_pod",
    "cpu_step_k8s_config",
    "headless_service",
    "jax_distributed_args",
    "job_shape",
    "multihost_jax_manifests",
    "round_trip",
    "spec_config_map",
    "to_dicts",
    "trainer_rbac",
]

GPU_CLIQUE_KEY = "nvidia.com/gpu.clique"  # the NVLink domain of a GB200 node


@dataclass(frozen=True)
class ManifestConfig:
    """Where a multi-host job goes. Knobs (marin_assets/knobs.py): `marin cluster manifest` flags
    and ``multihost_jax_manifests``'s defaults (which checks the values)."""

    domains: int = knob(1, help="whole domains (slices/racks)")
    namespace: str = knob("default", help="Kubernetes namespace of the objects")


_DEFAULTS = ManifestConfig()


def multihost_jax_manifests(
    name: str,
    pool: Pool,
    *,
    image: str,
    command: Sequence[str],
    domains: int = _DEFAULTS.domains,
    namespace: str = _DEFAULTS.namespace,
    env: Mapping[str, str] | None = None,
    chips: int | None = None,
    spec_json: str | None = None,
) -> list[Any]:
    """Everything a JAX job on ``pool`` needs, in creation order.

    Size: ``chips`` (shaped by ``job_shape``), or else ``domains`` whole domains.
    Objects: a ComputeDomain per GB200 rack (CRD dicts; multi-node NVLink needs IMEX
    channels), a ConfigMap holding ``spec_json`` if given (mounted at SPEC_MOUNT), the
    headless Service, and one Indexed Job per domain.
    """
    check_job_name(name)
    check_k8s_name("namespace", namespace, "DNS-1123 label")
    check_image(image)
    command = check_command(command)
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
    check_pod_hostnames(name, domains, hosts)
    service = name
    node_selector = None
    affinity = None
    if spec.is_tpu:
        if spec.gke_accelerator is None or pool.topology is None:  # Pool and ACCELERATOR_SPECS give a TPU pool both
            raise ValueError(f"{name}: TPU pool {pool.name} needs a GKE accelerator and a topology")
        node_selector = {
            "cloud.google.com/gke-tpu-accelerator": spec.gke_accelerator,
            "cloud.google.com/gke-tpu-topology": pool.topology,
        }
    # Racks of a GB200 pool need IMEX channels for multi-node NVLink; one ComputeDomain per rack.
    nvlink_racks = pool.accelerator == "gb200-nvl72" and hosts > 1
    objects: list[Any] = []
    if nvlink_racks:
        objects += [compute_domain(f"{name}-r{d}", namespace, name) for d in range(domains)]
    spec_map = None
    if spec_json is not None:
        spec_map = spec_map_name(name)
        objects.append(spec_config_map(name, namespace, spec_json))
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
        domain_env = pod_env(
            name,
            service,
            namespace,
            domain=d,
            domains=domains,
            hosts=hosts,
            tpu=spec.is_tpu,
            ep_domain_chips=pool.ep_domain_chips,
            extra=env,
        )
        objects.append(
            domain_job(
                name=name,
                namespace=namespace,
                domain=d,
                hosts=hosts,
                image=image,
                command=command,
                env=domain_env,
                resources={cast(str, spec.chip_resource): str(shape.chips_per_host)},  # every spec names its resource
                node_selector=node_selector,
                affinity=affinity,
                service=service,
                tolerations=tolerations(spec.is_tpu),
                claim_template=f"{name}-r{d}-channel" if nvlink_racks else None,
                spec_map=spec_map,
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
    role = k8s.V1Role(
        api_version="rbac.authorization.k8s.io/v1",
        kind="Role",
        metadata=k8s.V1ObjectMeta(name=name, namespace=namespace),
        rules=rules,
    )
    binding = k8s.V1RoleBinding(
        api_version="rbac.authorization.k8s.io/v1",
        kind="RoleBinding",
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


def cpu_pod(
    name: str,
    *,
    image: str,
    command: Sequence[str],
    cores: int,
    memory_gib: int,
    namespace: str = "default",
    node_pool: str | None = None,
) -> k8s.V1Pod:
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
                    name="step",
                    image=image,
                    command=check_command(command),
                    resources=k8s.V1ResourceRequirements(requests=res["requests"], limits=res["limits"]),
                )
            ],
        ),
    )
