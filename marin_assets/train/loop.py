"""The training loop: the jitted step, checkpoint cadence, resume, warm start, held-out loss.

    result = train(config, {"web": cache_dir}, out_dir, resume=True)

State is one pytree (``TrainState``: params, optimizer state, guard windows, router bias,
step, RNG) so a checkpoint is a single flatten and a resume a single unflatten. The step is
``jax.jit``-compiled once; the phase-relative LR, the guards and the skip decision all
happen inside it. The host loop only feeds batches (read ahead on a thread), writes the
previous step's metrics while the current step runs, and checkpoints on its cadence.

Mesh (``train/mesh.py``): the step runs on a ``("data", "expert")`` mesh of every global
device, one process or many (one device is the 1 x 1 mesh of the same code). The state is
laid out by ``mesh.state_shardings`` (routed experts split over ``expert``, the rest
replicated), the routed experts run through the mesh's EP transport, and each process reads
only its rows of every batch. Checkpoints gather the state on every process and are written
by process 0 alone; metrics, the loss curve and train_result.json too. The work dir (all
of those) is a local dir or any fsspec URL (``gs://``; ``memory://`` in tests).

A cache is one Levanter split, or a DataKit cache folder (``train/`` + ``validation/``):
the train split is trained on and the validation split gives the held-out loss at the end.
Before step 1 the model's vocabulary is checked against the cache's tokenizer; after the
last step, a phase that skipped most of its steps raises ``TooManySkippedSteps``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from marin_assets.store.fsutil import child, filesystem, is_local, join, write_json_atomic
from marin_assets.train import checkpoint as ckpt
from marin_assets.train import mesh as meshlib
from marin_assets.train.compile_cache import ensure_compile_cache
from marin_assets.train.config import TrainConfig, config_to_dict
from marin_assets.train.data import DataPosition, MixedLoader, SourceData, held_out_batches, open_source
from marin_assets.train.guards import COUNTERS, clip_grads, clip_updates, global_norm, record, should_skip
from marin_assets.telemetry import TelemetryWriter
from marin_assets.train.metrics import MetricsLogger, plot_loss_curve, read_metrics, telemetry_fields, telemetry_rows
from marin_assets.train.optimizers import Optimizer, make_optimizer
from marin_assets.train.schedules import learning_rate
from marin_assets.train.state import Model, TrainState, init_state, moe_model

log = logging.getLogger(__name__)
SKIP_COUNTERS = ("skipped_nonfinite", "skipped_spike", "skipped_bad_batch")


@dataclasses.dataclass(frozen=True)
class TrainResult:
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
        return None if self.stopped_by is None else f"stopped at step {self.final_step} by {self.stopped_by}"


class TooManySkippedSteps(RuntimeError):
    """A phase skipped more than ``guards.max_skipped_fraction`` of its steps: it trained on
    little or nothing. Checkpoints and metrics are written; ``result`` says where it ended."""

    def __init__(self, result: TrainResult, phase: str, skipped: int, steps: int, limit: float):
        self.result, self.skipped, self.steps = result, skipped, steps
        reasons = {k: result.counts.get(k, 0) for k in SKIP_COUNTERS}
        super().__init__(f"phase {phase!r} skipped {skipped} of {steps} steps (more than {limit:.0%}; "
                         f"{reasons}): the run trained on little or nothing")


class _Stop(Exception):
    """Raised by ``stop_at_step`` to abandon the loop like a killed process would."""


TELEMETRY_FLUSH_SECONDS = 5.0  # live metrics reach the store (and the phase controller) this often
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)  # Dagster's local run termination sends SIGINT


def default_telemetry_root() -> str:
    from marin_assets.telemetry import default_root

    return default_root()


def default_telemetry_run(out_dir: str | os.PathLike, phase: str) -> str:
    """``<out dir name>-<phase>-<hash of the absolute out dir or its URL>``: a valid run name
    (scratch dirs like ``.work`` are not) and a distinct one per out dir (they often share a
    name); a resume in the same out dir logs under the same run."""
    def safe(text: str) -> str:
        return re.sub(r"[^A-Za-z0-9_.=+-]+|\.{2,}", "-", text).lstrip("._=+-")[:48]

    where = _absolute(out_dir)
    digest = hashlib.sha256(where.encode()).hexdigest()[:8]
    return "-".join(part for part in (safe(_dir_name(where)), safe(phase), digest) if part)


def _absolute(out_dir: str | os.PathLike) -> str:
    """A local dir as its resolved absolute path; a URL as spelled (less a trailing slash)."""
    fs, path = filesystem(os.fspath(out_dir))
    return str(Path(path).resolve()) if is_local(fs) else os.fspath(out_dir).rstrip("/")


def _dir_name(out_dir: str | os.PathLike) -> str:
    """The last part of a local path or URL (``gs://b/runs/kestrel`` -> ``kestrel``)."""
    return os.fspath(out_dir).rstrip("/").rsplit("/", 1)[-1]


class _StopSignals:
    """While training, SIGTERM/SIGINT ask the loop to checkpoint the step it is on and return
    (a clean, resumable end) instead of dying mid-step; a second signal aborts at once."""

    def __init__(self):
        self.received: str | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.received is not None:
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name} while stopping")
        self.received = signal.Signals(signum).name
        log.warning("%s received: checkpointing at the end of this step, then stopping", self.received)

    def __enter__(self) -> "_StopSignals":
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def default_model() -> Model:
    return moe_model()


