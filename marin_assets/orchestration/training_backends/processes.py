"""The ``processes`` backend: N local worker processes joined by ``jax.distributed`` (gloo
on CPU), reporting through Dagster Pipes over a temp file; what CI tests."""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import dagster as dg

from marin_assets.orchestration.training_backends.base import (
    WORKER_MODULE,
    TrainingBackend,
    TrainOutcome,
    outcome_from_session,
)
from marin_assets.orchestration.training_backends.launch import launch_workers, worker_env
from marin_assets.train.spec import TrainSpec


class ProcessesTrainingBackend(TrainingBackend):
    """N local worker processes forming one ``jax.distributed`` job (gloo on CPU)."""

    processes: int = 2
    devices_per_process: int | None = None  # sets MARIN_DEVICES_PER_PROCESS (CPU: fake devices)
    worker_command: list[str] | None = None  # default: [python, -m, WORKER_MODULE]
    timeout_s: float | None = None
    kill_grace_s: float = 10.0
    log_tail_lines: int = 40
    poll_interval_s: float = 0.2

    def _check(self) -> None:
        if not 1 <= self.processes <= 1024:
            raise ValueError(f"processes: {self.processes} is not in [1, 1024]")
        if self.devices_per_process is not None and not 1 <= self.devices_per_process <= 1024:
            raise ValueError(f"devices_per_process: {self.devices_per_process} is not in [1, 1024]")
        if self.worker_command is not None and (
            not self.worker_command or not all(isinstance(a, str) for a in self.worker_command)
        ):
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
            return outcome_from_session(f"processes({self.processes})", session)

    def _run_processes(self, context, argv: list[str], pipes_env: Mapping[str, str], logs: Path) -> None:
        launch_workers(
            argv,
            self.processes,
            self.devices_per_process,
            logs,
            env=pipes_env,
            log=context.log.info,
            timeout_s=self.timeout_s,
            kill_grace_s=self.kill_grace_s,
            log_tail_lines=self.log_tail_lines,
            poll_interval_s=self.poll_interval_s,
        )
