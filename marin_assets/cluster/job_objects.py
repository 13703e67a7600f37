"""The Kubernetes objects of a multi-host JAX job, one builder each: the headless Service, a
rack's ComputeDomain, the training-spec ConfigMap and a domain's Indexed Job, with the labels
that tie them to their job. Which of them a job needs, and with what, is manifests.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from marin_assets.cluster.jax_env import COORDINATOR_PORT
from marin_assets.cluster.k8s_client import k8s

JOB_LABEL = "marin/job"
DOMAIN_LABEL = "marin/domain"
TPU_TAINT = "google.com/tpu"  # GKE taints TPU nodes so only pods that ask for chips land there
GPU_TAINT = "nvidia.com/gpu"  # likewise for GPU node pools
COMPUTE_DOMAIN_API = ("resource.nvidia.com", "v1beta1", "computedomains")  # group, version, plural
IMEX_CLAIM = "imex-channel"  # the pod's name for its ComputeDomain channel claim
SPEC_MOUNT = "/etc/marin"  # where the training spec ConfigMap is mounted in each pod
SPEC_FILE = "spec.json"


def _env(values: Mapping[str, str]) -> list[k8s.V1EnvVar]:
    return [k8s.V1EnvVar(name=k, value=str(v)) for k, v in values.items()]


def headless_service(name: str, namespace: str) -> k8s.V1Service:
    """The job's headless Service ``name``: a DNS record per pod (``<pod>.<name>``), no load balancing."""
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


def spec_map_name(name: str) -> str:
    """The name of job ``name``'s spec ConfigMap (``spec_config_map``)."""
    return f"{name}-spec"


def spec_config_map(name: str, namespace: str, spec_json: str) -> k8s.V1ConfigMap:
    """The training spec handed to every worker pod as ``SPEC_MOUNT/SPEC_FILE``."""
    if len(spec_json.encode()) > 900_000:  # the API server refuses objects over ~1 MiB
        raise ValueError(f"{name}: training spec is {len(spec_json.encode())} bytes; a ConfigMap holds < 1 MiB")
    return k8s.V1ConfigMap(
        api_version="v1",
        kind="ConfigMap",
        metadata=k8s.V1ObjectMeta(name=spec_map_name(name), namespace=namespace, labels={JOB_LABEL: name}),
        data={SPEC_FILE: spec_json},
    )


def tolerations(spec_is_tpu: bool) -> list[k8s.V1Toleration]:
    key = TPU_TAINT if spec_is_tpu else GPU_TAINT
    return [k8s.V1Toleration(key=key, operator="Exists", effect="NoSchedule")]


def domain_job(
    *,
    name: str,
    namespace: str,
    domain: int,
    hosts: int,
    image: str,
    command: list[str],
    env: Mapping[str, str],
    resources: Mapping[str, str],
    node_selector: Mapping[str, str] | None,
    affinity: k8s.V1Affinity | None,
    service: str,
    tolerations: list[k8s.V1Toleration],
    claim_template: str | None,
    spec_map: str | None,
) -> k8s.V1Job:
    """The Indexed Job ``<name>-r<domain>`` of one domain: ``hosts`` pods that start together, on
    the nodes ``node_selector`` and ``affinity`` pick, each told its process offset in the job."""
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
        env=_env(env)
        + [
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
            limits=dict(resources),
            requests=dict(resources),
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
                    if claim_template
                    else None,
                ),
            ),
        ),
    )
