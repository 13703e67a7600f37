"""Multi-host JAX manifests round-trip through the kubernetes client models."""

from __future__ import annotations

import kubernetes_validate
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes import client as k8s

from marin_assets.cluster.fleet import Pool
from marin_assets.cluster.manifests import (
    JobShape,
    cpu_pod,
    cpu_step_k8s_config,
    jax_distributed_args,
    job_shape,
    multihost_jax_manifests,
    round_trip,
    spec_config_map,
    to_dicts,
    trainer_rbac,
)


def _validate_strict(obj):
    """Built-in objects against the official 1.32 schemas (unknown fields rejected)."""
    d = k8s.ApiClient().sanitize_for_serialization(obj)
    assert kubernetes_validate.validate(d, "1.32", strict=True) == "1.32"


def _env(container):
    return {e.name: e.value for e in container.env if e.value is not None}


def test_v5e_256_slice():
    pool = Pool("v5e-256", "tpu-v5e", "us-west4", 1, topology="16x16")
    objs = multihost_jax_manifests("llama", pool, image="marin:1", command=["python", "-m", "train"], namespace="marin")
    service, job = objs
    for obj in objs:
        back = round_trip(obj)
        assert type(back) is type(obj) and back == obj
        _validate_strict(obj)
    assert isinstance(service, k8s.V1Service) and service.spec.cluster_ip == "None"
    assert isinstance(job, k8s.V1Job)
    assert (job.spec.completion_mode, job.spec.completions, job.spec.parallelism) == ("Indexed", 64, 64)
    pod = job.spec.template.spec
    assert pod.subdomain == service.metadata.name
    assert pod.node_selector == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
        "cloud.google.com/gke-tpu-topology": "16x16",
    }
    [c] = pod.containers
    assert c.resources.limits == {"google.com/tpu": "4"}
    assert [(t.key, t.effect) for t in pod.tolerations] == [("google.com/tpu", "NoSchedule")]
    env = _env(c)
    assert env["JAX_COORDINATOR_ADDRESS"] == "llama-r0-0.llama.marin.svc:8476"
    assert env["JAX_NUM_PROCESSES"] == "64" and env["MARIN_PROCESS_OFFSET"] == "0"
    assert len(env["TPU_WORKER_HOSTNAMES"].split(",")) == 64
    # Service selects exactly the job's pods.
    assert service.spec.selector.items() <= job.spec.template.metadata.labels.items()
    # What a pod with completion index 63 hands to jax.distributed.initialize.
    args = jax_distributed_args({**env, "JOB_COMPLETION_INDEX": "63"})
    assert args == {"coordinator_address": "llama-r0-0.llama.marin.svc:8476", "num_processes": 64, "process_id": 63}