def make_train_step(config: TrainConfig, opt: Optimizer, model: Model, mesh, state_sh):
    """step(state, tokens[B,S] int32, batch_ok bool, lr float32) -> (state, metrics), jitted on
    ``mesh`` with the state laid out by ``state_sh`` (``mesh.state_shardings``).

    The learning rate comes in as an argument (``phase_lrs``), not from the schedule inside
    the step: the compiled step then depends on the model, optimizer and guards only, so
    phases with other schedules and sweep runs of other lengths reuse one compilation (the
    persistent compile cache finds it by its HLO)."""
    model_cfg, guard_cfg = config.model, config.guards
    ep = meshlib.expert_parallel(mesh, model_cfg)  # routed experts over the "expert" axis

    def step(state: TrainState, tokens, batch_ok, lr):
        params = state.params
        (loss, aux), grads = jax.value_and_grad(
            lambda p: model.loss_fn(p, tokens, model_cfg, state.router_bias, None, ep), has_aux=True)(params)
        grad_norm = global_norm(grads)
        decision = should_skip(guard_cfg, state.guard, loss, grad_norm, batch_ok)
        skip = decision["skip"]
        grads, grad_clipped = clip_grads(guard_cfg, grads, grad_norm, skip)
        updates, new_opt = opt.update(grads, state.opt_state, params, lr)
        updates, update_norm, update_clipped = clip_updates(guard_cfg, state.guard, updates)
        # Skip-step: zero update AND the optimizer state stays as it was.
        new_params = jax.tree.map(lambda p, u: jnp.where(skip, p, p + u.astype(p.dtype)), params, updates)
        new_opt = jax.tree.map(lambda old, new: jnp.where(skip, old, new), state.opt_state, new_opt)
        new_bias = jnp.where(skip, state.router_bias, model.next_router_bias(state.router_bias, aux, model_cfg))
        guard = record(guard_cfg, state.guard, decision, loss, grad_norm, update_norm, grad_clipped, update_clipped)
        rng, _ = jax.random.split(state.rng)
        new_state = TrainState(params=new_params, opt_state=new_opt, guard=guard, router_bias=new_bias,
                               step=state.step + 1, rng=rng)
        metrics = {"loss": loss, "lr": lr, "grad_norm": grad_norm, "update_norm": update_norm,
                   "skipped": skip, "counts": guard["counts"],
                   # routed-expert assignments lost to EP capacity, summed over layers
                   "dropped": jnp.sum(aux["dropped"]) if isinstance(aux, dict) and "dropped" in aux else 0}
        return new_state, metrics

    return meshlib.jit_step(step, mesh, state_sh, n_scalars=2)


