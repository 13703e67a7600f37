"""RoutingRunLauncher: send each Dagster run to a backend chosen from its ``marin/*`` tags.

Backends:

* ``local``: the embedded default. Delegates to Dagster's own DefaultRunLauncher, which asks
  the code location's gRPC server to start ``dagster api execute_run`` in a subprocess, so
  runs really execute on this machine (``dagster dev``, tests).
* one Kubernetes backend per configured cluster, built on dagster-k8s's job builder
  (``construct_dagster_k8s_job``) and client (``DagsterKubernetesClient``). Each cluster gets
  its own API client from its own kubeconfig file and context via
  ``kubernetes.config.new_client_from_config``; the process-global kube config is never
  loaded or modified, so two clusters cannot clobber each other.

Tags are validated by ``marin_assets.cluster.tags.classify_tags`` (allow-lists and tight
regexes). A bad tag, a run no backend serves, or (with ``fleet_file``) a run bigger than any
pool fails at launch with a message naming the tag; no tag value ever reaches a command line.
The chosen backend is recorded in the ``marin/backend`` run tag so terminate and health
checks go back to the same backend.

``dagster.yaml``::

    run_launcher:
      module: marin_assets.orchestration.launcher
      class: RoutingRunLauncher
      config:
        local:
          accelerators: [cpu]       # what the local backend serves (default [cpu])
        unmatched: local            # local | fail: a run no cluster serves (default local)
        fleet_file: null            # optional fleet YAML: refuse runs bigger than any pool
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

The run worker pod never requests a TPU or GPU, whatever the run's tags: training runs in
pods that ``training_backends.KubernetesTrainingBackend`` creates from inside it, sized from
the same tags. The launcher hands it MARIN_CLUSTER, MARIN_K8S_NAMESPACE and MARIN_K8S_IMAGE.

Pod size from asset tags: a run pod requests (and is limited to) the ``marin/cpu`` and
``marin/memory`` of its run's tags, else of its assets' tags (the largest over the run's
assets, ``tags.asset_run_tags``), else the cluster's run_worker_cpu/memory. Dagster does not
copy asset tags onto runs (a backfill's runs carry only partition and backfill tags), so
``MarinQueuedRunCoordinator`` writes the asset-derived ``marin/pool``/``cpu``/``memory`` onto
each run as it is queued: the run queue's ``marin/pool`` limits then apply to backfill runs,
and the tags show in the UI. Tags given on the run itself win over its assets' tags.

Pools as capacity: ``run_concurrency_config(fleet)`` generates the instance's
``concurrency: runs: tag_concurrency_limits`` (one ``marin/pool`` limit per pool, see
``pool_run_slots``) so a queued run waits in Dagster's queue holding nothing; with a fleet
file, the launcher refuses a ``marin/pool`` tag naming a pool that cannot hold the run.
See dagster.cluster.yaml for a production instance.
"""

from __future__ import annotations

import logging
import sys
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dagster import Array, Field, Noneable, Shape, StringSource
from dagster._core.errors import DagsterLaunchFailedError
from dagster._core.launcher import DefaultRunLauncher, LaunchRunContext, RunLauncher
from dagster._core.launcher.base import CheckRunHealthResult, WorkerStatus
from dagster._core.storage.dagster_run import DagsterRun, DagsterRunStatus
from dagster._serdes import ConfigurableClass, ConfigurableClassData
from dagster._utils.error import serializable_error_info_from_exc_info

from marin_assets.cluster.routing import check_feasible
from marin_assets.cluster.tags import (
    ACCELERATORS,
    POOL_TAG,
    JobRequest,
    PodResources,
    check_accelerator,
    check_cpu,
    check_memory,
    check_name,
    check_region,
    check_resource_tags,
    classify_tags,
    pod_resources,
)
from marin_assets.orchestration.run_queue import (  # re-exported: dagster.yaml and callers name them here too
    MarinQueuedRunCoordinator,
    effective_run_tags,
    pool_run_slots,
    run_asset_tags,
    run_concurrency_config,
    run_concurrency_yaml,
)

