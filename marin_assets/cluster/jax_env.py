"""The environment contract between a multi-host JAX job's manifests and its pods: what each
pod is told (``pod_env``) and what the pod makes of it (``jax_distributed_args``).

Process 0 of domain 0 (pod ``<job>-r0-0`` behind the job's headless Service) is the JAX
coordinator. The Job also sets ``MARIN_PROCESS_OFFSET`` (domain * hosts per domain) and
Kubernetes sets ``JOB_COMPLETION_INDEX``; their sum is the pod's JAX process id. A pool with an
``ep_domain_chips`` tells its pods ``MARIN_EP_DOMAIN_CHIPS``: the devices the training mesh's
expert axis may span (marin_assets/train/distributed/mesh.py ``expert_axis_size``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from marin_assets.settings import setting

COORDINATOR_PORT = 8476
NCCL_ENV = {
    "NCCL_MNNVL_ENABLE": "1",  # multi-node NVLink across the 18 trays of a rack
    "NCCL_NVLS_ENABLE": "1",  # NVLink SHARP for all-reduce inside the NVLink domain
    "NCCL_CUMEM_ENABLE": "1",
    "NCCL_DEBUG": "WARN",
}


def pod_env(
    name: str,
    service: str,
    namespace: str,
    *,
    domain: int,
    domains: int,
    hosts: int,
    tpu: bool,
    ep_domain_chips: int | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The variables every pod of domain ``domain`` of job ``name`` gets (``extra`` added last,
    except that a multislice TPU job's slice id and worker hostnames are always its own).
    ``ep_domain_chips``: the pool's expert-parallel domain, as MARIN_EP_DOMAIN_CHIPS."""
    env = {
        "JAX_COORDINATOR_ADDRESS": f"{name}-r0-0.{service}.{namespace}.svc:{COORDINATOR_PORT}",
        "JAX_NUM_PROCESSES": str(domains * hosts),
        "MARIN_HOSTS_PER_DOMAIN": str(hosts),
        "MARIN_NUM_DOMAINS": str(domains),
    }
    if ep_domain_chips is not None:
        env["MARIN_EP_DOMAIN_CHIPS"] = str(ep_domain_chips)
    if tpu:
        env["TPU_WORKER_HOSTNAMES"] = ",".join(f"{name}-r0-{i}.{service}" for i in range(hosts))
        if domains > 1:  # multislice: slices talk over DCN through the megascale coordinator
            env["MEGASCALE_NUM_SLICES"] = str(domains)
            env["MEGASCALE_COORDINATOR_ADDRESS"] = f"{name}-r0-0.{service}.{namespace}.svc"
    else:
        env.update(NCCL_ENV)
    env.update(extra or {})
    if tpu and domains > 1:
        env["MEGASCALE_SLICE_ID"] = str(domain)
        env["TPU_WORKER_HOSTNAMES"] = ",".join(f"{name}-r{domain}-{i}.{service}" for i in range(hosts))
    return env


def jax_distributed_args(env: Mapping[str, str]) -> dict[str, Any]:
    """``jax.distributed.initialize`` keyword arguments from a pod's environment."""
    try:
        process_id = int(setting("MARIN_PROCESS_OFFSET", env) or "0") + int(env["JOB_COMPLETION_INDEX"])
        num = int(env["JAX_NUM_PROCESSES"])
        coordinator = env["JAX_COORDINATOR_ADDRESS"]
    except KeyError as err:
        raise ValueError(f"pod environment lacks {err}; was it started from a marin manifest?") from None
    if not 0 <= process_id < num:
        raise ValueError(f"process id {process_id} is outside [0, {num})")
    return {"coordinator_address": coordinator, "num_processes": num, "process_id": process_id}
