"""The ``kubernetes`` backend: the headless Service and one Indexed Job per interconnect
domain from ``marin_assets.cluster.manifests``, created through the cluster's own API client
from the (small, CPU-only) run worker pod; sized from the run's tags and the fleet file.
Process 0's Pipes messages come back on its pod's log stream."""

from __future__ import annotations

import dataclasses
import json
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import dagster as dg

from marin_assets.cluster.fleet import load_fleet
from marin_assets.cluster.job_objects import COMPUTE_DOMAIN_API, DOMAIN_LABEL, JOB_LABEL
from marin_assets.cluster.job_shape import job_shape
from marin_assets.cluster.manifests import SPEC_FILE, SPEC_MOUNT, multihost_jax_manifests
from marin_assets.cluster.routing import check_feasible
from marin_assets.cluster.tags import PLACEMENT_TAG, check_name, classify_tags
from marin_assets.orchestration.admission import parse_placement
from marin_assets.orchestration.launcher import POOL_TAG  # train on this fleet pool (else the first that fits)
from marin_assets.orchestration.training_backends.base import (
    WORKER_MODULE,
    TrainingBackend,
    TrainingFailed,
    TrainOutcome,
    outcome_from_session,
)
from marin_assets.settings import setting
from marin_assets.train.spec import TrainSpec


@dataclass
class KubeApis:
    """The three API groups the backend uses, all built on one cluster's ApiClient."""

    core: Any  # CoreV1Api
    batch: Any  # BatchV1Api
    custom: Any  # CustomObjectsApi


def _is_remote(path: str) -> bool:
    scheme, sep, _ = str(path).partition("://")
    return bool(sep) and scheme not in ("", "file", "local")


class KubernetesTrainingBackend(TrainingBackend):
    """Multi-host JAX on the cluster this run worker lives in (or ``kubeconfig_file``'s context).

    Sized from the run's tags; pods read the spec from a ConfigMap and write checkpoints to
    ``spec.out_dir``, which must therefore be an object-store URL (gs://...) every pod can reach.
    """

    fleet_file: str
    namespace: str | None = None  # default: $MARIN_K8S_NAMESPACE (set by the launcher), else "default"
    image: str | None = None  # default: $MARIN_K8S_IMAGE (the run worker's own image)
    kubeconfig_file: str | None = None  # None: in-cluster service account
    kube_context: str | None = None
    worker_command: list[str] | None = None  # default: [python, -m, WORKER_MODULE]
    poll_interval_s: float = 10.0
    timeout_s: float | None = None
    log_tail_lines: int = 40
    log_reader_join_s: float = 60.0

    def apis(self) -> KubeApis:
        import kubernetes

        if self.kubeconfig_file is None:
            # The pod's service account, loaded into a private Configuration: the process-global
            # default is left alone, as in the launcher.
            configuration = kubernetes.client.Configuration()
            kubernetes.config.load_incluster_config(client_configuration=configuration)
            api = kubernetes.client.ApiClient(configuration)
        else:
            api = kubernetes.config.new_client_from_config(
                config_file=self.kubeconfig_file, context=self.kube_context, persist_config=False
            )
        return KubeApis(
            kubernetes.client.CoreV1Api(api), kubernetes.client.BatchV1Api(api), kubernetes.client.CustomObjectsApi(api)
        )

    def _namespace(self) -> str:
        return check_name("namespace", self.namespace or setting("MARIN_K8S_NAMESPACE") or "default")

    def _image(self) -> str:
        image = self.image or setting("MARIN_K8S_IMAGE")
        if not image:
            raise ValueError(
                "kubernetes backend: no image (set `image` or run under the routing launcher, which sets MARIN_K8S_IMAGE)"
            )
        return image

    def plan(self, tags: Mapping[str, str], spec: TrainSpec, *, name: str, pipes_env: Mapping[str, str]) -> list[Any]:
        """The objects for one launch, in creation order; ValueError naming the tag or path at fault."""
        if classify_tags(tags).accelerator == "cpu":
            raise ValueError(
                "kubernetes backend: tag marin/accelerator is cpu; train CPU runs with the local or processes backend"
            )
        pool, request = choose_pool(load_fleet(self.fleet_file), tags)
        if spec.budget_file and not _is_remote(spec.budget_file):
            # A pod cannot read the controller's local budget file: this run's budget cut then reaches it as the
            # controller's termination on its next tick (``end_phase_now``), not at its checkpoint steps.
            spec = dataclasses.replace(spec, budget_file=None)
        local = [p for p in spec.paths() if not _is_remote(p)]
        if local:
            raise ValueError(f"kubernetes backend: {local} are local paths the pods cannot see; use object-store URLs (gs://...)")
        command = list(self.worker_command or ["python", "-m", WORKER_MODULE]) + ["--spec", f"{SPEC_MOUNT}/{SPEC_FILE}"]
        return multihost_jax_manifests(
            name,
            pool,
            image=self._image(),
            command=command,
            namespace=self._namespace(),
            env=dict(pipes_env),
            chips=request.chips,
            spec_json=json.dumps(spec.to_json_dict(), sort_keys=True),
        )

    def run(self, context, spec: TrainSpec) -> TrainOutcome:
        from dagster_k8s.pipes import PipesK8sPodLogsMessageReader

        name = f"train-{context.run.run_id[:8]}-{secrets.token_hex(2)}"
        reader = PipesK8sPodLogsMessageReader()
        with dg.open_pipes_session(context, dg.PipesEnvContextInjector(), reader) as session:
            objects = self.plan(context.run.tags, spec, name=name, pipes_env=session.get_bootstrap_env_vars())
            job = KubeTrainingJob(
                self.apis(),
                self._namespace(),
                name,
                objects,
                context,
                reader,
                poll_interval_s=self.poll_interval_s,
                timeout_s=self.timeout_s,
                log_tail_lines=self.log_tail_lines,
                log_reader_join_s=self.log_reader_join_s,
            )
            job.run()
        return outcome_from_session(f"kubernetes({name})", session)


