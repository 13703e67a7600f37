"""Multi-host JAX manifests round-trip through the kubernetes client models."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from marin_assets.cluster.fleet import Pool
from marin_assets.cluster.manifests import (
    cpu_pod,
    cpu_step_k8s_config,
    jax_distributed_args,
    multihost_jax_manifests,
    round_trip,
)


def _env(container):
    return {e.name: e.value for e in container.env if e.value is not None}


def test_v5e_256_slice():
    pool = Pool("v5e-256", "tpu-v5e", "us-west4", 1, topology="16x16")
    objs = multihost_jax_manifests("llama", pool, image="marin:1", command=["python", "-m", "train"],
                                   namespace="marin")
    service, job = objs
    for obj in objs:
        back = round_trip(obj)
        assert type(back) is type(obj) and back == obj
    assert isinstance(service, k8s.V1Service) and service.spec.cluster_ip == "None"
    assert isinstance(job, k8s.V1Job)
    assert (job.spec.completion_mode, job.spec.completions, job.spec.parallelism) == ("Indexed", 64, 64)
    pod = job.spec.template.spec
    assert pod.subdomain == service.metadata.name
    assert pod.node_selector == {"cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
                                 "cloud.google.com/gke-tpu-topology": "16x16"}
    [c] = pod.containers
    assert c.resources.limits == {"google.com/tpu": "4"}
    env = _env(c)
    assert env["JAX_COORDINATOR_ADDRESS"] == "llama-r0-0.llama.marin.svc:8476"
    assert env["JAX_NUM_PROCESSES"] == "64" and env["MARIN_PROCESS_OFFSET"] == "0"
    assert len(env["TPU_WORKER_HOSTNAMES"].split(",")) == 64
    # Service selects exactly the job's pods.
    assert service.spec.selector.items() <= job.spec.template.metadata.labels.items()
    # What a pod with completion index 63 hands to jax.distributed.initialize.
    args = jax_distributed_args({**env, "JOB_COMPLETION_INDEX": "63"})
    assert args == {"coordinator_address": "llama-r0-0.llama.marin.svc:8476", "num_processes": 64,
                    "process_id": 63}


def test_two_rack_gb200_job():
    pool = Pool("gb200", "gb200-nvl72", "us-central1", 11, ep_domain_chips=64)
    objs = multihost_jax_manifests("moe", pool, image="marin:1", command=["python", "train.py"], domains=2)
    assert [type(o).__name__ for o in objs] == ["V1Service", "V1Job", "V1Job"]
    for obj in objs:
        assert round_trip(obj) == obj
    ids = set()
    for rack, job in enumerate(objs[1:]):
        assert job.spec.completions == 18
        [c] = job.spec.template.spec.containers
        assert c.resources.limits == {"nvidia.com/gpu": "4"}
        env = _env(c)
        assert env["NCCL_MNNVL_ENABLE"] == "1" and env["JAX_NUM_PROCESSES"] == "36"
        term = job.spec.template.spec.affinity.pod_affinity.required_during_scheduling_ignored_during_execution[0]
        assert term.topology_key == "nvidia.com/gpu.clique"
        assert term.label_selector.match_labels["marin/domain"] == str(rack)
        for i in range(18):
            ids.add(jax_distributed_args({**env, "JOB_COMPLETION_INDEX": str(i)})["process_id"])
    assert ids == set(range(36))  # every process id exactly once across both racks


def test_cpu_pod_and_step_config():
    pod = cpu_pod("dedup-step", image="marin:1", command=["dagster", "api"], cores=8, memory_gib=32,
                  node_pool="cpu-pool")
    assert round_trip(pod) == pod
    assert pod.spec.containers[0].resources.requests == {"cpu": "8", "memory": "32Gi"}
    cfg = cpu_step_k8s_config(8, 32, node_pool="cpu-pool")
    assert cfg["pod_spec_config"]["node_selector"] == pod.spec.node_selector


def test_manifest_inputs_are_refused_cleanly():
    pool = Pool("v5e-256", "tpu-v5e", "us-west4", 1, topology="16x16")
    with pytest.raises(ValueError, match="never run through a shell"):
        multihost_jax_manifests("x", pool, image="i", command="python train.py; rm -rf /")
    with pytest.raises(ValueError, match="not a valid name"):
        multihost_jax_manifests("Bad_Name;", pool, image="i", command=["python"])
    with pytest.raises(ValueError, match="has 1 domains"):
        multihost_jax_manifests("x", pool, image="i", command=["python"], domains=2)
    with pytest.raises(ValueError, match="JOB_COMPLETION_INDEX"):
        jax_distributed_args({"JAX_NUM_PROCESSES": "4", "JAX_COORDINATOR_ADDRESS": "a:1"})
