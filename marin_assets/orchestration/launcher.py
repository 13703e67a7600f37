"""RoutingRunLauncher: send each Dagster run to a backend chosen from its ``marin/*`` tags.

Backends: ``local`` (``local_backend.py``: Dagster's DefaultRunLauncher, runs execute on this
machine) and one Kubernetes backend per configured cluster (``k8s_backend.py``: a CPU-only run
worker Job per run, each cluster through its own kubeconfig and context). The config schema,
with a ``dagster.yaml`` example, is in ``launcher_config.py``; dagster.cluster.yaml is a
production instance.

Tags are validated by ``marin_assets.cluster.tags.classify_tags`` (allow-lists and tight
regexes). A bad tag, a run no backend serves, or (with ``fleet_file``) a run bigger than any
pool fails at launch with a message naming the tag; no tag value ever reaches a command line.
The chosen backend is recorded in the ``marin/backend`` run tag so terminate and health
checks go back to the same backend.

Pod size from asset tags: a run pod requests (and is limited to) the ``marin/cpu`` and
``marin/memory`` of its run's tags, else of its assets' tags (``effective_run_tags``), else
the cluster's run_worker_cpu/memory. ``run_queue.MarinQueuedRunCoordinator`` writes the
asset-derived tags onto each run as it is queued, so the run queue's per-pool run limits
(``run_concurrency_config``) hold backfill runs too.

Capacity (with ``fleet_file``): ``admission.py``. The launcher admits a run only when its
pool has room by the same Router and reservation ledger as the fleet simulation; a run that
does not fit goes back to Dagster's run queue, and a higher-priority run that fits only by
evicting lower ones terminates them (marked failed, so Dagster's run retries resume them
later from their checkpoints). Waiting needs Dagster's run queue (a QueuedRunCoordinator);
without one a run that does not fit is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagster import DagsterEvent, DagsterRun, QueuedRunCoordinator

from marin_assets.cluster.fleet import load_fleet
from marin_assets.cluster.routing import check_feasible
from marin_assets.cluster.tags import (
    POOL_TAG,
    PRIORITY_TAG,
    JobRequest,
    check_accelerator,
    check_name,
    check_resource_tags,
    classify_tags,
)
from marin_assets.orchestration.admission import Admission, CapacityAdmission, candidate_pools
from marin_assets.orchestration.compat import (
    CheckRunHealthResult,
    ConfigurableClass,
    ConfigurableClassData,
    DagsterLaunchFailedError,
    JobFailureData,
    LaunchRunContext,
    RunFailureReason,
    RunLauncher,
    WorkerStatus,
)
from marin_assets.orchestration.k8s_backend import K8sClusterBackend
from marin_assets.orchestration.launcher_config import launcher_config_type, launcher_kwargs
from marin_assets.orchestration.local_backend import (  # noqa: F401 (re-exported: callers name them here)
    HOST_TAG,
    LOCAL,
    PID_TAG,
    LocalBackend,
    in_process_tags,
    terminate_in_process_run,
)
from marin_assets.orchestration.run_queue import (  # noqa: F401 (re-exported: dagster.yaml and callers name them here)
    MarinQueuedRunCoordinator,
    effective_run_tags,
    pool_run_slots,
    run_asset_tags,
    run_concurrency_config,
    run_concurrency_yaml,
)

BACKEND_TAG = "marin/backend"


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
        self.admission: CapacityAdmission | None = None
        if fleet_file is not None:
            self.fleet = load_fleet(fleet_file)
            self.admission = CapacityAdmission(self.fleet)
        super().__init__()

    # ---- ConfigurableClass ----

    @property
    def inst_data(self) -> ConfigurableClassData | None:
        """The config this launcher was built from (ConfigurableClass)."""
        return self._inst_data

    @classmethod
    def config_type(cls) -> dict[str, Any]:
        """The ``run_launcher: config:`` schema (``launcher_config.py``)."""
        return launcher_config_type()

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]):
        """Build the launcher from its validated instance config."""
        return cls(inst_data=inst_data, **launcher_kwargs(config_value))

    def register_instance(self, instance) -> None:
        """Register the instance with the launcher and every backend."""
        super().register_instance(instance)
        self.local.register_instance(instance)
        for c in self.clusters.values():
            c.register_instance(instance)

    # ---- routing ----

    def backends(self) -> list:
        """Every backend, clusters first (config order), then local."""
        return [*self.clusters.values(), self.local]

    def check_pool_tag(self, tags: Mapping[str, str], request: JobRequest, *, from_assets: bool = False) -> None:
        """A ``marin/pool`` tag must name a fleet pool of the run's accelerator (and region). Without a
        fleet there are no pools: a tag the run's assets carry (the DataKit's, a cluster's queueing hint)
        is left alone, so the embedded default runs them locally; one the run itself carries is refused."""
        pool = tags.get(POOL_TAG)
        if pool is None:
            return
        check_name(f"tag {POOL_TAG}:", pool)
        if self.fleet is None:
            if from_assets:
                return
            raise ValueError(f"tag {POOL_TAG}: {pool!r} given but the launcher has no fleet_file to check it against")
        if pool not in {p.name for p in check_feasible(self.fleet, request, job_id="run")}:
            raise ValueError(
                f"tag {POOL_TAG}: pool {pool!r} cannot hold {request.chips} x {request.accelerator}"
                + (f" in {request.region}" if request.region else "")
            )

    def choose_backend(self, request: JobRequest):
        """Pick the backend for a classified request; ValueError with the reason if none."""
        if self.fleet is not None:
            check_feasible(self.fleet, request, job_id="run")
        if request.cluster is not None:
            return self._named_backend(request, request.cluster)
        for backend in self.backends():
            if backend.serves(request):
                return backend
        if self.unmatched == LOCAL:
            return self.local
        raise ValueError(
            f"no backend serves accelerator {request.accelerator}" + (f" in region {request.region}" if request.region else "")
        )

    def _named_backend(self, request: JobRequest, name: str):
        """The backend a ``marin/cluster`` tag names, if it serves the request."""
        backend = self.clusters.get(name) if name != LOCAL else self.local
        if backend is None:
            raise ValueError(
                f"tag marin/cluster: no backend named {request.cluster!r}; configured: {[b.name for b in self.backends()]}"
            )
        if not backend.serves(request):
            raise ValueError(
                f"tag marin/cluster: backend {request.cluster!r} does not serve "
                f"{request.accelerator}" + (f" in {request.region}" if request.region else "")
            )
        return backend

    def _backend_for_run(self, run: DagsterRun):
        """The backend its ``marin/backend`` tag names, or None."""
        name = run.tags.get(BACKEND_TAG)
        if name is None:
            return None
        if name == LOCAL:
            return self.local
        return self.clusters.get(name)

    def _route(self, run: DagsterRun, workspace) -> tuple[dict[str, str], JobRequest, Any]:
        """The run's effective tags, its request and its backend; ValueError naming a bad tag."""
        tags = effective_run_tags(run, workspace)
        request = classify_tags(tags)
        self.check_pool_tag(tags, request, from_assets=POOL_TAG not in run.tags)
        check_resource_tags(tags)  # marin/cpu, marin/memory: refused here whichever backend runs it
        return tags, request, self.choose_backend(request)

    # ---- capacity ----

    def _admit(self, run: DagsterRun, request: JobRequest, tags: Mapping[str, str], backend) -> Admission | None:
        """Capacity admission (with a fleet): where the run goes, or why it waits; None without a fleet."""
        if self.admission is None:
            return None
        pools = candidate_pools(self.admission.fleet, request, tags, backend.regions)
        decision = self.admission.admit(
            self._instance, run.run_id, request, pools, lambda victim: self._preempt(victim, run, request)
        )
        if decision.placement is None and not isinstance(self._instance.run_coordinator, QueuedRunCoordinator):
            raise ValueError(f"{decision.reason}, and there is no run queue (QueuedRunCoordinator) to wait in")
        return decision

    def _preempt(self, victim_id: str, by: DagsterRun, request: JobRequest) -> None:
        """Stop a run evicted for ``by``, and mark it failed so Dagster's run retries resume it later."""
        victim = self._instance.get_run_by_id(victim_id)
        if victim is None or victim.is_finished:
            return
        self.terminate(victim_id)
        message = f"preempted by {request.priority} run {by.run_id}: stopped to free its chips; a retry resumes it"
        self._instance.report_run_failed(
            victim,
            message=message,
            job_failure_data=JobFailureData(error=None, failure_reason=RunFailureReason.UNEXPECTED_TERMINATION),
        )
        self._instance.report_engine_event(
            f"preempted run {victim_id} ({victim.tags.get(PRIORITY_TAG, 'batch')}) to make room", by, cls=self.__class__
        )

    def _wait(self, run: DagsterRun, reason: str) -> None:
        """Put the run back in Dagster's queue (as the queue daemon does when a code server is down)."""
        if self.admission is not None and self.admission.first_wait(run.run_id):
            self._instance.report_engine_event(f"waits in the queue: {reason}", run, cls=self.__class__)
        self._instance.report_dagster_event(DagsterEvent.job_enqueue(run), run_id=run.run_id)

    # ---- RunLauncher ----

    def launch_run(self, context: LaunchRunContext) -> None:
        """Route the run, admit it (with a fleet), and launch it on its backend, or queue it again."""
        run = context.dagster_run
        try:
            tags, request, backend = self._route(run, context.workspace)
            admission = self._admit(run, request, tags, backend)
        except ValueError as err:
            message = f"RoutingRunLauncher refused run {run.run_id}: {err}"
            self._instance.report_engine_event(message, run, cls=self.__class__)
            # DagsterInstance.launch_run (or the queue daemon) marks the run failed.
            raise DagsterLaunchFailedError(message) from None
        if admission is not None and admission.placement is None:
            self._wait(run, admission.reason)
            return
        self._instance.add_run_tags(run.run_id, {BACKEND_TAG: backend.name})
        self._instance.report_engine_event(self._routing_note(request, backend, admission), run, cls=self.__class__)
        backend.launch(context, request, tags)

    def _routing_note(self, request: JobRequest, backend, admission: Admission | None) -> str:
        """The engine event that says where the run went and why."""
        note = "" if backend.serves(request) else " (no cluster serves it; unmatched: local)"
        if admission is not None and admission.placement is not None:
            p = admission.placement
            note += f"; placed on pool {p.pool} domains {list(p.domains)} ({sum(p.chips)} chips)"
        return (
            f"Routing {request.priority} run ({request.chips} x {request.accelerator}"
            f"{', ' + request.region if request.region else ''}) to backend {backend.name}{note}"
        )

    def terminate(self, run_id: str) -> bool:
        """Stop a run through the backend that launched it."""
        run = self._instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return False
        backend = self._backend_for_run(run) or (self.local if PID_TAG in run.tags else None)
        if backend is None:
            return False
        return backend.terminate(run_id)

    @property
    def supports_check_run_worker_health(self) -> bool:
        """Run monitoring for local runs alone adds nothing over Dagster's defaults."""
        return bool(self.clusters)

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        """The run worker's health, from the backend that launched it."""
        backend = self._backend_for_run(run)
        if backend is None:
            return CheckRunHealthResult(WorkerStatus.UNKNOWN, f"run has no known {BACKEND_TAG} tag")
        return backend.check_health(run)

    def join(self, timeout: int = 30) -> None:
        """Wait for local run processes (tests)."""
        if self.has_instance:
            self.local.join(timeout)

    def dispose(self) -> None:
        """Release every backend."""
        for backend in self.backends():
            backend.dispose()