def test_two_rack_gb200_job():
    pool = Pool("gb200", "gb200-nvl72", "us-central1", 11, ep_domain_chips=64)
    objs = multihost_jax_manifests("moe", pool, image="marin:1", command=["python", "train.py"], domains=2)
    assert [type(o).__name__ for o in objs] == ["dict", "dict", "V1Service", "V1Job", "V1Job"]
    domains = objs[:2]  # ComputeDomain CRDs: one per rack, created before the pods that claim them
    assert [d["metadata"]["name"] for d in domains] == ["moe-r0", "moe-r1"]
    assert all(
        d["spec"] == {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": f"{d['metadata']['name']}-channel"}}}
        for d in domains
    )
    for obj in objs[2:]:
        assert round_trip(obj) == obj
        _validate_strict(obj)
    ids = set()
    for rack, job in enumerate(objs[3:]):
        [claim] = job.spec.template.spec.resource_claims
        assert claim.resource_claim_template_name == f"moe-r{rack}-channel"
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


def test_ep_domain_reaches_the_pods_and_their_mesh():
    """The pool's ep_domain_chips is every pod's MARIN_EP_DOMAIN_CHIPS, and the expert axis the
    worker derives from that environment spans the processes of one EP domain."""
    from marin_assets.model import ModelConfig
    from marin_assets.train.distributed.mesh import expert_axis_size

    pool = Pool("gb200", "gb200-nvl72", "us-central1", 11, ep_domain_chips=64)
    objs = multihost_jax_manifests("moe", pool, image="marin:1", command=["python", "train.py"], chips=64)
    [job] = [o for o in objs if isinstance(o, k8s.V1Job)]
    _validate_strict(job)
    env = _env(job.spec.template.spec.containers[0])
    assert env["MARIN_EP_DOMAIN_CHIPS"] == "64" and env["JAX_NUM_PROCESSES"] == "16"
    moe = ModelConfig(n_routed_experts=64, top_k=2)
    assert expert_axis_size(moe, n_devices=64, per_process=4, env=env) == 64  # 16 processes of 4 chips
    assert expert_axis_size(moe, n_devices=64, per_process=4, env={}) == 4  # without it: one process
    # Two whole racks (72 chips each): an expert group stays inside one rack and one EP domain.
    racks = multihost_jax_manifests("moe", pool, image="marin:1", command=["python"], domains=2)
    env = _env(next(o for o in racks if isinstance(o, k8s.V1Job)).spec.template.spec.containers[0])
    assert expert_axis_size(ModelConfig(n_routed_experts=72, top_k=2), 144, 4, env) == 36
    no_ep = multihost_jax_manifests(
        "moe", Pool("gb200", "gb200-nvl72", "us-central1", 1), image="marin:1", command=["python"], chips=8
    )
    [job] = [o for o in no_ep if isinstance(o, k8s.V1Job)]
    assert "MARIN_EP_DOMAIN_CHIPS" not in _env(job.spec.template.spec.containers[0])


def test_cpu_pod_and_step_config():
    pod = cpu_pod("dedup-step", image="marin:1", command=["dagster", "api"], cores=8, memory_gib=32, node_pool="cpu-pool")
    assert round_trip(pod) == pod
    assert pod.spec.containers[0].resources.requests == {"cpu": "8", "memory": "32Gi"}
    cfg = cpu_step_k8s_config(8, 32, node_pool="cpu-pool")
    assert cfg["pod_spec_config"]["node_selector"] == pod.spec.node_selector


def test_manifest_inputs_are_refused_cleanly():
    pool = Pool("v5e-256", "tpu-v5e", "us-west4", 1, topology="16x16")
    with pytest.raises(ValueError, match="never run through a shell"):
        multihost_jax_manifests("x", pool, image="i", command="python train.py; rm -rf /")
    with pytest.raises(ValueError, match="job name 'Bad_Name;' is not a DNS-1035 label"):
        multihost_jax_manifests("Bad_Name;", pool, image="i", command=["python"])
    with pytest.raises(ValueError, match="has 1 domains"):
        multihost_jax_manifests("x", pool, image="i", command=["python"], domains=2)
    with pytest.raises(ValueError, match="JOB_COMPLETION_INDEX"):
        jax_distributed_args({"JAX_NUM_PROCESSES": "4", "JAX_COORDINATOR_ADDRESS": "a:1"})


def test_partial_domain_gpu_job_and_spec_config_map():
    pool = Pool("h100", "h100x8", "us-east5", 4)
    objs = multihost_jax_manifests(
        "small", pool, image="marin:1", command=["python"], chips=2, namespace="marin", spec_json='{"out_dir": "gs://b/x"}'
    )
    kinds = [o.kind for o in objs]
    assert kinds == ["ConfigMap", "Service", "Job"]  # no ComputeDomain off GB200
    config_map, _, job = objs
    for obj in objs:
        _validate_strict(obj)
    assert job.spec.completions == 1
    assert job.spec.template.spec.containers[0].resources.limits == {"nvidia.com/gpu": "2"}
    assert job.spec.template.spec.volumes[0].config_map.name == config_map.metadata.name == "small-spec"
    assert to_dicts([config_map])[0]["data"] == {"spec.json": '{"out_dir": "gs://b/x"}'}
    with pytest.raises(ValueError, match="ConfigMap holds < 1 MiB"):
        spec_config_map("big", "marin", "x" * 1_000_000)


def test_job_shape_rules():
    v5p = Pool("v5p-16", "tpu-v5p", "us-east5", 2, topology="2x2x4")
    gb = Pool("gb200", "gb200-nvl72", "us-central1", 11)
    assert job_shape(v5p, 16) == JobShape(v5p, 1, 4, 4)
    assert job_shape(v5p, 32) == JobShape(v5p, 2, 4, 4)
    assert job_shape(gb, 144) == JobShape(gb, 2, 18, 4)
    assert job_shape(gb, 8) == JobShape(gb, 1, 2, 4)  # two trays of one rack
    assert job_shape(gb, 1) == JobShape(gb, 1, 1, 1)
    with pytest.raises(ValueError, match="not a whole number of domains; ask for a multiple of 16"):
        job_shape(v5p, 8)  # a TPU slice is never shared
    with pytest.raises(ValueError, match="needs 3 domains but the pool has 2"):
        job_shape(v5p, 48)
    with pytest.raises(ValueError, match="not a whole number of hosts"):
        job_shape(gb, 6)
    with pytest.raises(ValueError, match="not a whole number of domains; ask for a multiple of 72"):
        job_shape(gb, 100)


@settings(max_examples=200, deadline=None)
@given(chips=st.integers(min_value=1, max_value=2000), whole=st.booleans())
def test_job_shape_is_exact_or_refused(chips, whole):
    """Any shape it returns holds exactly the chips asked for, within the pool; else a ValueError."""
    pool = Pool("gb200", "gb200-nvl72", "us-central1", 11, whole_domain=whole)
    try:
        shape = job_shape(pool, chips)
    except ValueError as err:
        assert "gb200" in str(err)
        return
    assert shape.chips == chips
    assert 1 <= shape.domains <= pool.domains and 1 <= shape.chips_per_host <= pool.chips_per_host
    assert shape.hosts_per_domain <= pool.hosts_per_domain
    if whole or shape.domains > 1:
        assert shape.hosts_per_domain == pool.hosts_per_domain


def test_trainer_rbac_validates():
    role, binding = trainer_rbac("marin", "marin-trainer")
    for obj in (role, binding):
        _validate_strict(obj)
        assert round_trip(obj) == obj
    assert binding.role_ref.name == role.metadata.name
    assert [(s.kind, s.name, s.namespace) for s in binding.subjects] == [("ServiceAccount", "marin-trainer", "marin")]
    with pytest.raises(ValueError, match="not a valid name"):
        trainer_rbac("marin", "Trainer;")