BACKEND_TAG = "marin/backend"
LOCAL = "local"
# A run executed in a process of its own choosing (execute_in_process: the demo, tests) names
# that process, so terminating it can still reach it: SIGTERM, which the trainer turns into a
# checkpoint and a clean early end.
PID_TAG, HOST_TAG = "marin/pid", "marin/host"


def in_process_tags() -> dict[str, str]:
    """Tags that let ``terminate`` reach a run executed in this process."""
    import os
    import socket

    return {PID_TAG: str(os.getpid()), HOST_TAG: socket.gethostname()}


def terminate_in_process_run(instance, run: DagsterRun) -> bool:
    """SIGTERM to the process a run's PID_TAG names, if it runs on this host; False otherwise."""
    import os
    import signal
    import socket

    pid, host = run.tags.get(PID_TAG, ""), run.tags.get(HOST_TAG)
    if not pid.isdigit() or int(pid) <= 1 or host != socket.gethostname():
        return False
    instance.report_run_canceling(run)
    try:
        os.kill(int(pid), signal.SIGTERM)
    except ProcessLookupError:
        return False
    instance.report_engine_event(f"sent SIGTERM to run process {pid} on {host}", run)
    return True


# ---- the tags a run is launched with: its own, plus its assets' ------------------------------


# ---- backends -------------------------------------------------------------------------------


@dataclass
class LocalBackend:
    """Runs on this machine through Dagster's DefaultRunLauncher (gRPC server -> subprocess)."""

    accelerators: tuple[str, ...] = ("cpu",)
    name: str = LOCAL
    regions: tuple[str, ...] = ()
    launcher: DefaultRunLauncher = field(default_factory=DefaultRunLauncher)

    def serves(self, request: JobRequest) -> bool:
        return request.accelerator in self.accelerators

    def register_instance(self, instance) -> None:
        self.launcher.register_instance(instance)

    def launch(self, context: LaunchRunContext, request: JobRequest, tags: Mapping[str, str]) -> None:
        self.launcher.launch_run(context)  # a local process: nothing to size

    def terminate(self, run_id: str) -> bool:
        from dagster._core.storage.tags import GRPC_INFO_TAG

        run = self.launcher._instance.get_run_by_id(run_id) if self.launcher.has_instance else None
        if run is not None and not run.is_finished and GRPC_INFO_TAG not in run.tags and PID_TAG in run.tags:
            return terminate_in_process_run(self.launcher._instance, run)
        # Launched through the code server: it interrupts the run process (SIGINT), which the
        # trainer treats like SIGTERM.
        return self.launcher.terminate(run_id)

    def check_health(self, run: DagsterRun) -> CheckRunHealthResult:
        # Ask the code server that started the run whether the execution is still alive.
        import dagster_shared.seven as seven
        from dagster._core.storage.tags import GRPC_INFO_TAG
        from dagster._grpc.client import DagsterGrpcClient
        from dagster._grpc.types import CanCancelExecutionRequest, CanCancelExecutionResult
        from dagster._serdes import deserialize_value

        info = run.tags.get(GRPC_INFO_TAG)
        if not info:
            return CheckRunHealthResult(WorkerStatus.UNKNOWN, "run has no gRPC server tag")
        try:
            grpc = seven.json.loads(info)
            client = DagsterGrpcClient(port=grpc.get("port"), socket=grpc.get("socket"),
                                       host=grpc.get("host"), use_ssl=bool(grpc.get("use_ssl", False)))
            res = deserialize_value(client.can_cancel_execution(CanCancelExecutionRequest(run_id=run.run_id)),
                                    CanCancelExecutionResult)
        except Exception:
            return CheckRunHealthResult(WorkerStatus.UNKNOWN, str(serializable_error_info_from_exc_info(sys.exc_info())))
        if res.can_cancel:
            return CheckRunHealthResult(WorkerStatus.RUNNING)
        return CheckRunHealthResult(WorkerStatus.FAILED, "the local run process is no longer running")

    def join(self, timeout: int) -> None:
        self.launcher.join(timeout=timeout)

    def dispose(self) -> None:
        self.launcher.dispose()


