"""Training backends: where a ``train/<run>`` phase runs, chosen as a Dagster resource.

* ``LocalTrainingBackend``: in-process ``marin_assets.train.loop.train`` (the demo's path).
* ``ProcessesTrainingBackend``: N worker processes on this machine, joined by
  ``jax.distributed`` (gloo collectives on CPU); what CI tests.
* ``KubernetesTrainingBackend``: the headless Service and one Indexed Job per interconnect
  domain from ``marin_assets.cluster.manifests``, created through the cluster's own API
  client from inside the (small, CPU-only) Dagster run worker pod. Its size comes from the
  run's ``marin/accelerator`` and ``marin/chips`` tags, validated against the fleet file.

All three return a ``TrainOutcome``; the asset turns it into materialisation metadata.

The worker contract (``marin_assets.train.worker`` implements it)::

    python -m marin_assets.train.worker --spec SPEC

SPEC is a JSON file or fsspec URL holding ``TrainSpec.to_json_dict()``: ``{"config":
config_to_dict(TrainConfig), "caches": {source: path} | path, "out_dir": str, "resume":
bool, "warm_start": str | null}``. Each process gets JAX_COORDINATOR_ADDRESS (host:port),
JAX_NUM_PROCESSES, JOB_COMPLETION_INDEX, MARIN_PROCESS_OFFSET (process id = offset + index,
see ``cluster.manifests.jax_distributed_args``), MARIN_DEVICES_PER_PROCESS when set, and
Dagster Pipes' bootstrap variables. Process 0 alone opens Pipes (``open_dagster_pipes()``):

* logs: ``pipes.log.info(...)`` (forwarded to the step's log);
* per-step metrics: ``pipes.report_custom_message({"metrics": row})``, ``row`` a metrics
  row with at least an int ``step`` and a float ``loss``;
* final counts, once: ``pipes.report_asset_materialization(metadata=...)`` with the keys of
  ``OUTCOME_FIELDS`` (``final_step``, ``tokens``, ``phase_start_step``, ``last_loss``,
  ``tokens_left`` {source: int}, ``counts`` {guard event: int}); Pipes wants the two
  mappings typed: ``{"raw_value": {...}, "type": "json"}``.

A worker that exits 0 without the final report fails the step: nothing useful happened.

Message readers: a temp file for local processes (``PipesTempFileMessageReader``: no ports,
nothing to clean up beyond a temp dir). On Kubernetes the rank-0 pod's log stream, read
through the same API client that created the pods (``PipesK8sPodLogsMessageReader``), so a
training job needs no bucket, credentials or network path back to the run worker beyond
the API server it already talks to; a GCS reader would also work but adds a bucket and its
IAM to every cluster for a few kilobytes of messages.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg

from marin_assets.orchestration.launcher import POOL_TAG  # train on this fleet pool (else the first that fits)

WORKER_MODULE = "marin_assets.train.worker"
OUTCOME_FIELDS = ("final_step", "tokens", "phase_start_step", "last_loss", "tokens_left", "counts")


class TrainingFailed(Exception):
    """A worker failed; the message carries which one and its last log lines."""


# ---- what goes in and what comes out ---------------------------------------------------------


@dataclass(frozen=True)
class TrainSpec:
    """One phase's training job, as every worker process reads it."""

    config: Any  # marin_assets.train.config.TrainConfig
    caches: Mapping[str, str] | str
    out_dir: str
    resume: bool = True
    warm_start: str | None = None
    telemetry_run: str | None = None  # the run name live metrics go under (the phase controller reads it)
    telemetry_root: str | None = None  # default: $MARIN_PREFIX/telemetry

    def __post_init__(self) -> None:
        if not isinstance(self.out_dir, str) or not self.out_dir:
            raise ValueError("TrainSpec.out_dir must be a non-empty path or URL")
        if not isinstance(self.caches, str):
            object.__setattr__(self, "caches", {str(k): str(v) for k, v in self.caches.items()})
            if not self.caches:
                raise ValueError("TrainSpec.caches names no cache")

    def to_json_dict(self) -> dict[str, Any]:
        from marin_assets.train.config import config_to_dict

        return {"config": config_to_dict(self.config), "caches": self.caches, "out_dir": self.out_dir,
                "resume": bool(self.resume), "warm_start": None if self.warm_start is None else str(self.warm_start),
                "telemetry_run": self.telemetry_run, "telemetry_root": self.telemetry_root}

    def paths(self) -> list[str]:
        caches = [self.caches] if isinstance(self.caches, str) else list(self.caches.values())
        return [self.out_dir, *caches, *([self.warm_start] if self.warm_start else [])]