def check_vocab(config: TrainConfig, sources: Mapping[str, SourceData]) -> None:
    """A model smaller than the cache's tokenizer would see every batch as corrupt."""
    for name, source in sorted(sources.items()):
        vocab = source.vocab_size
        if vocab is not None and vocab > config.model.vocab_size:
            raise ValueError(
                f"model.vocab_size is {config.model.vocab_size} but cache {name!r} ({source.where}) was tokenized with a "
                f"vocabulary of {vocab}: every batch would hold ids the model cannot embed; set model.vocab_size "
                f">= {vocab} (or leave it unset to take it from the cache)")


def open_sources(cache_dirs: Mapping[str, str | os.PathLike] | str | os.PathLike) -> dict[str, SourceData]:
    """{source: SourceData} from dataset indexes, DataKit cache folders or single splits (a
    single path is named "train"); a missing or unfinished cache fails here, before compute."""
    if not isinstance(cache_dirs, Mapping):
        cache_dirs = {"train": cache_dirs}
    return {name: open_source(path) for name, path in cache_dirs.items()}


def data_identity(sources: Mapping[str, SourceData]) -> dict[str, str]:
    """{source: sha256 of the tokenizer its tokens came from}, for the sources that say."""
    return {name: s.tokenizer_sha256 for name, s in sorted(sources.items()) if s.tokenizer_sha256}


def resolve_checkpoint(path: str | Path) -> Path | str:
    """A checkpoint folder, or an out dir / checkpoints dir whose newest valid one is meant
    (a local path or an fsspec URL)."""
    fs, where = filesystem(str(path))
    if fs.exists(join(where, ckpt.MARKER)) or fs.exists(join(where, "meta.json")):
        return path
    for root in (child(path, "checkpoints"), path):
        found = ckpt.latest_valid(root)
        if found is not None:
            return found
    raise FileNotFoundError(f"no valid checkpoint in {path}")


@dataclasses.dataclass
class _Run:
    """Where this call of ``train`` stands: the state and the bookkeeping checkpoints save."""

    config: TrainConfig
    state: TrainState
    mesh: Any
    state_sh: Any  # a NamedSharding per state leaf
    ckpt_root: Path | str  # a local dir or an fsspec URL
    position: DataPosition = DataPosition()
    phase_start: int = 0  # global step this phase started at
    tokens_before: int = 0  # tokens trained on before this phase
    telemetry_run: str | None = None  # checkpoints name it, so evaluation can log next to training
    data_tokenizers: Mapping[str, str] = dataclasses.field(default_factory=dict)  # source -> tokenizer sha256
    allow_tokenizer_change: bool = False

    def tokens_at(self, step: int) -> int:
        return self.tokens_before + (step - self.phase_start) * self.config.tokens_per_step

    def meta(self, step: int) -> dict:
        return {"data_position": self.position.to_json(), "phase_start_step": self.phase_start,
                "phase": self.config.phase, "tokens_before_phase": self.tokens_before,
                "tokens": self.tokens_at(step), "optimizer": self.config.optimizer.name,
                "config": config_to_dict(self.config), "telemetry_run": self.telemetry_run,
                "data_tokenizers": dict(self.data_tokenizers)}

    def check_tokenizers(self, meta: Mapping[str, Any], where: str) -> None:
        """Continue only on tokens of the checkpoint's tokenizers (see ``check_same_tokenizer``)."""
        before = meta.get("data_tokenizers") or {}
        changed = sorted(k for k in set(before) & set(self.data_tokenizers) if before[k] != self.data_tokenizers[k])
        if not changed or self.allow_tokenizer_change:
            return
        name = changed[0]
        raise ValueError(f"{where} was trained on {name!r} tokenized by tokenizer {before[name][:12]}, but the data given "
                         f"now was tokenized by {self.data_tokenizers[name][:12]}: the ids mean other text. Use data "
                         f"tokenized by the checkpoint's tokenizer, or allow the change (marin train "
                         f"--allow-tokenizer-change) to continue anyway")


