"""The ``run_launcher: config:`` schema of RoutingRunLauncher, and the backends it builds.

``dagster.yaml``::

    run_launcher:
      module: marin_assets.orchestration.launcher
      class: RoutingRunLauncher
      config:
        local:
          accelerators: [cpu]       # what the local backend serves (default [cpu])
        unmatched: local            # local | fail: a run no cluster serves (default local)
        fleet_file: null            # optional fleet YAML: capacity admission (launcher.py)
        clusters:                   # default []
          - name: gke-us-central2
            kubeconfig_file: /secrets/kube/us-central2.yaml
            context: gke_marin_us-central2     # optional: the file's current-context otherwise
            namespace: marin
            job_image: ghcr.io/marin/marin-assets:latest
            instance_config_map: dagster-instance
            service_account_name: dagster      # default "default"
            dagster_home: /opt/dagster/dagster_home
            accelerators: [tpu-v4, tpu-v5p]
            regions: [us-central2]             # default []: any region
            env_secrets: [wandb]               # optional, also env_vars, postgres_password_secret
            run_worker_cpu: "1"                # the run worker pod: CPU and memory only (defaults;
            run_worker_memory: 4Gi             #   a run's marin/cpu, marin/memory tags override them)
            run_worker_node_pool: cpu-pool     # optional CPU node pool for run worker pods
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagster import Array, Field, Noneable, Shape, StringSource

from marin_assets.cluster.tags import ACCELERATORS
from marin_assets.orchestration.k8s_backend import K8sClusterBackend
from marin_assets.orchestration.local_backend import LOCAL

CLUSTER_SHAPE = Shape(
    {
        "name": Field(str),
        "kubeconfig_file": Field(str),
        "context": Field(Noneable(str), default_value=None, is_required=False),
        "namespace": Field(str, default_value="default", is_required=False),
        "job_image": Field(str),
        "instance_config_map": Field(str),
        "service_account_name": Field(str, default_value="default", is_required=False),
        "dagster_home": Field(str, default_value="/opt/dagster/dagster_home", is_required=False),
        "image_pull_policy": Field(str, default_value="IfNotPresent", is_required=False),
        "postgres_password_secret": Field(Noneable(str), default_value=None, is_required=False),
        "env_vars": Field(Array(str), default_value=[], is_required=False),
        "env_secrets": Field(Array(str), default_value=[], is_required=False),
        "accelerators": Field(Array(str), description=f"subset of {list(ACCELERATORS)}"),
        "regions": Field(Array(str), default_value=[], is_required=False, description="[] = any region"),
        "run_worker_cpu": Field(str, default_value="1", is_required=False),
        "run_worker_memory": Field(str, default_value="4Gi", is_required=False),
        "run_worker_node_pool": Field(Noneable(str), default_value=None, is_required=False),
    }
)


def launcher_config_type() -> dict[str, Field]:
    """The fields of RoutingRunLauncher's config (``ConfigurableClass.config_type``)."""
    return {
        "local": Field(
            Shape({"accelerators": Field(Array(str), default_value=["cpu"], is_required=False)}),
            is_required=False,
        ),
        "clusters": Field(Array(CLUSTER_SHAPE), default_value=[], is_required=False),
        "unmatched": Field(
            str,
            default_value=LOCAL,
            is_required=False,
            description="'local': run on the local backend when no cluster serves the run's accelerator; 'fail': refuse it",
        ),
        "fleet_file": Field(
            Noneable(StringSource),
            default_value=None,
            is_required=False,
            description="fleet YAML (a path, or {env: VAR}): admit runs only where their "
            "pool has room, preempting lower priorities",
        ),
    }


def _cluster_kwargs(cluster: Mapping[str, Any]) -> dict[str, Any]:
    """One ``clusters:`` entry as K8sClusterBackend arguments (its lists as tuples)."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in cluster.items()}


def launcher_kwargs(config_value: Mapping[str, Any]) -> dict[str, Any]:
    """RoutingRunLauncher's constructor arguments from a validated config value."""
    clusters = tuple(K8sClusterBackend(**_cluster_kwargs(c)) for c in config_value.get("clusters", []))
    local = config_value.get("local") or {}
    return {
        "local_accelerators": tuple(local.get("accelerators", ["cpu"])),
        "clusters": clusters,
        "unmatched": config_value.get("unmatched", LOCAL),
        "fleet_file": config_value.get("fleet_file"),
    }
