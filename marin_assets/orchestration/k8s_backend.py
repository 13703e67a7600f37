"""The launcher's Kubernetes backend: one cluster, reached through its own kubeconfig and context.

Built on dagster-k8s's job builder (``construct_dagster_k8s_job``) and client
(``DagsterKubernetesClient``). Each cluster gets its own API client from its own kubeconfig
file and context via ``kubernetes.config.new_client_from_config``; the process-global kube
config is never loaded or modified, so two clusters cannot clobber each other.

The run worker pod never requests a TPU or GPU, whatever the run's tags: training runs in
pods that ``training_backends.KubernetesTrainingBackend`` creates from inside it, sized from
the same tags. The backend hands it MARIN_CLUSTER, MARIN_K8S_NAMESPACE and MARIN_K8S_IMAGE.
"""

from __future__ import annotations

import logging
import sys
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dagster import DagsterRun, DagsterRunStatus

from marin_assets.cluster.tags import (
    POOL_TAG,
    JobRequest,
    PodResources,
    check_accelerator,
    check_cpu,
    check_memory,
    check_name,
    check_region,
    pod_resources,
)
from marin_assets.orchestration.compat import (
    CheckRunHealthResult,
    DagsterLaunchFailedError,
    ExecuteRunArgs,
    JobPythonOrigin,
    LaunchRunContext,
    WorkerStatus,
    serializable_error_info_from_exc_info,
)
from marin_assets.orchestration.local_backend import LOCAL


