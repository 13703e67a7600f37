"""The ``local`` backend: in-process training, the demo's path."""

from __future__ import annotations

import queue

from marin_assets.orchestration.training_backends.base import OnCheckpoint, TrainingBackend, TrainOutcome
from marin_assets.train.spec import TrainSpec


class LocalTrainingBackend(TrainingBackend):
    """In-process training (today's path): no Pipes, the loop's own result."""

    log_every_steps: int = 16

    def run(self, context, spec: TrainSpec) -> TrainOutcome:
        return self._train(context, spec, None)

    def run_announcing(self, context, spec: TrainSpec, on_checkpoint: OnCheckpoint) -> TrainOutcome:
        if type(self).run is not LocalTrainingBackend.run:  # a subclass's own run (a fault drill) is what runs
            return self.run(context, spec)
        return self._train(context, spec, on_checkpoint)

    def _train(self, context, spec: TrainSpec, on_checkpoint: OnCheckpoint | None) -> TrainOutcome:
        from marin_assets.hf import warm_start_weights  # deferred (import cost): jax, optax
        from marin_assets.train.loop import train_spec  # deferred (import cost): jax, optax, polars, pyarrow

        rows: list[dict] = []
        # A sharded save commits on its writer thread: the commit is queued there and announced here, on
        # the thread that runs the steps (a Dagster context is not for other threads).
        committed: queue.SimpleQueue = queue.SimpleQueue()

        def announce() -> None:
            while on_checkpoint is not None and not committed.empty():
                on_checkpoint(*committed.get())

        def log_row(row: dict) -> None:
            rows.append(dict(row))
            announce()
            if self.log_every_steps > 0 and row["step"] % self.log_every_steps == 0:
                context.log.info(f"step {row['step']}: loss {row['loss']:.4f}")

        result = train_spec(
            spec,
            log_fn=log_row,
            on_checkpoint=None if on_checkpoint is None else lambda folder, step: committed.put((folder, step)),
            read_weights=warm_start_weights,
        )
        announce()  # the final checkpoint commits after the last row
        if result.stopped_by:
            context.log.info(result.stop_message)
        return TrainOutcome(
            "local",
            result.final_step,
            result.tokens,
            result.phase_start_step,
            None if result.last_loss is None else float(result.last_loss),
            {k: int(v) for k, v in result.tokens_left.items()},
            {k: int(v) for k, v in result.counts.items()},
            tuple(rows),
            result.stopped_by,
        )
