"""The launcher's local backend: runs on this machine through Dagster's DefaultRunLauncher.

DefaultRunLauncher asks the code location's gRPC server to start ``dagster api execute_run``
in a subprocess, so runs really execute here (``dagster dev``, tests). A run executed in a
process of its own choosing (``execute_in_process``: the demo, tests) names that process in
its tags (``in_process_tags``), so terminating it can still reach it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from dagster import DagsterRun, DefaultRunLauncher

from marin_assets.cluster.tags import JobRequest
from marin_assets.orchestration.compat import (
    GRPC_INFO_TAG,
    CanCancelExecutionRequest,
    CanCancelExecutionResult,
    CheckRunHealthResult,
    LaunchRunContext,
    WorkerStatus,
    serializable_error_info_from_exc_info,
)

LOCAL = "local"
# SIGTERM reaches an in-process run through these tags; the trainer turns it into a
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


def _grpc_health(run: DagsterRun) -> CheckRunHealthResult:
    """Ask the code server that started ``run`` whether its execution is still alive."""
    from dagster import deserialize_value

    from marin_assets.orchestration.compat import DagsterGrpcClient  # deferred (import cost): google (grpc)

    info = run.tags.get(GRPC_INFO_TAG)
    if not info:
        return CheckRunHealthResult(WorkerStatus.UNKNOWN, "run has no gRPC server tag")
    try:
        grpc = json.loads(info, strict=False)  # as dagster_shared.seven.json reads it
        client = DagsterGrpcClient(
            port=grpc.get("port"), socket=grpc.get("socket"), host=grpc.get("host"), use_ssl=bool(grpc.get("use_ssl", False))
        )
        res = deserialize_value(
            client.can_cancel_execution(CanCancelExecutionRequest(run_id=run.run_id)), CanCancelExecutionResult
        )
    except Exception:
        return CheckRunHealthResult(WorkerStatus.UNKNOWN, str(serializable_error_info_from_exc_info(sys.exc_info())))
    if res.can_cancel:
        return CheckRunHealthResult(WorkerStatus.RUNNING)
    return CheckRunHealthResult(WorkerStatus.FAILED, "the local run process is no longer running")


@dataclass
class LocalBackend:
    """Runs on this machine through Dagster's DefaultRunLauncher (gRPC server -> subprocess)."""

    accelerators: tuple[str, ...] = ("cpu",)
    name: str = LOCAL
    regions: tuple[str, ...] = ()
    launcher: DefaultRunLauncher = field(default_factory=DefaultRunLauncher)

    def serves(self, request: JobRequest) -> bool:
        """Whether this backend runs ``request``'s accelerator (any region)."""
        return request.accelerator in self.accelerators

    def register_instance(self, instance) -> None:
        """Hand the instance to the wrapped DefaultRunLauncher."""
        self.launcher.register_instance(instance)

    def launch(self, context: LaunchRunContext, request: JobRequest, tags: Mapping[str, str]) -> None:
        """Start the run through the code server: a local process, nothing to size."""
        self.launcher.launch_run(context)

    def terminate(self, run_id: str) -> bool:
        """Stop a run: SIGTERM to an in-process run, else the code server interrupts it."""
        run = self.launcher._instance.get_run_by_id(run_id) if self.launcher.has_instance else None
        if run is not None and not run.is_finished and GRPC_INFO_TAG not in run.tags and PID_TAG in run.tags:
            return terminate_in_process_run(self.launcher._instance, run)
        # The code server interrupts the run process (SIGINT), which the trainer treats like SIGTERM.
        return self.launcher.terminate(run_id)

    def check_health(self, run: DagsterRun) -> CheckRunHealthResult:
        """Whether the code server still runs ``run``'s execution."""
        return _grpc_health(run)

    def join(self, timeout: int) -> None:
        """Wait for the code server's run processes (tests)."""
        self.launcher.join(timeout=timeout)

    def dispose(self) -> None:
        """Release the wrapped launcher."""
        self.launcher.dispose()
