"""What a phase leaves when it ends: ``TrainResult``, train_result.json, the loss curve, and the
``TooManySkippedSteps`` verdict on a phase that skipped most of its steps."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import jax

from marin_assets.store.fsutil import child, filesystem, join, write_bytes_atomic, write_json_atomic
from marin_assets.train.checkpoints import checkpoint as ckpt
from marin_assets.train.data.batches import MixedLoader
from marin_assets.train.distributed import hosts as distributed
from marin_assets.train.emit import Emitter, dir_name
from marin_assets.train.guards import COUNTERS
from marin_assets.train.metrics import DROP_RATE, plot_loss_curve, read_metrics, telemetry_rows
from marin_assets.train.moe_plots import moe_telemetry_png
from marin_assets.train.restore import Run

SKIP_COUNTERS = ("skipped_nonfinite", "skipped_spike", "skipped_bad_batch")


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """Where a call of ``train`` left the phase (train_result.json holds the same)."""

    final_step: int
    tokens: int  # tokens trained on across all phases so far (global step * tokens/step of each)
    metrics_path: Path | str  # a URL string when out_dir is one (as for every path here)
    checkpoint_dir: Path | str | None  # the newest valid checkpoint after this call (a URL off local disk)
    loss_curve_png: Path | str | None
    counts: dict  # guard events: skipped_nonfinite, skipped_spike, skipped_bad_batch, update_clipped, grad_clipped
    data_position: dict
    tokens_left: dict  # per source, tokens not yet seen in the first epoch
    phase_start_step: int
    last_loss: float | None
    validation_loss: float | None = None  # cross-entropy on the validation split(s); None without one
    stopped_by: str | None = None  # "SIGTERM"/"SIGINT": the phase was ended early, checkpointed at final_step
    telemetry_run: str | None = None  # the run name its metrics carry in the telemetry store

    @property
    def stop_message(self) -> str | None:
        """``stopped at step N by SIGTERM`` for a phase a signal ended early; else None."""
        return None if self.stopped_by is None else f"stopped at step {self.final_step} by {self.stopped_by}"


class TooManySkippedSteps(RuntimeError):
    """A phase skipped more than ``guards.max_skipped_fraction`` of its steps: it trained on
    little or nothing. Checkpoints and metrics are written; ``result`` says where it ended."""

    def __init__(self, result: TrainResult, phase: str, skipped: int, steps: int, limit: float):
        self.result, self.skipped, self.steps = result, skipped, steps
        reasons = {k: result.counts.get(k, 0) for k in SKIP_COUNTERS}
        super().__init__(
            f"phase {phase!r} skipped {skipped} of {steps} steps (more than {limit:.0%}; "
            f"{reasons}): the run trained on little or nothing"
        )


def finish(
    run: Run,
    loader: MixedLoader,
    out_dir: str,
    emitter: Emitter,
    start: int,
    stopped: bool,
    stopped_by: str | None,
    held_out: float | None,
) -> TrainResult:
    """Loss curve (from the telemetry store), train_result.json; raise if the phase mostly
    skipped. ``stopped``: the loop was abandoned (``stop_at_step``); a phase ended by a signal
    is a clean, checkpointed early end. Process 0 writes; the others read its metrics file
    after the barrier."""
    distributed.barrier("train-finish")  # process 0's metrics file is complete before anyone reads it
    rows = read_metrics(emitter.logger.path)
    counts = rows[-1].get("counts", {}) if rows else {k: 0 for k in COUNTERS}
    final_step = int(jax.device_get(run.state.step)) if not stopped else (int(rows[-1]["step"]) if rows else start)
    png = _loss_curve(run, emitter, out_dir, final_step) if distributed.is_writer() else None
    if distributed.is_writer():
        fs, root = filesystem(out_dir)
        write_json_atomic(
            fs,
            join(root, "train_result.json"),
            {
                "final_step": final_step,
                "counts": counts,
                "data_position": run.position.to_json(),
                "validation_loss": held_out,
                "stopped_by": stopped_by,
                "telemetry_run": emitter.telemetry.run,
            },
        )
    result = TrainResult(
        final_step=final_step,
        tokens=run.tokens_at(final_step),
        metrics_path=emitter.logger.path,
        checkpoint_dir=ckpt.latest_valid(run.ckpt_root),
        loss_curve_png=png,
        counts=counts,
        data_position=run.position.to_json(),
        tokens_left=loader.tokens_left(run.position),
        phase_start_step=run.phase_start,
        last_loss=emitter.last_row["loss"] if emitter.last_row else None,
        validation_loss=held_out,
        stopped_by=stopped_by,
        telemetry_run=emitter.telemetry.run,
    )
    skipped, steps = _phase_skips(rows, run)
    limit = run.config.guards.max_skipped_fraction
    if not stopped and steps and skipped > limit * steps:
        raise TooManySkippedSteps(result, run.config.phase, skipped, steps, limit)
    return result


def _loss_curve(run: Run, emitter: Emitter, out_dir: str, final_step: int) -> Path | str | None:
    """loss_curve.png of this phase's steps (a run name may hold earlier phases, or a longer
    rolled-back attempt), from the telemetry store; None when it holds none. An MoE run also gets
    moe_telemetry.png (drop rate, expert-load CV)."""
    steps = (run.phase_start + 1, max(final_step, run.phase_start + 1))
    curve = telemetry_rows(emitter.telemetry.store.query(run=emitter.telemetry.run, latest=True, steps=steps))
    if not curve:
        return None
    if any(DROP_RATE in row for row in curve):  # an MoE run: its drop rate and expert load beside the loss
        fs, where = filesystem(os.fspath(child(out_dir, "moe_telemetry.png")))
        write_bytes_atomic(fs, where, moe_telemetry_png(curve, title=f"{dir_name(out_dir)}: MoE telemetry"))
    return plot_loss_curve(curve, child(out_dir, "loss_curve.png"), title=dir_name(out_dir))


def _phase_skips(rows: list[dict], run: Run) -> tuple[int, int]:
    """(skipped, steps) of this phase, from the metrics file (it survives resumes)."""
    mine = [r for r in rows if r.get("phase") == run.config.phase and int(r["step"]) > run.phase_start]
    return sum(bool(r.get("skipped")) for r in mine), len(mine)
