"""The training loop: one phase of steps, with hooks for what happens between them.

    result = train(config, {"web": cache_dir}, out_dir, resume=True)

State is one pytree (``TrainState``) so a checkpoint is a single flatten and a resume a single
unflatten. The host loop only feeds batches (read ahead on a thread) to the jitted step
(``step.py``) and runs the hooks (``hooks.py``) after each step; ``train`` registers the
metrics emitter (``emit.py``), the stop-request check (``stopping.py``), the checkpoint cadence
(``checkpoints/checkpointing.py``) and the held-out loss (``data/heldout.py``) as hooks, and a caller adds its
own with ``Hooks.add_hook(fn, every=N)``. Where the phase starts (fresh, resume, warm start) is
``restore.py``; what it leaves (``TrainResult``) is ``result.py``.

Mesh (``train/distributed/mesh.py``): the step runs on a ``("data", "sequence", "expert")`` mesh of every
global device, one process or many (one device is the 1 x 1 x 1 mesh of the same code; the sequence axis is
``TrainConfig.sequence_parallel``, 1 unless a long-context phase splits each row over devices). The state is
laid out by ``mesh.state_shardings`` (routed experts split over ``expert``, the rest
replicated), the routed experts run through the mesh's EP transport, and each process reads
only its rows of every batch. Checkpoints are sharded: each process writes the shards it owns
while the next steps run (``checkpoints/checkpointing.py``, ``checkpoints/sharded_checkpoint.py``); metrics, the loss
curve and train_result.json are written by process 0 alone. The work dir (all
of those) is a local dir or any fsspec URL (``gs://``; ``memory://`` in tests).

A cache is one Levanter split, or a DataKit cache folder (``train/`` + ``validation/``):
the train split is trained on and the validation split gives the held-out loss at the end.
Before step 1 the model's vocabulary is checked against the cache's tokenizer; after the
last step, a phase that skipped most of its steps raises ``TooManySkippedSteps``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from marin_assets.store.fsutil import child, filesystem
from marin_assets.telemetry import TelemetryWriter
from marin_assets.train.checkpoints.checkpointing import CheckpointCadence, OnCheckpoint
from marin_assets.train.checkpoints.work_dir import check_is_folder, work_dir_lease
from marin_assets.train.compile_cache import ensure_compile_cache
from marin_assets.train.config import TrainConfig, config_to_dict
from marin_assets.train.data.batches import MixedLoader
from marin_assets.train.data.heldout import HeldOutLoss, validation_loss
from marin_assets.train.data.sources import check_vocab, data_identity, eos_ids, open_sources, train_loader
from marin_assets.train.distributed import hosts as distributed
from marin_assets.train.distributed import mesh as meshlib
from marin_assets.train.emit import (
    TELEMETRY_FLUSH_SECONDS,
    Emitter,
    default_telemetry_root,
    default_telemetry_run,
    dir_name,
    host_row,
)
from marin_assets.train.hooks import Hooks, StepInfo, with_context_hooks
from marin_assets.train.metrics import MetricsLogger
from marin_assets.train.restore import Run, WeightsReader, fresh_run, optimizer_for, resolve_checkpoint, start, state_layout
from marin_assets.train.result import TooManySkippedSteps, TrainResult, finish
from marin_assets.train.spec import TrainSpec
from marin_assets.train.state import Model, init_state, moe_model
from marin_assets.train.step import default_model, make_train_step, phase_lrs, train_step_for
from marin_assets.train.stopping import CheckedStop, StopCheck, StopSignals

__all__ = [
    "Hooks",
    "StepInfo",
    "TooManySkippedSteps",
    "TrainResult",
    "check_vocab",
    "data_identity",
    "default_model",
    "default_telemetry_run",
    "init_state",
    "make_train_step",
    "open_sources",
    "optimizer_for",
    "phase_lrs",
    "resolve_checkpoint",
    "state_layout",
    "train",
    "validation_loss",
]

log = logging.getLogger(__name__)


class _Stop(Exception):
    """Raised by the ``stop_at_step`` hook to abandon the loop like a killed process would."""


def train(
    config: TrainConfig,
    cache_dirs: Mapping[str, str | Path] | str | Path,
    out_dir: str | Path,
    resume: bool = True,
    warm_start: str | Path | None = None,
    log_fn: Callable[[dict], None] | None = None,
    model: Model | None = None,
    stop_at_step: int | None = None,
    mesh=None,
    checkpoint_dir: str | Path | None = None,
    telemetry_root: str | None = None,
    telemetry_run: str | None = None,
    allow_tokenizer_change: bool = False,
    hooks: Hooks | None = None,
    on_checkpoint: OnCheckpoint | None = None,
    stop_check: StopCheck | None = None,
    read_weights: WeightsReader | None = None,
) -> TrainResult:
    """Train one phase of ``config.num_steps`` steps; returns where it ended.

    cache_dirs: {source name: data} (a single path is named "train"); data is a dataset index
      (``datasets/<source>``'s dataset.json or its folder: shard caches read in place), a
      DataKit cache folder (train/ + validation/) or one Levanter split. Validation splits
      give ``TrainResult.validation_loss``.
    out_dir: the resumable work dir (checkpoints/, metrics.jsonl, loss_curve.png,
      train_result.json): a local dir or any fsspec URL, so a pod writes ``gs://...``
      exactly as a laptop writes its disk; result paths come back as URLs then.
    resume: continue from the newest valid checkpoint in ``out_dir`` if there is one.
    warm_start: a checkpoint (or another phase's out dir) to start this phase from: its
      params, router bias, global step and data position are kept; the schedule restarts at
      this phase's step 0; the optimizer state is kept if the optimizer is unchanged. ``hf:PATH``
      names an HF model folder instead: its weights alone (step 0, data position 0, a fresh
      optimizer), read by ``read_weights``.
    log_fn: called with each step's metrics row (e.g. to forward to Dagster).
    model: the model functions (``state.Model``); default the MoE.
    stop_at_step: abandon the loop (no final checkpoint) after this global step, as a kill would.
    mesh: the ``("data", "sequence", "expert")`` device mesh (``mesh.make_mesh``); default every global
      device with the config's sequence axis (``mesh.train_mesh``). With several processes every one calls
      ``train`` with the same arguments.
    checkpoint_dir: where checkpoints go and resume reads from (default ``out_dir/checkpoints``);
      any fsspec URL, e.g. ``gs://bucket/run/checkpoints``.
    telemetry_root / telemetry_run: every step's metrics are appended to this telemetry store
      (default ``$MARIN_PREFIX/telemetry``) under this run name (default
      ``default_telemetry_run``), flushed every few seconds and at each checkpoint.
    SIGTERM/SIGINT during the steps checkpoint the current step and end the phase early:
      the result says ``stopped_by`` (a warm start from it begins at that step + 1).
    allow_tokenizer_change: resume or warm start even when a source's tokenizer differs from
      the one the checkpoint trained on (refused by default: the ids would mean other text).
    hooks: the caller's hooks (``hooks.Hooks``), run after the built-in ones at their global steps.
    on_checkpoint: called ``(folder, step)`` on process 0 after each checkpoint's COMMITTED marker is
      written, possibly from the background thread that wrote it (hand it to your own thread; an
      error it raises fails that save). A save that never commits is never announced.
    stop_check: asked at each permanent checkpoint step (``signals.CheckedStop``, e.g. the budget
      file's ``budget.BudgetStop``); the reason it returns ends the phase there, checkpointed, and
      becomes the result's ``stopped_by``.
    read_weights: reads an ``hf:PATH`` warm start (``restore.WeightsReader``); the callers that take
      one from a user pass ``marin_assets.hf.warm_start_weights`` (train does not import hf, which
      sits above it); without one such a warm start is refused.
    Raises ValueError/FileNotFoundError before compute for a config or cache that cannot
    work (an unfinished cache included), and TooManySkippedSteps after a phase that skipped
    most of its steps.
    """
    ensure_compile_cache()
    model = model or moe_model()
    mesh = mesh or meshlib.train_mesh(config)
    out_dir = os.fspath(out_dir)  # the work dir: a local dir or any fsspec URL (gs://...)
    sources, validation_dirs = _check_inputs(config, mesh, cache_dirs, out_dir)
    # One writer per work dir: a second trainer would delete this one's in-progress checkpoint as a leftover.
    with work_dir_lease(out_dir, holder=distributed.is_writer(), agree=distributed.agree):
        loader = train_loader(config, sources)
        ckpt_root = child(out_dir, "checkpoints") if checkpoint_dir is None else checkpoint_dir
        telemetry_run = telemetry_run or default_telemetry_run(out_dir, config.phase)
        run, opt = fresh_run(
            config,
            model,
            mesh,
            ckpt_root,
            telemetry_run=telemetry_run,
            data_tokenizers=data_identity(sources),
            allow_tokenizer_change=allow_tokenizer_change,
        )
        emitter = _emitter(config, out_dir, telemetry_root, telemetry_run, log_fn)
        start(run, emitter.logger, resume, warm_start, read_weights)
        first = int(run.state.step)
        # The handlers stay on through finish: a stop request racing the last step (the phase
        # controller read slightly stale telemetry) must not kill a phase that has just completed.
        with StopSignals() as stop:
            step_fn = train_step_for(config, opt, model, mesh, run.state_sh)
            held_out = None
            if validation_dirs and stop_at_step is None:
                masked_by = (
                    {k: v for k, v in eos_ids(sources).items() if k in validation_dirs} if config.document_masking else None
                )
                held_out = HeldOutLoss(config, model, validation_dirs, mesh, masked_by)
            cadence = CheckpointCadence(run, emitter, on_checkpoint)
            checked = (
                None
                if stop_check is None
                else CheckedStop(stop_check, config.phase, config.checkpoint_every_steps, run.tokens_at)
            )
            registry = _builtin_hooks(run, emitter, stop, stop_at_step, held_out, cadence, checked)
            hooks = with_context_hooks(hooks)
            if hooks is not None and len(hooks):
                registry.add_hook(cadence.wait, every=1)  # a caller's hooks see the step's checkpoint committed
            registry.extend(hooks)
            try:
                _run_steps(run, step_fn, loader, registry)
            except _Stop:
                pass
            finally:
                try:
                    cadence.wait()  # the save in flight commits (or raises) before the phase returns
                finally:
                    emitter.close()  # also on an exception: the steps logged so far reach the store
            checked_reason = checked.reason if checked is not None else None
            stopped_by = (stop.received or checked_reason) if int(run.state.step) < run.end_step else None
            result = finish(
                run, loader, out_dir, emitter, first, stop_at_step is not None, stopped_by, held_out.loss if held_out else None
            )
            if stop.received is not None and stopped_by is None:
                log.warning(
                    "%s arrived after the last step (%d): the phase is complete, nothing to stop",
                    stop.received,
                    result.final_step,
                )
        return result


def _emitter(
    config: TrainConfig, out_dir: str, telemetry_root: str | None, telemetry_run: str, log_fn: Callable[[dict], None] | None
) -> Emitter:
    """The metrics emitter: metrics.jsonl in ``out_dir`` and the telemetry store under ``telemetry_run``
    (a bad run name fails here, before compute)."""
    telemetry = TelemetryWriter(telemetry_root or default_telemetry_root(), telemetry_run, flush_seconds=TELEMETRY_FLUSH_SECONDS)
    logger = MetricsLogger(
        out_dir,
        use_wandb=config.wandb and distributed.is_writer(),
        run_name=f"{dir_name(out_dir)}-{config.phase}",
        config=config_to_dict(config),
    )
    return Emitter(logger, log_fn, telemetry)


def _check_inputs(config: TrainConfig, mesh, cache_dirs, out_dir: str) -> tuple[dict, dict]:
    """Everything that can be wrong with the config or data fails here, before compute (and
    before the work dir is made). Returns the opened sources and their validation splits."""
    meshlib.check_fits(mesh, config.model, config.batch_size, config.seq_len, config.microbatches, config.sequence_parallel)
    check_is_folder(out_dir)
    fs, root = filesystem(out_dir)
    fs.makedirs(root, exist_ok=True)
    sources = open_sources(cache_dirs)
    check_vocab(config, sources)
    return sources, {name: s.validation for name, s in sources.items() if s.validation is not None}


def _builtin_hooks(
    run: Run,
    emitter: Emitter,
    stop: StopSignals,
    stop_at_step: int | None,
    held_out: HeldOutLoss | None,
    cadence: CheckpointCadence,
    checked: CheckedStop | None = None,
) -> Hooks:
    """``train``'s own hooks, in the order they must run (see ``hooks.py``)."""
    hooks = Hooks()
    hooks.add_hook(emitter.push, every=1)  # the previous step's row: log_fn may raise a stop signal there
    if stop_at_step is not None:
        hooks.add_hook(functools.partial(_abandon_at, stop_at_step), every=1)
    hooks.add_hook(stop.mark, every=1)
    if checked is not None:  # before the checkpoint hook: the step it stops at is checkpointed as the final one
        hooks.add_hook(checked, every=1)
    hooks.add_hook(cadence, every=1)
    hooks.add_hook(emitter.end, every=None, at_end=True)
    if held_out is not None:
        hooks.add_hook(held_out, every=None, at_end=True)
    return hooks


def _abandon_at(stop_at_step: int, info: StepInfo) -> None:
    """The ``stop_at_step`` hook: leave the loop with no checkpoint, as a kill would."""
    if info.step >= stop_at_step:
        raise _Stop()


def _run_steps(run: Run, step_fn, loader: MixedLoader, hooks: Hooks) -> None:
    """Steps from the state's step to the phase end (or a stop signal), the hooks after each;
    then the ``at_end`` hooks."""
    config, begin, end_step = run.config, int(run.state.step), run.end_step
    info = StepInfo(begin, run.state, end_step)
    if begin < end_step:
        lrs = phase_lrs(config, run.phase_start, begin, end_step)
        batches = loader.iterate(run.position, prefetch=config.prefetch, rows=meshlib.process_rows(run.mesh, config.batch_size))
        with contextlib.closing(batches):  # the prefetch thread stops before the phase returns
            for step in range(begin + 1, end_step + 1):
                local, ok, next_position = next(batches)  # this process's rows of the global batch
                tokens = meshlib.shard_batch(run.mesh, local, config.batch_size)
                ok = distributed.all_processes(ok)  # one corrupt row anywhere skips the step everywhere
                run.state, metrics = step_fn(run.state, tokens, np.bool_(ok), lrs[step - begin - 1])
                run.position = next_position
                row_fn = functools.partial(host_row, step, metrics, config, run.tokens_at(step))
                info = StepInfo(step, run.state, end_step, row_fn=row_fn)
                hooks.run(info)
                if info.stopped_by is not None:
                    log.warning("stopped at step %d by %s (checkpointed)", step, info.stopped_by)
                    break
    hooks.run_end(info, stepped=begin < end_step)


def train_spec(spec: TrainSpec, **options) -> TrainResult:
    """``train`` on a backend's job: the spec's config, data, work dir, warm start, telemetry run and stop
    check; ``options`` are the rest of ``train``'s arguments, the caller's (log_fn, mesh, on_checkpoint,
    read_weights, ...)."""
    return train(
        spec.config,
        spec.caches,
        spec.out_dir,
        resume=spec.resume,
        warm_start=spec.warm_start,
        telemetry_run=spec.telemetry_run,
        telemetry_root=spec.telemetry_root,
        allow_tokenizer_change=spec.allow_tokenizer_change,
        stop_check=spec.stop_check(),
        **options,
    )