@dataclass(frozen=True)
class TrainOutcome:
    """What a finished phase reports: where it ended and what its guards did."""

    backend: str
    final_step: int
    tokens: int
    phase_start_step: int
    last_loss: float | None
    tokens_left: dict[str, int]
    counts: dict[str, int]
    metrics: tuple[dict, ...] = field(default=(), repr=False)  # per-step rows, in step order
    stopped_by: str | None = None  # e.g. "SIGTERM": the phase was ended early at a checkpoint

    def __post_init__(self) -> None:
        for name in ("final_step", "tokens", "phase_start_step"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"outcome field {name!r}: {value!r} is not a non-negative integer")
        if self.phase_start_step > self.final_step:
            raise ValueError(f"outcome: phase_start_step {self.phase_start_step} > final_step {self.final_step}")
        if self.last_loss is not None and (isinstance(self.last_loss, bool) or not math.isfinite(self.last_loss)):
            raise ValueError(f"outcome field 'last_loss': {self.last_loss!r} is not a finite number")
        for name in ("tokens_left", "counts"):
            value = getattr(self, name)
            if not isinstance(value, Mapping) or not all(
                    isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in value.items()):
                raise ValueError(f"outcome field {name!r}: {value!r} is not a mapping of names to integers")

    def metadata(self) -> dict[str, Any]:
        """Plain values for the materialisation (the versioned-asset wrapper types them)."""
        return {"backend": self.backend, "final_step": self.final_step, "tokens_trained": self.tokens,
                "phase_start_step": self.phase_start_step, "last_loss": self.last_loss,
                "tokens_left": dict(self.tokens_left), "guard_events": dict(self.counts),
                "steps_reported": len(self.metrics), "stopped_by": self.stopped_by or ""}


def _plain(value: Any) -> Any:
    """A Pipes metadata entry arrives as a MetadataValue; its ``.value`` is the raw value."""
    return getattr(value, "value", value)


def outcome_from_report(backend: str, metadata: Mapping[str, Any], metrics: Sequence[Any]) -> TrainOutcome:
    """Check process 0's final report and metrics messages; ValueError naming the field."""
    values = {k: _plain(v) for k, v in metadata.items()}
    missing = [k for k in OUTCOME_FIELDS if k not in values]
    if missing:
        raise ValueError(f"{backend}: the worker's final report lacks {missing}")
    last_loss = values["last_loss"]
    if isinstance(last_loss, int) and not isinstance(last_loss, bool):
        last_loss = float(last_loss)
    rows = []
    for i, message in enumerate(metrics):
        row = message.get("metrics") if isinstance(message, Mapping) else None
        if not isinstance(row, Mapping) or not isinstance(row.get("step"), int) or not isinstance(row.get("loss"), (int, float)):
            raise ValueError(f"{backend}: metrics message {i} is not {{'metrics': {{'step': int, 'loss': float, ...}}}}: "
                             f"{str(message)[:200]}")
        rows.append(dict(row))
    return TrainOutcome(backend, values["final_step"], values["tokens"], values["phase_start_step"], last_loss,
                        dict(values["tokens_left"]), dict(values["counts"]),
                        tuple(sorted(rows, key=lambda r: r["step"])), values.get("stopped_by") or None)


def _outcome_from_session(backend: str, session) -> TrainOutcome:
    reports = [r for r in session.get_reported_results() if isinstance(r, dg.MaterializeResult)]
    if len(reports) != 1:
        raise TrainingFailed(f"{backend}: the workers finished but process 0 sent {len(reports)} final reports "
                             f"(expected 1); see the step log for their output")
    customs = session.get_custom_messages()
    return outcome_from_report(backend, reports[0].metadata or {}, customs)


# ---- the backends ----------------------------------------------------------------------------


class TrainingBackend(dg.ConfigurableResource):
    """Base: ``run(context, spec)`` trains one phase and returns its ``TrainOutcome``."""

    def run(self, context: dg.AssetExecutionContext, spec: TrainSpec) -> TrainOutcome:
        raise NotImplementedError