def choose_pool(fleet, tags: Mapping[str, str]):
    """(pool, request) for a run's tags: the pool the launcher's capacity admission placed the
    run on (``marin/placement``), else the ``marin/pool`` tag's, else the first that fits."""
    request = classify_tags(tags)
    pools = check_feasible(fleet, request, job_id="run")
    wanted = tags.get(POOL_TAG)
    if tags.get(PLACEMENT_TAG):
        placed = parse_placement(tags[PLACEMENT_TAG], fleet, run_id="this run").pool
        if wanted is not None and wanted != placed:
            raise ValueError(f"tag {POOL_TAG}: {wanted!r} but the launcher placed the run on {placed!r} ({PLACEMENT_TAG})")
        wanted = placed
    if wanted is not None:
        check_name(f"tag {POOL_TAG}:", wanted)
        pools = [p for p in pools if p.name == wanted]
        if not pools:
            raise ValueError(f"tag {POOL_TAG}: pool {wanted!r} cannot hold {request.chips} x {request.accelerator}")
    reasons = []
    for pool in pools:
        try:
            job_shape(pool, request.chips)
            return pool, request
        except ValueError as err:
            reasons.append(str(err))
    raise ValueError(f"tag marin/chips: no pool can shape {request.chips} x {request.accelerator}: {'; '.join(reasons)}")


def pool_tags(fleet, tags: Mapping[str, str]) -> dict[str, str]:
    """The ``marin/pool`` tag for a run request, so the pool's run limit applies while it queues."""
    pool, _ = choose_pool(fleet, tags)
    return {POOL_TAG: pool.name}


def _kind(obj: Any) -> str:
    return obj["kind"] if isinstance(obj, dict) else obj.kind


def _name(obj: Any) -> str:
    return obj["metadata"]["name"] if isinstance(obj, dict) else obj.metadata.name