def _resume(run: _Run, folder: Path, logger: MetricsLogger) -> None:
    arrays, meta = ckpt.load(folder)
    run.check_tokenizers(meta, f"checkpoint {folder}")
    host = meshlib.host_state(run.state)  # every process loads the same arrays
    host = TrainState.from_dict(ckpt.restore_like(host.to_dict(), arrays, where=str(folder)))
    run.state = meshlib.place_state(host, run.state_sh)
    run.position = DataPosition.from_json(meta["data_position"])
    run.phase_start, run.tokens_before = int(meta["phase_start_step"]), int(meta["tokens_before_phase"])
    if meshlib.is_writer():
        logger.truncate_after(int(meta["step"]))
    log.info("resumed from %s at step %d", folder, meta["step"])


def _warm_start(run: _Run, source: Path) -> None:
    """Params, router bias, RNG, global step and data position from ``source``; the optimizer
    state too when the optimizer is the same; the schedule restarts at this phase's step 0."""
    arrays, meta = ckpt.load(source)
    run.check_tokenizers(meta, f"warm start {source}")
    state, where = meshlib.host_state(run.state), str(source)
    state = state.replace(params=ckpt.restore_like(state.params, arrays, "['params']", where),
                          router_bias=ckpt.restore_like(state.router_bias, arrays, "['router_bias']", where),
                          rng=ckpt.restore_like(state.rng, arrays, "['rng']", where),
                          step=np.int32(int(meta["step"])))
    if meta.get("optimizer") == run.config.optimizer.name:
        try:
            state = state.replace(opt_state=ckpt.restore_like(state.opt_state, arrays, "['opt_state']", where))
        except ValueError as e:
            log.warning("warm start: optimizer state not reusable (%s); starting it fresh", e)
    run.state = meshlib.place_state(state, run.state_sh)
    run.position = DataPosition.from_json(meta["data_position"])
    run.phase_start, run.tokens_before = int(meta["step"]), int(meta["tokens"])
    log.info("warm start from %s at step %d (data position kept: %s)", source, run.phase_start,
             run.position.to_json())


def _start(run: _Run, ckpt_root: Path | str, logger: MetricsLogger, resume: bool,
           warm_start: str | Path | None) -> None:
    """Resume from the newest valid checkpoint, else warm start, else begin fresh."""
    latest = ckpt.latest_valid(ckpt_root) if resume else None
    if latest is not None:
        _resume(run, latest, logger)
        return
    if meshlib.is_writer():
        logger.truncate_after(-1)  # a fresh start owns the file
    if warm_start is not None:
        _warm_start(run, resolve_checkpoint(warm_start))


class _Emitter:
    """Writes each step's metrics row one step late, so the host never waits on the device."""

    def __init__(self, run: _Run, logger: MetricsLogger, log_fn: Callable[[dict], None] | None,
                 telemetry: TelemetryWriter):
        self.run, self.logger, self.log_fn, self.telemetry = run, logger, log_fn, telemetry
        self.pending: tuple[int, dict] | None = None
        self.last_row: dict | None = None

    def push(self, step: int, metrics: dict) -> None:
        self.flush()
        self.pending = (step, metrics)

    def flush(self) -> None:
        if self.pending is None:
            return
        step, metrics = self.pending
        self.pending = None
        row = _host_metrics(step, metrics, self.run.config, self.run.tokens_at(step))
        first = self.last_row is None
        self.last_row = row
        if not meshlib.is_writer():  # metrics are replicated: process 0 speaks for all
            return
        self.logger.write(row)
        self.telemetry.log(step, telemetry_fields(row), phase=row["phase"])
        if first:
            self.telemetry.flush()  # the first step at once: the phase controller sees the phase is live
        if self.log_fn is not None:
            self.log_fn(row)

    def sync(self) -> None:
        """Everything so far on disk and in the store (before a checkpoint names the step)."""
        self.flush()
        self.logger.flush()
        self.telemetry.flush()

    def close(self) -> None:
        try:
            self.logger.close()
        finally:
            self.telemetry.close()


def _host_metrics(step: int, m: dict, config: TrainConfig, tokens: int) -> dict:
    m = jax.device_get(m)
    row = {"step": step, "loss": float(m["loss"]), "lr": float(m["lr"]), "grad_norm": float(m["grad_norm"]),
           "update_norm": float(m["update_norm"]), "skipped": bool(m["skipped"]), "tokens": tokens,
           "phase": config.phase}
    row["counts"] = {k: int(v) for k, v in m["counts"].items()}
    row["dropped"] = int(m["dropped"])
    return row