class LocalTrainingBackend(TrainingBackend):
    """In-process training (today's path): no Pipes, the loop's own result."""

    log_every_steps: int = 16

    def run(self, context, spec: TrainSpec) -> TrainOutcome:
        from marin_assets.train.loop import train

        rows: list[dict] = []

        def log_row(row: dict) -> None:
            rows.append(dict(row))
            if self.log_every_steps > 0 and row["step"] % self.log_every_steps == 0:
                context.log.info(f"step {row['step']}: loss {row['loss']:.4f}")

        result = train(spec.config, spec.caches, spec.out_dir, resume=spec.resume, warm_start=spec.warm_start,
                       log_fn=log_row, telemetry_run=spec.telemetry_run, telemetry_root=spec.telemetry_root)
        if result.stopped_by:
            context.log.info(result.stop_message)
        return TrainOutcome("local", result.final_step, result.tokens, result.phase_start_step,
                            None if result.last_loss is None else float(result.last_loss),
                            {k: int(v) for k, v in result.tokens_left.items()},
                            {k: int(v) for k, v in result.counts.items()}, tuple(rows), result.stopped_by)


def _tail(path: Path, lines: int) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(deque(f, maxlen=lines)).rstrip()
    except OSError as err:
        return f"(no log: {err})"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop_all(procs: Sequence[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM the processes still running, then SIGKILL whatever outlives the grace period."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def worker_env(index: int, processes: int, coordinator: str, devices_per_process: int | None = None) -> dict[str, str]:
    """What a manifest sets for worker ``index`` of a ``processes``-process job (see train/mesh.py)."""
    env = {"JAX_COORDINATOR_ADDRESS": coordinator, "JAX_NUM_PROCESSES": str(processes),
           "JOB_COMPLETION_INDEX": str(index), "MARIN_PROCESS_OFFSET": "0"}
    if devices_per_process is not None:
        env["MARIN_DEVICES_PER_PROCESS"] = str(devices_per_process)
    return env


def launch_workers(argv: list[str], processes: int, devices_per_process: int | None, logs: Path, *,
                   env: Mapping[str, str] | None = None, log: Callable[[str], None] | None = None,
                   timeout_s: float | None = None, kill_grace_s: float = 10.0, log_tail_lines: int = 40,
                   poll_interval_s: float = 0.2) -> None:
    """Run ``processes`` copies of ``argv`` as one ``jax.distributed`` job on this host and wait.

    Each gets ``worker_env`` (coordinator on a free local port) on top of this process's
    environment and ``env``; its output goes to ``logs/process-<i>.log``. The first to fail
    stops the rest and raises TrainingFailed with its last log lines (the ``processes``
    backend and ``marin train --processes`` both launch through here).
    """
    coordinator = f"127.0.0.1:{_free_port()}"
    procs: list[subprocess.Popen] = []
    try:
        for i in range(processes):
            proc_env = {**os.environ, **(env or {}), **worker_env(i, processes, coordinator, devices_per_process)}
            with open(logs / f"process-{i}.log", "wb") as out:
                procs.append(subprocess.Popen(argv, env=proc_env, stdout=out, stderr=subprocess.STDOUT))
        if log is not None:
            log(f"started {processes} worker processes (coordinator {coordinator})")
        _watch(procs, logs, timeout_s, kill_grace_s, log_tail_lines, poll_interval_s)
    finally:
        _stop_all(procs, kill_grace_s)


def _watch(procs: list[subprocess.Popen], logs: Path, timeout_s: float | None, kill_grace_s: float,
           log_tail_lines: int, poll_interval_s: float) -> None:
    started = time.monotonic()
    while True:
        codes = [p.poll() for p in procs]
        for i, code in enumerate(codes):
            if code not in (None, 0):
                # One dead process would leave the others blocked in a collective: stop them now.
                _stop_all(procs, kill_grace_s)
                raise TrainingFailed(f"worker process {i} exited with code {code}; its last lines:\n"
                                     f"{_tail(logs / f'process-{i}.log', log_tail_lines)}")
        if all(code == 0 for code in codes):
            return
        if timeout_s is not None and time.monotonic() - started > timeout_s:
            raise TrainingFailed(f"worker processes still running after {timeout_s:.0f}s; stopped them")
        time.sleep(poll_interval_s)


class ProcessesTrainingBackend(TrainingBackend):
    """N local worker processes forming one ``jax.distributed`` job (gloo on CPU)."""

    processes: int = 2
    devices_per_process: int | None = None  # sets MARIN_DEVICES_PER_PROCESS (CPU: fake devices)
    worker_command: list[str] | None = None  # default: [python, -m, marin_assets.train.worker]
    timeout_s: float | None = None
    kill_grace_s: float = 10.0
    log_tail_lines: int = 40
    poll_interval_s: float = 0.2

    def _check(self) -> None:
        if not 1 <= self.processes <= 1024:
            raise ValueError(f"processes: {self.processes} is not in [1, 1024]")
        if self.devices_per_process is not None and not 1 <= self.devices_per_process <= 1024:
            raise ValueError(f"devices_per_process: {self.devices_per_process} is not in [1, 1024]")
        if self.worker_command is not None and (not self.worker_command or not all(isinstance(a, str) for a in self.worker_command)):
            raise ValueError("worker_command must be a non-empty list of strings (never a shell string)")

    def process_env(self, index: int, coordinator: str) -> dict[str, str]:
        return worker_env(index, self.processes, coordinator, self.devices_per_process)

    def run(self, context, spec: TrainSpec) -> TrainOutcome:
        self._check()
        command = list(self.worker_command or [sys.executable, "-m", WORKER_MODULE])
        with tempfile.TemporaryDirectory(prefix="marin-train-") as tmp:
            spec_path = Path(tmp, "spec.json")
            spec_path.write_text(json.dumps(spec.to_json_dict()))
            with dg.open_pipes_session(context, dg.PipesEnvContextInjector(), dg.PipesTempFileMessageReader()) as session:
                self._run_processes(context, command + ["--spec", str(spec_path)], session.get_bootstrap_env_vars(), Path(tmp))
            return _outcome_from_session(f"processes({self.processes})", session)

    def _run_processes(self, context, argv: list[str], pipes_env: Mapping[str, str], logs: Path) -> None:
        launch_workers(argv, self.processes, self.devices_per_process, logs, env=pipes_env, log=context.log.info,
                       timeout_s=self.timeout_s, kill_grace_s=self.kill_grace_s,
                       log_tail_lines=self.log_tail_lines, poll_interval_s=self.poll_interval_s)


# ---- Kubernetes ------------------------------------------------------------------------------


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
    worker_command: list[str] | None = None  # default: [python, -m, marin_assets.train.worker]
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
            api = kubernetes.config.new_client_from_config(config_file=self.kubeconfig_file,
                                                           context=self.kube_context, persist_config=False)
        return KubeApis(kubernetes.client.CoreV1Api(api), kubernetes.client.BatchV1Api(api),
                        kubernetes.client.CustomObjectsApi(api))

    def _namespace(self) -> str:
        from marin_assets.cluster.tags import check_name

        return check_name("namespace", self.namespace or os.environ.get("MARIN_K8S_NAMESPACE") or "default")

    def _image(self) -> str:
        image = self.image or os.environ.get("MARIN_K8S_IMAGE")
        if not image:
            raise ValueError("kubernetes backend: no image (set `image` or run under the routing launcher, "
                             "which sets MARIN_K8S_IMAGE)")
        return image

    def plan(self, tags: Mapping[str, str], spec: TrainSpec, *, name: str, pipes_env: Mapping[str, str]) -> list[Any]:
        """The objects for one launch, in creation order; ValueError naming the tag or path at fault."""
        from marin_assets.cluster.fleet import load_fleet
        from marin_assets.cluster.manifests import SPEC_FILE, SPEC_MOUNT, multihost_jax_manifests

        from marin_assets.cluster.tags import classify_tags

        if classify_tags(tags).accelerator == "cpu":
            raise ValueError("kubernetes backend: tag marin/accelerator is cpu; train CPU runs with the local "
                             "or processes backend")
        pool, request = choose_pool(load_fleet(self.fleet_file), tags)
        local = [p for p in spec.paths() if not _is_remote(p)]
        if local:
            raise ValueError(f"kubernetes backend: {local} are local paths the pods cannot see; "
                             f"use object-store URLs (gs://...)")
        command = list(self.worker_command or ["python", "-m", WORKER_MODULE]) + ["--spec", f"{SPEC_MOUNT}/{SPEC_FILE}"]
        return multihost_jax_manifests(name, pool, image=self._image(), command=command, namespace=self._namespace(),
                                       env=dict(pipes_env), chips=request.chips,
                                       spec_json=json.dumps(spec.to_json_dict(), sort_keys=True))

    def run(self, context, spec: TrainSpec) -> TrainOutcome:
        from dagster_k8s.pipes import PipesK8sPodLogsMessageReader

        name = f"train-{context.run.run_id[:8]}-{secrets.token_hex(2)}"
        reader = PipesK8sPodLogsMessageReader()
        with dg.open_pipes_session(context, dg.PipesEnvContextInjector(), reader) as session:
            objects = self.plan(context.run.tags, spec, name=name, pipes_env=session.get_bootstrap_env_vars())
            job = KubeTrainingJob(self.apis(), self._namespace(), name, objects, context, reader,
                                  poll_interval_s=self.poll_interval_s, timeout_s=self.timeout_s,
                                  log_tail_lines=self.log_tail_lines, log_reader_join_s=self.log_reader_join_s)
            job.run()
        return _outcome_from_session(f"kubernetes({name})", session)


def choose_pool(fleet, tags: Mapping[str, str]):
    """(pool, request) for a run's tags: the ``marin/pool`` tag's pool, else the first that fits."""
    from marin_assets.cluster.manifests import job_shape
    from marin_assets.cluster.routing import check_feasible
    from marin_assets.cluster.tags import check_name, classify_tags

    request = classify_tags(tags)
    pools = check_feasible(fleet, request, job_id="run")
    wanted = tags.get(POOL_TAG)
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

    def __init__(self, apis: KubeApis, namespace: str, name: str, objects: list[Any], context, reader, *,
                 poll_interval_s: float, timeout_s: float | None, log_tail_lines: int, log_reader_join_s: float,
                 sleep=time.sleep, clock=time.monotonic) -> None:
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
        from marin_assets.cluster.manifests import COMPUTE_DOMAIN_API

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
        self.context.log.info(f"created {', '.join(f'{_kind(o)}/{_name(o)}' for o in self.created)} "
                              f"in namespace {self.namespace}")

    def delete_all(self) -> None:
        """Delete what this launch created, newest first; a failed delete is logged, not raised."""
        from marin_assets.cluster.manifests import COMPUTE_DOMAIN_API

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
        from marin_assets.cluster.manifests import JOB_LABEL

        return self.apis.core.list_namespaced_pod(self.namespace, label_selector=f"{JOB_LABEL}={self.name}").items

    @staticmethod
    def _process(pod) -> str:
        from marin_assets.cluster.manifests import DOMAIN_LABEL

        labels = pod.metadata.labels or {}
        index = (pod.metadata.annotations or {}).get("batch.kubernetes.io/job-completion-index", "?")
        return f"domain {labels.get(DOMAIN_LABEL, '?')} index {index}"

    def _is_rank0(self, pod) -> bool:
        from marin_assets.cluster.manifests import DOMAIN_LABEL

        return ((pod.metadata.labels or {}).get(DOMAIN_LABEL) == "0"
                and (pod.metadata.annotations or {}).get("batch.kubernetes.io/job-completion-index") == "0")

    def _fail(self, pod) -> TrainingFailed:
        try:
            tail = self.apis.core.read_namespaced_pod_log(pod.metadata.name, self.namespace, tail_lines=self.log_tail_lines)
        except Exception as err:
            tail = f"(could not read its log: {str(err)[:200]})"
        reason = ""
        for status in (pod.status.container_statuses or []):
            term = status.state.terminated if status.state else None
            if term is not None:
                reason = f" ({term.reason or 'Error'}, exit code {term.exit_code})"
        return TrainingFailed(f"training pod {pod.metadata.name} ({self._process(pod)}) failed{reason}; "
                              f"its last lines:\n{str(tail).rstrip()}")

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
                rank0 = [p for p in pods if self._is_rank0(p) and p.status is not None
                         and p.status.phase in ("Running", "Succeeded")]
                if rank0:
                    self._start_reader(rank0[0])
            if self._jobs_succeeded():
                if self._reader_thread is None:  # finished between two polls: read its whole log now
                    rank0 = [p for p in self._pods() if self._is_rank0(p)]
                    if not rank0:
                        raise TrainingFailed(f"{self.name}: jobs succeeded but process 0's pod is gone; "
                                             f"its Pipes messages cannot be read")
                    self._start_reader(rank0[0])
                return
            if self.timeout_s is not None and self.clock() - started > self.timeout_s:
                raise TrainingFailed(f"{self.name}: pods still running after {self.timeout_s:.0f}s")
            self.sleep(self.poll_interval_s)

    def join_reader(self) -> None:
        if self._reader_thread is not None:
            self._reader_thread.join(self.log_reader_join_s)
            if self._reader_thread.is_alive():
                raise TrainingFailed(f"{self.name}: process 0's log stream did not end within "
                                     f"{self.log_reader_join_s:.0f}s of the pods finishing")
        if self._reader_error:
            raise TrainingFailed(f"{self.name}: reading process 0's log failed: {self._reader_error[0]}")
