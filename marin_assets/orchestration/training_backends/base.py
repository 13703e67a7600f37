"""What every training backend shares: the outcome a phase reports, its checks, the base resource."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg

from marin_assets.train.spec import TrainSpec

WORKER_MODULE = "marin_assets.orchestration.training_backends.pipes_worker"  # train.distributed.worker + Pipes
# (checkpoint folder, step) of a committed checkpoint; train.checkpoints.checkpointing's own alias is not imported: it loads JAX.
OnCheckpoint = Callable[[Path | str, int], None]
OUTCOME_FIELDS = ("final_step", "tokens", "phase_start_step", "last_loss", "tokens_left", "counts")


class TrainingFailed(Exception):
    """A worker failed; the message carries which one and its last log lines."""


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
                isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in value.items()
            ):
                raise ValueError(f"outcome field {name!r}: {value!r} is not a mapping of names to integers")

    def metadata(self) -> dict[str, Any]:
        """Plain values for the materialisation (the versioned-asset wrapper types them)."""
        return {
            "backend": self.backend,
            "final_step": self.final_step,
            "tokens_trained": self.tokens,
            "phase_start_step": self.phase_start_step,
            "last_loss": self.last_loss,
            "tokens_left": dict(self.tokens_left),
            "guard_events": dict(self.counts),
            "steps_reported": len(self.metrics),
            "stopped_by": self.stopped_by or "",
        }


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
            raise ValueError(
                f"{backend}: metrics message {i} is not {{'metrics': {{'step': int, 'loss': float, ...}}}}: {str(message)[:200]}"
            )
        rows.append(dict(row))
    return TrainOutcome(
        backend,
        values["final_step"],
        values["tokens"],
        values["phase_start_step"],
        last_loss,
        dict(values["tokens_left"]),
        dict(values["counts"]),
        tuple(sorted(rows, key=lambda r: r["step"])),
        values.get("stopped_by") or None,
    )


def outcome_from_session(backend: str, session) -> TrainOutcome:
    reports = [r for r in session.get_reported_results() if isinstance(r, dg.MaterializeResult)]
    if len(reports) != 1:
        raise TrainingFailed(
            f"{backend}: the workers finished but process 0 sent {len(reports)} final reports "
            f"(expected 1); see the step log for their output"
        )
    customs = session.get_custom_messages()
    return outcome_from_report(backend, reports[0].metadata or {}, customs)


class TrainingBackend(dg.ConfigurableResource):
    """Base: ``run(context, spec)`` trains one phase and returns its ``TrainOutcome``."""

    def run(self, context: dg.AssetExecutionContext, spec: TrainSpec) -> TrainOutcome:
        raise NotImplementedError

    def run_announcing(self, context: dg.AssetExecutionContext, spec: TrainSpec, on_checkpoint: OnCheckpoint) -> TrainOutcome:
        """``run``, calling ``on_checkpoint(folder, step)`` on the calling thread for each checkpoint that
        commits while it runs. A backend whose workers cannot say so (their commits are seen only in the
        work dir afterwards) announces none: the caller scans the work dir once ``run`` returns."""
        return self.run(context, spec)
