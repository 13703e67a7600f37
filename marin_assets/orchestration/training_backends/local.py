"""The ``local`` backend: in-process training, the demo's path."""

from __future__ import annotations

from marin_assets.orchestration.training_backends.base import TrainingBackend, TrainOutcome
from marin_assets.train.spec import TrainSpec


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
                       log_fn=log_row, telemetry_run=spec.telemetry_run, telemetry_root=spec.telemetry_root,
                   allow_tokenizer_change=spec.allow_tokenizer_change)
        if result.stopped_by:
            context.log.info(result.stop_message)
        return TrainOutcome("local", result.final_step, result.tokens, result.phase_start_step,
                            None if result.last_loss is None else float(result.last_loss),
                            {k: int(v) for k, v in result.tokens_left.items()},
                            {k: int(v) for k, v in result.counts.items()}, tuple(rows), result.stopped_by)