class KubeTrainingJob:
    """One launch: create the objects, watch the pods, read rank 0's Pipes messages, clean up."""

    def __init__(
        self,
        apis: KubeApis,
        namespace: str,
        name: str,
        objects: list[Any],
        context,
        reader,
        *,
        poll_interval_s: float,
        timeout_s: float | None,
        log_tail_lines: int,
        log_reader_join_s: float,
        sleep=time.sleep,
        clock=time.monotonic,
    ) -> None:
        self.apis, self.namespace, self.name, self.objects = apis, namespace, name, objects
        self.context, self.reader = context, reader
        self.poll_interval_s, self.timeout_s = poll_interval_s, timeout_s
        self.log_tail_lines, self.log_reader_join_s = log_tail_lines, log_reader_join_s
        self.sleep, self.clock = sleep, clock
        self.created: list[Any] = []
        self.jobs = [o for o in objects if _kind(o) == "Job"]
        self._reader_thread: threading.Thread | None = None
        self._reader_error: list[BaseException] = []

    def run(self) -> None:
        try:
            self.create_all()
            self.watch()
            self.join_reader()
        finally:
            self.delete_all()

    # -- create / delete --

    def create_all(self) -> None:
        group, version, plural = COMPUTE_DOMAIN_API
        for obj in self.objects:
            kind = _kind(obj)
            if kind == "ComputeDomain":
                self.apis.custom.create_namespaced_custom_object(group, version, self.namespace, plural, obj)
            elif kind == "ConfigMap":
                self.apis.core.create_namespaced_config_map(self.namespace, obj)
            elif kind == "Service":
                self.apis.core.create_namespaced_service(self.namespace, obj)
            elif kind == "Job":
                self.apis.batch.create_namespaced_job(self.namespace, obj)
            else:
                raise ValueError(f"no create call for kind {kind}")
            self.created.append(obj)
        self.context.log.info(
            f"created {', '.join(f'{_kind(o)}/{_name(o)}' for o in self.created)} in namespace {self.namespace}"
        )

    def delete_all(self) -> None:
        """Delete what this launch created, newest first; a failed delete is logged, not raised."""
        group, version, plural = COMPUTE_DOMAIN_API
        for obj in reversed(self.created):
            kind, name = _kind(obj), _name(obj)
            try:
                if kind == "Job":  # Background propagation: the Job's pods go with it
                    self.apis.batch.delete_namespaced_job(name, self.namespace, propagation_policy="Background")
                elif kind == "Service":
                    self.apis.core.delete_namespaced_service(name, self.namespace)
                elif kind == "ConfigMap":
                    self.apis.core.delete_namespaced_config_map(name, self.namespace)
                elif kind == "ComputeDomain":
                    self.apis.custom.delete_namespaced_custom_object(group, version, self.namespace, plural, name)
            except Exception as err:  # cleanup must go on; the leftover is named in the log
                self.context.log.warning(f"could not delete {kind}/{name}: {str(err)[:300]}")
        self.created = []

    # -- watch --

    def _pods(self) -> list[Any]:
        return self.apis.core.list_namespaced_pod(self.namespace, label_selector=f"{JOB_LABEL}={self.name}").items

    @staticmethod
    def _process(pod) -> str:
        labels = pod.metadata.labels or {}
        index = (pod.metadata.annotations or {}).get("batch.kubernetes.io/job-completion-index", "?")
        return f"domain {labels.get(DOMAIN_LABEL, '?')} index {index}"

    def _is_rank0(self, pod) -> bool:
        return (pod.metadata.labels or {}).get(DOMAIN_LABEL) == "0" and (pod.metadata.annotations or {}).get(
            "batch.kubernetes.io/job-completion-index"
        ) == "0"

    def _fail(self, pod) -> TrainingFailed:
        try:
            tail = self.apis.core.read_namespaced_pod_log(pod.metadata.name, self.namespace, tail_lines=self.log_tail_lines)
        except Exception as err:
            tail = f"(could not read its log: {str(err)[:200]})"
        reason = ""
        for status in pod.status.container_statuses or []:
            term = status.state.terminated if status.state else None
            if term is not None:
                reason = f" ({term.reason or 'Error'}, exit code {term.exit_code})"
        return TrainingFailed(
            f"training pod {pod.metadata.name} ({self._process(pod)}) failed{reason}; its last lines:\n{str(tail).rstrip()}"
        )

    def _start_reader(self, pod) -> None:
        def consume() -> None:
            try:
                self.reader.consume_pod_logs(self.context, self.apis.core, pod.metadata.name, self.namespace)
            except BaseException as err:  # surfaced after the pods finish
                self._reader_error.append(err)

        self._reader_thread = threading.Thread(target=consume, name=f"pipes-{pod.metadata.name}", daemon=True)
        self._reader_thread.start()

    def _jobs_succeeded(self) -> bool:
        """True when every Job completed; TrainingFailed if one failed with no failed pod left to show."""
        done = 0
        for job in self.jobs:
            status = self.apis.batch.read_namespaced_job_status(job.metadata.name, self.namespace).status
            if status is None:
                continue
            failed = [c for c in (status.conditions or []) if c.type == "Failed" and c.status == "True"]
            if failed or (status.failed or 0) > 0:
                why = f"{failed[0].reason}: {failed[0].message}" if failed else f"{status.failed} failed pod(s)"
                raise TrainingFailed(f"training job {job.metadata.name} failed ({why})")
            if (status.succeeded or 0) >= job.spec.completions:
                done += 1
        return done == len(self.jobs)

    def watch(self) -> None:
        started = self.clock()
        while True:
            pods = self._pods()
            failed = [p for p in pods if p.status is not None and p.status.phase == "Failed"]
            if failed:
                raise self._fail(sorted(failed, key=lambda p: p.metadata.name)[0])
            if self._reader_thread is None:
                rank0 = [
                    p for p in pods if self._is_rank0(p) and p.status is not None and p.status.phase in ("Running", "Succeeded")
                ]
                if rank0:
                    self._start_reader(rank0[0])
            if self._jobs_succeeded():
                if self._reader_thread is None:  # finished between two polls: read its whole log now
                    rank0 = [p for p in self._pods() if self._is_rank0(p)]
                    if not rank0:
                        raise TrainingFailed(
                            f"{self.name}: jobs succeeded but process 0's pod is gone; its Pipes messages cannot be read"
                        )
                    self._start_reader(rank0[0])
                return
            if self.timeout_s is not None and self.clock() - started > self.timeout_s:
                raise TrainingFailed(f"{self.name}: pods still running after {self.timeout_s:.0f}s")
            self.sleep(self.poll_interval_s)

    def join_reader(self) -> None:
        if self._reader_thread is not None:
            self._reader_thread.join(self.log_reader_join_s)
            if self._reader_thread.is_alive():
                raise TrainingFailed(
                    f"{self.name}: process 0's log stream did not end within {self.log_reader_join_s:.0f}s of the pods finishing"
                )
        if self._reader_error:
            raise TrainingFailed(f"{self.name}: reading process 0's log failed: {self._reader_error[0]}")