def _run_steps(run: _Run, step_fn, loader: MixedLoader, ckpt_root: Path | str, emitter: _Emitter,
               stop_at_step: int | None, stop: _StopSignals | None = None) -> None:
    """Steps from the state's step to the phase end, checkpointing on the step/time cadence."""
    config = run.config
    end_step = run.phase_start + config.num_steps
    start = int(run.state.step)
    if start >= end_step:
        return
    lrs = phase_lrs(config, run.phase_start, start, end_step)
    last_save = time.monotonic()
    batches = loader.iterate(run.position, prefetch=config.prefetch,
                             rows=meshlib.process_rows(run.mesh, config.batch_size))
    for step in range(start + 1, end_step + 1):
        local, ok, next_position = next(batches)  # this process's rows of the global batch
        tokens = meshlib.shard_batch(run.mesh, local, config.batch_size)
        ok = meshlib.all_processes(ok)  # one corrupt row anywhere skips the step everywhere
        run.state, metrics = step_fn(run.state, tokens, np.bool_(ok), lrs[step - start - 1])
        run.position = next_position
        emitter.push(step, metrics)  # writes the previous step's row while this one computes
        if stop_at_step is not None and step >= stop_at_step:
            raise _Stop()
        # process 0 decides for all (a save is a collective: every process gathers the state):
        # its signal and its clock
        stopping = meshlib.agree(stop is not None and stop.received is not None)
        permanent = step % config.checkpoint_every_steps == 0 or step == end_step or stopping
        if permanent or meshlib.agree(time.monotonic() - last_save >= config.checkpoint_every_seconds):
            emitter.sync()
            _save(run, ckpt_root, step, "permanent" if permanent else "temporary")
            last_save = time.monotonic()
        if stopping:
            log.warning("stopped at step %d by %s (checkpointed)", step, stop.received)
            break
    emitter.flush()


def phase_lrs(config: TrainConfig, phase_start: int, start: int, end_step: int) -> np.ndarray:
    """float32 LR of every global step in (start, end_step]: the schedule at the step's
    phase-relative index (the state's step before the update, as the step would read it)."""
    steps = np.arange(start, end_step, dtype=np.int64) - phase_start
    return np.asarray(learning_rate(steps, config.schedule), np.float32)


def _save(run: _Run, ckpt_root: Path | str, step: int, kind: str) -> None:
    """Every process gathers the state (a collective); process 0 writes it; all wait for the commit."""
    host = meshlib.host_state(run.state.to_dict())
    if meshlib.is_writer():
        ckpt.save(ckpt_root, step, host, run.meta(step), kind)
    meshlib.barrier(f"ckpt-{step}")


def validation_loss(config: TrainConfig, model: Model, state: TrainState,
                    caches: Mapping[str, Any], mesh=None) -> float | None:
    """Mean next-token cross-entropy (nats) over the held-out batches (``data.held_out_batches``,
    each weighted by its rows); None when the validation splits hold less than one window."""
    batches = held_out_batches(caches, config.seq_len, config.batch_size)
    if not batches:
        log.warning("no held-out loss: the validation split(s) %s hold less than one window of seq_len=%d",
                    sorted(getattr(c, "path", str(c)) for c in caches.values()), config.seq_len)
        return None
    def cross_entropy(p, bias, tokens):  # the held-out number is CE alone, without the z-loss terms
        loss, aux = model.loss_fn(p, tokens, config.model, bias)
        return aux["ce_loss"] if isinstance(aux, dict) and "ce_loss" in aux else loss

    # No EP layer here: a short held-out batch need not divide into the batch shards, so the
    # tokens are replicated and XLA partitions the local expert computation itself.
    mesh = mesh or meshlib.make_mesh(config.model)
    loss = jax.jit(cross_entropy)
    losses = [float(loss(state.params, state.router_bias, meshlib.place_state(b, meshlib.replicated(mesh))))
              for b in batches]
    return float(np.average(losses, weights=[len(b) for b in batches]))