def _check_quantity(check, value: str, what: str) -> None:
    """``check`` a run-worker quantity, re-raising with the field's own name."""
    try:
        check(str(value))
    except ValueError:
        raise ValueError(what.format(value=repr(value))) from None


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
        where = f"cluster {self.name}"
        check_name("cluster name", self.name)
        if self.name == LOCAL:
            raise ValueError("cluster name 'local' is reserved for the local backend")
        check_name(f"{where}: namespace", self.namespace)
        for a in self.accelerators:
            check_accelerator(a, what=f"{where}: accelerators")
        for r in self.regions:
            check_region(r, what=f"{where}: regions")
        if not self.accelerators:
            raise ValueError(f"{where}: list the accelerators it serves")
        _check_quantity(
            check_cpu, self.run_worker_cpu, f"{where}: run_worker_cpu {{value}} is not a CPU quantity like '1' or '500m'"
        )
        _check_quantity(
            check_memory, self.run_worker_memory, f"{where}: run_worker_memory {{value}} is not a quantity like '4Gi'"
        )
        if self.run_worker_node_pool is not None:
            check_name(f"{where}: run_worker_node_pool", self.run_worker_node_pool)

    @property
    def default_resources(self) -> PodResources:
        """The run worker pod's CPU and memory when the run's tags name none."""
        return PodResources(cpu=self.run_worker_cpu, memory=self.run_worker_memory)

    def run_worker_k8s_config(self, resources: PodResources | None = None) -> dict[str, Any]:
        """Resources and placement of the run worker pod: CPU and memory only, never a chip.

        ``resources`` (from the run's marin/cpu, marin/memory) replaces the cluster's defaults.
        """
        quantities = (resources or self.default_resources).as_k8s()
        config: dict[str, Any] = {"container_config": {"resources": {"requests": quantities, "limits": quantities}}}
        if self.run_worker_node_pool is not None:
            config["pod_spec_config"] = {"node_selector": {"cloud.google.com/gke-nodepool": self.run_worker_node_pool}}
        return config

    def serves(self, request: JobRequest) -> bool:
        """Whether this cluster runs ``request``'s accelerator in its region (if it names one)."""
        region_ok = request.region is None or not self.regions or request.region in self.regions
        return request.accelerator in self.accelerators and region_ok

    def api_client(self):
        """A kubernetes ApiClient for this cluster only (the global default config is untouched)."""
        import kubernetes

        return kubernetes.config.new_client_from_config(
            config_file=self.kubeconfig_file, context=self.context, persist_config=False
        )

    def client(self):
        """The DagsterKubernetesClient for this cluster, built on first use."""
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

    def _job_config(self, job_origin: JobPythonOrigin):
        """dagster-k8s's job settings for this cluster; the code location's image wins."""
        from dagster_k8s.job import DagsterK8sJobConfig

        return DagsterK8sJobConfig(
            job_image=job_origin.repository_origin.container_image or self.job_image,
            dagster_home=self.dagster_home,
            image_pull_policy=self.image_pull_policy,
            service_account_name=self.service_account_name,
            instance_config_map=self.instance_config_map,
            postgres_password_secret=self.postgres_password_secret,
            env_vars=list(self.env_vars),
            env_secrets=list(self.env_secrets),
        )

    @staticmethod
    def _labels(job_name: str, run_id: str, request: JobRequest, tags: Mapping[str, str]) -> dict[str, str]:
        """Validated tag values only (allow-listed words, digits): safe as label values."""
        labels = {
            "dagster/job": job_name,
            "dagster/run-id": run_id,
            "marin/accelerator": request.accelerator,
            "marin/chips": str(request.chips),
            "marin/priority": request.priority,
        }
        if POOL_TAG in tags:
            labels[POOL_TAG] = check_name(f"tag {POOL_TAG}:", tags[POOL_TAG])
        return labels

    def build_job(self, run: DagsterRun, request: JobRequest, instance, tags: Mapping[str, str] | None = None):
        """The Kubernetes Job that runs ``dagster api execute_run`` for ``run`` on this cluster.

        ``tags``: the run's effective tags (``effective_run_tags``), already validated by the
        launcher; they size the pod (marin/cpu, marin/memory) and label it (marin/pool).
        """
        tags = run.tags if tags is None else tags
        from dagster_k8s.job import UserDefinedDagsterK8sConfig, construct_dagster_k8s_job, get_job_name_from_run_id

        job_origin = run.job_code_origin
        if job_origin is None:
            raise DagsterLaunchFailedError(f"run {run.run_id} has no code origin to execute")
        # Arguments are a list handed to the container runtime, never a shell string; the
        # only run-derived value in them is Dagster's own serialized ExecuteRunArgs.
        args = ExecuteRunArgs(job_origin=job_origin, run_id=run.run_id, instance_ref=instance.get_ref()).get_command_args()
        job_config = self._job_config(job_origin)
        job_name = get_job_name_from_run_id(run.run_id)
        # What the training backend inside this pod needs to create its worker pods here.
        env = {
            "DAGSTER_RUN_JOB_NAME": job_origin.job_name,
            "MARIN_CLUSTER": self.name,
            "MARIN_K8S_NAMESPACE": self.namespace,
            "MARIN_K8S_IMAGE": job_config.job_image,
        }
        resources = pod_resources(tags, self.default_resources)
        return construct_dagster_k8s_job(
            job_config=job_config,
            args=args,
            job_name=job_name,
            pod_name=job_name,
            component="run_worker",
            user_defined_k8s_config=UserDefinedDagsterK8sConfig(**self.run_worker_k8s_config(resources)),
            labels=self._labels(job_origin.job_name, run.run_id, request, tags),
            env_vars=[{"name": k, "value": v} for k, v in env.items()],
        )

    def register_instance(self, instance) -> None:
        """Keep a weak reference, like Dagster's own launchers: the instance owns us, not the reverse."""
        self._instance_ref = weakref.ref(instance)

    def launch(self, context: LaunchRunContext, request: JobRequest, tags: Mapping[str, str]) -> None:
        """Create the run worker Job in this cluster."""
        from dagster_k8s.job import get_job_name_from_run_id

        run = context.dagster_run
        instance = self._instance_ref()
        if instance is None:
            raise DagsterLaunchFailedError(f"cluster {self.name}: the Dagster instance is gone")
        job = self.build_job(run, request, instance, tags)
        size = pod_resources(tags, self.default_resources)  # what build_job gave the pod
        instance.report_engine_event(
            f"Creating Kubernetes run worker job {get_job_name_from_run_id(run.run_id)} in cluster {self.name}, "
            f"namespace {self.namespace} (cpu {size.cpu}, memory {size.memory})",
            run,
        )
        self.client().create_namespaced_job_with_retries(body=job, namespace=self.namespace)

    def terminate(self, run_id: str) -> bool:
        """Delete the run's Job (and its pods); False if it was not there."""
        from dagster_k8s.job import get_job_name_from_run_id

        return bool(self.client().delete_job(job_name=get_job_name_from_run_id(run_id), namespace=self.namespace))

    def check_health(self, run: DagsterRun) -> CheckRunHealthResult:
        """The run worker Job's state, read as dagster-k8s's K8sRunLauncher reads it."""
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
        """Nothing to wait for: the Job runs in the cluster."""

    def dispose(self) -> None:
        """Nothing to release: the API client holds no open connection of ours."""