@dataclass
class K8sClusterBackend:
    """One Kubernetes cluster, reached through its own kubeconfig file and context."""

    name: str
    kubeconfig_file: str
    job_image: str
    instance_config_map: str
    accelerators: tuple[str, ...]
    regions: tuple[str, ...] = ()
    context: str | None = None
    namespace: str = "default"
    service_account_name: str = "default"
    dagster_home: str = "/opt/dagster/dagster_home"
    image_pull_policy: str = "IfNotPresent"
    postgres_password_secret: str | None = None
    env_vars: tuple[str, ...] = ()
    env_secrets: tuple[str, ...] = ()
    # The run worker is a small CPU pod: training runs in pods that the training backend
    # creates, so the run pod never holds a TPU or GPU while it waits for or watches them.
    run_worker_cpu: str = "1"
    run_worker_memory: str = "4Gi"
    run_worker_node_pool: str | None = None  # a CPU node pool (cloud.google.com/gke-nodepool)
    k8s_client: Any = None  # a DagsterKubernetesClient; built lazily (tests inject a fake)

    def __post_init__(self) -> None:
        check_name("cluster name", self.name)
        if self.name == LOCAL:
            raise ValueError("cluster name 'local' is reserved for the local backend")
        check_name(f"cluster {self.name}: namespace", self.namespace)
        for a in self.accelerators:
            check_accelerator(a, what=f"cluster {self.name}: accelerators")
        for r in self.regions:
            check_region(r, what=f"cluster {self.name}: regions")
        if not self.accelerators:
            raise ValueError(f"cluster {self.name}: list the accelerators it serves")
        try:
            check_cpu(str(self.run_worker_cpu))
        except ValueError:
            raise ValueError(f"cluster {self.name}: run_worker_cpu {self.run_worker_cpu!r} is not a CPU quantity like '1' or '500m'") from None
        try:
            check_memory(str(self.run_worker_memory))
        except ValueError:
            raise ValueError(f"cluster {self.name}: run_worker_memory {self.run_worker_memory!r} is not a quantity like '4Gi'") from None
        if self.run_worker_node_pool is not None:
            check_name(f"cluster {self.name}: run_worker_node_pool", self.run_worker_node_pool)

    @property
    def default_resources(self) -> PodResources:
        return PodResources(cpu=self.run_worker_cpu, memory=self.run_worker_memory)

    def run_worker_k8s_config(self, resources: PodResources | None = None) -> dict[str, Any]:
        """Resources and placement of the run worker pod: CPU and memory only, never a chip.

        ``resources`` (from the run's marin/cpu, marin/memory) replaces the cluster's defaults.
        """
        resources = (resources or self.default_resources).as_k8s()
        config: dict[str, Any] = {"container_config": {"resources": {"requests": resources, "limits": resources}}}
        if self.run_worker_node_pool is not None:
            config["pod_spec_config"] = {"node_selector": {"cloud.google.com/gke-nodepool": self.run_worker_node_pool}}
        return config

    def serves(self, request: JobRequest) -> bool:
        region_ok = request.region is None or not self.regions or request.region in self.regions
        return request.accelerator in self.accelerators and region_ok

    def api_client(self):
        """A kubernetes ApiClient for this cluster only (the global default config is untouched)."""
        import kubernetes

        return kubernetes.config.new_client_from_config(
            config_file=self.kubeconfig_file, context=self.context, persist_config=False
        )

    def client(self):
        if self.k8s_client is None:
            import kubernetes
            from dagster_k8s.client import DagsterKubernetesClient

            api = self.api_client()
            self.k8s_client = DagsterKubernetesClient(
                batch_api=kubernetes.client.BatchV1Api(api_client=api),
                core_api=kubernetes.client.CoreV1Api(api_client=api),
                logger=logging.info,
                sleeper=time.sleep,
                timer=time.time,
            )
        return self.k8s_client

    def build_job(self, run: DagsterRun, request: JobRequest, instance, tags: Mapping[str, str] | None = None):
        """The Kubernetes Job that runs ``dagster api execute_run`` for ``run`` on this cluster.

        ``tags``: the run's effective tags (``effective_run_tags``), already validated by the
        launcher; they size the pod (marin/cpu, marin/memory) and label it (marin/pool).
        """
        tags = run.tags if tags is None else tags
        from dagster._grpc.types import ExecuteRunArgs
        from dagster_k8s.job import (
            DagsterK8sJobConfig,
            UserDefinedDagsterK8sConfig,
            construct_dagster_k8s_job,
            get_job_name_from_run_id,
        )

        job_origin = run.job_code_origin
        if job_origin is None:
            raise DagsterLaunchFailedError(f"run {run.run_id} has no code origin to execute")
        # Arguments are a list handed to the container runtime, never a shell string; the
        # only run-derived value in them is Dagster's own serialized ExecuteRunArgs.
        args = ExecuteRunArgs(job_origin=job_origin, run_id=run.run_id,
                              instance_ref=instance.get_ref()).get_command_args()
        job_config = DagsterK8sJobConfig(
            job_image=job_origin.repository_origin.container_image or self.job_image,
            dagster_home=self.dagster_home,
            image_pull_policy=self.image_pull_policy,
            service_account_name=self.service_account_name,
            instance_config_map=self.instance_config_map,
            postgres_password_secret=self.postgres_password_secret,
            env_vars=list(self.env_vars),
            env_secrets=list(self.env_secrets),
        )
        # Validated tag values only (allow-listed words, digits): safe as label values.
        labels = {
            "dagster/job": job_origin.job_name,
            "dagster/run-id": run.run_id,
            "marin/accelerator": request.accelerator,
            "marin/chips": str(request.chips),
            "marin/priority": request.priority,
        }
        if POOL_TAG in tags:
            labels[POOL_TAG] = check_name(f"tag {POOL_TAG}:", tags[POOL_TAG])
        resources = pod_resources(tags, self.default_resources)
        job_name = get_job_name_from_run_id(run.run_id)
        # What the training backend inside this pod needs to create its worker pods here.
        env = {"DAGSTER_RUN_JOB_NAME": job_origin.job_name, "MARIN_CLUSTER": self.name,
               "MARIN_K8S_NAMESPACE": self.namespace, "MARIN_K8S_IMAGE": job_config.job_image}
        return construct_dagster_k8s_job(
            job_config=job_config,
            args=args,
            job_name=job_name,
            pod_name=job_name,
            component="run_worker",
            user_defined_k8s_config=UserDefinedDagsterK8sConfig(**self.run_worker_k8s_config(resources)),
            labels=labels,
            env_vars=[{"name": k, "value": v} for k, v in env.items()],
        )

    def register_instance(self, instance) -> None:
        # A weak reference, like Dagster's own launchers: the instance owns us, not the reverse.
        self._instance_ref = weakref.ref(instance)

    def launch(self, context: LaunchRunContext, request: JobRequest, tags: Mapping[str, str]) -> None:
        run = context.dagster_run
        instance = self._instance_ref()
        job = self.build_job(run, request, instance, tags)
        limits = job.spec.template.spec.containers[0].resources.limits
        instance.report_engine_event(
            f"Creating Kubernetes run worker job {job.metadata.name} in cluster {self.name}, "
            f"namespace {self.namespace} (cpu {limits['cpu']}, memory {limits['memory']})", run)
        self.client().create_namespaced_job_with_retries(body=job, namespace=self.namespace)

    def terminate(self, run_id: str) -> bool:
        from dagster_k8s.job import get_job_name_from_run_id

        return bool(self.client().delete_job(job_name=get_job_name_from_run_id(run_id), namespace=self.namespace))

    def check_health(self, run: DagsterRun) -> CheckRunHealthResult:
        # Same reading of the Job status as dagster-k8s's K8sRunLauncher.
        from dagster_k8s.job import get_job_name_from_run_id

        job_name = get_job_name_from_run_id(run.run_id)
        try:
            status = self.client().get_job_status(namespace=self.namespace, job_name=job_name)
        except Exception:
            return CheckRunHealthResult(WorkerStatus.UNKNOWN, str(serializable_error_info_from_exc_info(sys.exc_info())))
        if not status:
            return CheckRunHealthResult(WorkerStatus.UNKNOWN, f"Job {job_name} could not be found in {self.name}")
        finished_pods = bool(not status.active and (status.failed or status.succeeded))
        if run.status in (DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING) and finished_pods:
            return CheckRunHealthResult(WorkerStatus.FAILED, "Run has not completed but K8s job has no active pods")
        if status.succeeded:
            return CheckRunHealthResult(WorkerStatus.SUCCESS)
        if status.failed and not status.active:
            return CheckRunHealthResult(WorkerStatus.FAILED, "K8s job failed")
        return CheckRunHealthResult(WorkerStatus.RUNNING)

    def join(self, timeout: int) -> None:
        pass

    def dispose(self) -> None:
        pass