def _phase_skips(rows: list[dict], run: _Run) -> tuple[int, int]:
    """(skipped, steps) of this phase, from the metrics file (it survives resumes)."""
    mine = [r for r in rows if r.get("phase") == run.config.phase and int(r["step"]) > run.phase_start]
    return sum(bool(r.get("skipped")) for r in mine), len(mine)


def train(config: TrainConfig, cache_dirs: Mapping[str, str | Path] | str | Path, out_dir: str | Path,
          resume: bool = True, warm_start: str | Path | None = None, log_fn: Callable[[dict], None] | None = None,
          model: Model | None = None, stop_at_step: int | None = None, model_fns=None,
          mesh=None, checkpoint_dir: str | Path | None = None,
          telemetry_root: str | None = None, telemetry_run: str | None = None,
          allow_tokenizer_change: bool = False) -> TrainResult:
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
      this phase's step 0; the optimizer state is kept if the optimizer is unchanged.
    log_fn: called with each step's metrics row (e.g. to forward to Dagster).
    model: the model functions (``state.Model``); default the MoE. ``model_fns``, the old
      4-tuple (init_params, loss_fn, init_router_bias, next_router_bias), is still accepted.
    stop_at_step: abandon the loop (no final checkpoint) after this global step, as a kill would.
    mesh: the ``("data", "expert")`` device mesh (``mesh.make_mesh``); default every global
      device. With several processes every one calls ``train`` with the same arguments.
    checkpoint_dir: where checkpoints go and resume reads from (default ``out_dir/checkpoints``);
      any fsspec URL, e.g. ``gs://bucket/run/checkpoints``.
    telemetry_root / telemetry_run: every step's metrics are appended to this telemetry store
      (default ``$MARIN_PREFIX/telemetry``) under this run name (default
      ``default_telemetry_run``), flushed every few seconds and at each checkpoint.
    SIGTERM/SIGINT during the steps checkpoint the current step and end the phase early:
      the result says ``stopped_by`` (a warm start from it begins at that step + 1).
    allow_tokenizer_change: resume or warm start even when a source's tokenizer differs from
      the one the checkpoint trained on (refused by default: the ids would mean other text).
    Raises ValueError/FileNotFoundError before compute for a config or cache that cannot
    work (an unfinished cache included), and TooManySkippedSteps after a phase that skipped
    most of its steps.
    """
    ensure_compile_cache()
    model = model or (Model(*model_fns) if model_fns is not None else moe_model())
    mesh = mesh or meshlib.make_mesh(config.model)
    out_dir = os.fspath(out_dir)  # the work dir: a local dir or any fsspec URL (gs://...)
    # Everything that can be wrong with the config or data fails here, before compute.
    meshlib.check_fits(mesh, config.model, config.batch_size, config.seq_len)
    fs, root = filesystem(out_dir)
    fs.makedirs(root, exist_ok=True)
    sources = open_sources(cache_dirs)
    check_vocab(config, sources)
    validation_dirs = {name: s.validation for name, s in sources.items() if s.validation is not None}
    loader = MixedLoader({name: s.train for name, s in sources.items()}, config.seq_len, config.batch_size, config.mixture, config.data_seed,
                         vocab_size=config.model.vocab_size)

    ckpt_root = child(out_dir, "checkpoints") if checkpoint_dir is None else checkpoint_dir
    telemetry_run = telemetry_run or default_telemetry_run(out_dir, config.phase)
    opt = make_optimizer(config.optimizer,
                         jax.eval_shape(lambda: model.init_params(config.model, jax.random.PRNGKey(0))))

    def init() -> TrainState:  # traced: the state is created in its mesh layout
        return init_state(config, opt, model)

    state_sh = meshlib.state_shardings(mesh, jax.eval_shape(init))
    run = _Run(config, meshlib.init_sharded(init, mesh), mesh, state_sh, ckpt_root, telemetry_run=telemetry_run,
               data_tokenizers=data_identity(sources), allow_tokenizer_change=allow_tokenizer_change)
    telemetry = TelemetryWriter(telemetry_root or default_telemetry_root(), telemetry_run,
                                flush_seconds=TELEMETRY_FLUSH_SECONDS)  # a bad run name fails here, before compute
    logger = MetricsLogger(out_dir, use_wandb=config.wandb and meshlib.is_writer(),
                           run_name=f"{_dir_name(out_dir)}-{config.phase}", config=config_to_dict(config))
    _start(run, ckpt_root, logger, resume, warm_start)
    start = int(run.state.step)
    emitter = _Emitter(run, logger, log_fn, telemetry)
    # The handlers stay on through _finish: a stop request racing the last step (the phase
    # controller read slightly stale telemetry) must not kill a phase that has just completed.
    with _StopSignals() as stop:
        try:
            _run_steps(run, make_train_step(config, opt, model, mesh, state_sh), loader, ckpt_root, emitter,
                       stop_at_step, stop)
        except _Stop:
            pass
        finally:
            emitter.close()  # also on an exception: the steps logged so far reach the store
        ended_early = int(run.state.step) < run.phase_start + config.num_steps
        stopped_by = stop.received if ended_early else None
        result = _finish(run, model, loader, validation_dirs, out_dir, emitter, start,
                         stopped=stop_at_step is not None, stopped_by=stopped_by)
        if stop.received is not None and stopped_by is None:
            log.warning("%s arrived after the last step (%d): the phase is complete, nothing to stop",
                        stop.received, result.final_step)
    return result


def _finish(run: _Run, model: Model, loader: MixedLoader, validation_dirs: Mapping[str, Any], out_dir: str,
            emitter: _Emitter, start: int, stopped: bool, stopped_by: str | None = None) -> TrainResult:
    """Loss curve (from the telemetry store), held-out loss, train_result.json; raise if the
    phase mostly skipped. A phase ended by a signal is a clean, checkpointed early end.
    Process 0 writes; the others read its metrics file after the barrier."""
    meshlib.barrier("train-finish")  # process 0's metrics file is complete before anyone reads it
    writer = meshlib.is_writer()
    rows = read_metrics(emitter.logger.path)
    counts = rows[-1].get("counts", {}) if rows else {k: 0 for k in COUNTERS}
    final_step = int(jax.device_get(run.state.step)) if not stopped else (int(rows[-1]["step"]) if rows else start)
    # This phase's steps (a run name may hold earlier phases, or a longer rolled-back attempt).
    curve = telemetry_rows(emitter.telemetry.store.query(run=emitter.telemetry.run, latest=True,
                                                         steps=(run.phase_start + 1, max(final_step, run.phase_start + 1)))
                           ) if writer else []
    png = plot_loss_curve(curve, child(out_dir, "loss_curve.png"), title=_dir_name(out_dir)) if curve else None
    held_out = None if stopped or not validation_dirs else validation_loss(run.config, model, run.state,
                                                                             validation_dirs, run.mesh)
    last_loss = emitter.last_row["loss"] if emitter.last_row else None
    if writer:
        fs, root = filesystem(out_dir)
        write_json_atomic(fs, join(root, "train_result.json"),
                          {"final_step": final_step, "counts": counts, "data_position": run.position.to_json(),
                           "validation_loss": held_out, "stopped_by": stopped_by,
                           "telemetry_run": emitter.telemetry.run})
    result = TrainResult(final_step=final_step, tokens=run.tokens_at(final_step), metrics_path=emitter.logger.path,
                         checkpoint_dir=ckpt.latest_valid(run.ckpt_root), loss_curve_png=png,
                         counts=counts, data_position=run.position.to_json(),
                         tokens_left=loader.tokens_left(run.position), phase_start_step=run.phase_start,
                         last_loss=last_loss, validation_loss=held_out, stopped_by=stopped_by,
                         telemetry_run=emitter.telemetry.run)
    skipped, steps = _phase_skips(rows, run)
    limit = run.config.guards.max_skipped_fraction
    if not stopped and steps and skipped > limit * steps:
        raise TooManySkippedSteps(result, run.config.phase, skipped, steps, limit)
    return result