# ---- the launcher ---------------------------------------------------------------------------

_CLUSTER_SHAPE = Shape({
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
})


class RoutingRunLauncher(RunLauncher, ConfigurableClass):
    """Routes each run by its ``marin/*`` tags to the local backend or a Kubernetes cluster."""

    def __init__(
        self,
        inst_data: ConfigurableClassData | None = None,
        local_accelerators: tuple[str, ...] = ("cpu",),
        clusters: tuple[K8sClusterBackend, ...] = (),
        unmatched: str = LOCAL,
        fleet_file: str | None = None,
    ) -> None:
        self._inst_data = inst_data
        if unmatched not in (LOCAL, "fail"):
            raise ValueError(f"unmatched must be 'local' or 'fail', got {unmatched!r}")
        for a in local_accelerators:
            check_accelerator(a, what="local.accelerators")
        self.local = LocalBackend(accelerators=tuple(local_accelerators))
        self.clusters: dict[str, K8sClusterBackend] = {}
        for c in clusters:
            if c.name in self.clusters:
                raise ValueError(f"cluster name {c.name!r} appears twice")
            self.clusters[c.name] = c
        self.unmatched = unmatched
        self.fleet = None
        if fleet_file is not None:
            from marin_assets.cluster.fleet import load_fleet

            self.fleet = load_fleet(fleet_file)
        super().__init__()

    # ---- ConfigurableClass ----

    @property
    def inst_data(self) -> ConfigurableClassData | None:
        return self._inst_data

    @classmethod
    def config_type(cls) -> dict[str, Field]:
        return {
            "local": Field(
                Shape({"accelerators": Field(Array(str), default_value=["cpu"], is_required=False)}),
                is_required=False,
            ),
            "clusters": Field(Array(_CLUSTER_SHAPE), default_value=[], is_required=False),
            "unmatched": Field(str, default_value=LOCAL, is_required=False,
                               description="'local': run on the local backend when no cluster serves "
                                           "the run's accelerator; 'fail': refuse it"),
            "fleet_file": Field(Noneable(StringSource), default_value=None, is_required=False,
                                description="fleet YAML (a path, or {env: VAR}): refuse runs bigger than any pool"),
        }

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]):
        clusters = tuple(
            K8sClusterBackend(**{k: tuple(v) if isinstance(v, list) else v for k, v in c.items()})
            for c in config_value.get("clusters", [])
        )
        local = config_value.get("local") or {}
        return cls(
            inst_data=inst_data,
            local_accelerators=tuple(local.get("accelerators", ["cpu"])),
            clusters=clusters,
            unmatched=config_value.get("unmatched", LOCAL),
            fleet_file=config_value.get("fleet_file"),
        )

    def register_instance(self, instance) -> None:
        super().register_instance(instance)
        self.local.register_instance(instance)
        for c in self.clusters.values():
            c.register_instance(instance)

    # ---- routing ----

    def backends(self) -> list:
        return [*self.clusters.values(), self.local]

    def check_pool_tag(self, tags: Mapping[str, str], request: JobRequest) -> None:
        """A ``marin/pool`` tag must name a fleet pool of the run's accelerator (and region)."""
        pool = tags.get(POOL_TAG)
        if pool is None:
            return
        check_name(f"tag {POOL_TAG}:", pool)
        if self.fleet is None:
            raise ValueError(f"tag {POOL_TAG}: {pool!r} given but the launcher has no fleet_file to check it against")
        if pool not in {p.name for p in check_feasible(self.fleet, request, job_id="run")}:
            raise ValueError(f"tag {POOL_TAG}: pool {pool!r} cannot hold {request.chips} x {request.accelerator}"
                             + (f" in {request.region}" if request.region else ""))

    def choose_backend(self, request: JobRequest):
        """Pick the backend for a classified request; ValueError with the reason if none."""
        if self.fleet is not None:
            check_feasible(self.fleet, request, job_id="run")
        if request.cluster is not None:
            backend = self.clusters.get(request.cluster) if request.cluster != LOCAL else self.local
            if backend is None:
                raise ValueError(f"tag marin/cluster: no backend named {request.cluster!r}; "
                                 f"configured: {[b.name for b in self.backends()]}")
            if not backend.serves(request):
                raise ValueError(f"tag marin/cluster: backend {request.cluster!r} does not serve "
                                 f"{request.accelerator}" + (f" in {request.region}" if request.region else ""))
            return backend
        for backend in self.backends():
            if backend.serves(request):
                return backend
        if self.unmatched == LOCAL:
            return self.local
        raise ValueError(f"no backend serves accelerator {request.accelerator}"
                         + (f" in region {request.region}" if request.region else ""))

    def _backend_for_run(self, run: DagsterRun):
        name = run.tags.get(BACKEND_TAG)
        if name == LOCAL:
            return self.local
        return self.clusters.get(name)

    # ---- RunLauncher ----

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        try:
            tags = effective_run_tags(run, context.workspace)
            request = classify_tags(tags)
            self.check_pool_tag(tags, request)
            check_resource_tags(tags)  # marin/cpu, marin/memory: refused here whichever backend runs it
            backend = self.choose_backend(request)
        except ValueError as err:
            message = f"RoutingRunLauncher refused run {run.run_id}: {err}"
            self._instance.report_engine_event(message, run, cls=self.__class__)
            # DagsterInstance.launch_run marks the run failed and re-raises this.
            raise DagsterLaunchFailedError(message) from None
        self._instance.add_run_tags(run.run_id, {BACKEND_TAG: backend.name})
        note = "" if backend.serves(request) else " (no cluster serves it; unmatched: local)"
        self._instance.report_engine_event(
            f"Routing {request.priority} run ({request.chips} x {request.accelerator}"
            f"{', ' + request.region if request.region else ''}) to backend {backend.name}{note}",
            run, cls=self.__class__)
        backend.launch(context, request, tags)

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return False
        backend = self._backend_for_run(run) or (self.local if PID_TAG in run.tags else None)
        if backend is None:
            return False
        return backend.terminate(run_id)

    @property
    def supports_check_run_worker_health(self) -> bool:
        # Run monitoring for local runs alone adds nothing over Dagster's defaults.
        return bool(self.clusters)

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        backend = self._backend_for_run(run)
        if backend is None:
            return CheckRunHealthResult(WorkerStatus.UNKNOWN, f"run has no known {BACKEND_TAG} tag")
        return backend.check_health(run)

    def join(self, timeout: int = 30) -> None:
        if self.has_instance:
            self.local.join(timeout)

    def dispose(self) -> None:
        for backend in self.backends():
            backend.dispose()
