"""The training loop: state, the jitted step, checkpoint cadence, resume and warm start.

    result = train(config, {"web": cache_dir}, out_dir, resume=True)

State is one pytree (params, optimizer state, guard windows, router bias, step, RNG) so a
checkpoint is a single flatten and a resume a single unflatten. The step is
``jax.jit``-compiled once; the phase-relative LR, the guards and the skip decision all
happen inside it. The host loop only feeds batches (read ahead on a thread), writes the
previous step's metrics while the current step runs, and checkpoints on its cadence.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time
from pathlib import Path
from typing import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from marin_assets.train import checkpoint as ckpt
from marin_assets.train.config import TrainConfig, config_to_dict
from marin_assets.train.data import DataPosition, MixedLoader
from marin_assets.train.guards import (COUNTERS, clip_grads, clip_updates, global_norm, init_guard_state, record,
                                       should_skip)
from marin_assets.train.metrics import MetricsLogger, plot_loss_curve, read_metrics
from marin_assets.train.optimizers import Optimizer, make_optimizer
from marin_assets.train.schedules import learning_rate

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TrainResult:
    final_step: int
    tokens: int  # tokens trained on across all phases so far (global step * tokens/step of each)
    metrics_path: Path
    checkpoint_dir: Path | None  # the newest valid checkpoint after this call
    loss_curve_png: Path | None
    counts: dict  # guard events: skipped_nonfinite, skipped_spike, skipped_bad_batch, update_clipped, grad_clipped
    data_position: dict
    tokens_left: dict  # per source, tokens not yet seen in the first epoch
    phase_start_step: int
    last_loss: float | None


class _Stop(Exception):
    """Raised by ``stop_at_step`` to abandon the loop like a killed process would."""


def default_model():
    from marin_assets import model

    return model.init_params, model.loss_fn, model.init_router_bias, model.next_router_bias


def init_state(config: TrainConfig, opt: Optimizer, init_params, init_router_bias) -> dict:
    key = jax.random.PRNGKey(config.seed)
    key, init_key = jax.random.split(key)
    params = init_params(config.model, init_key)
    return {"params": params, "opt_state": opt.init(params), "guard": init_guard_state(config.guards),
            "router_bias": init_router_bias(config.model), "step": jnp.int32(0), "rng": key}


def make_train_step(config: TrainConfig, opt: Optimizer, loss_fn: Callable, next_router_bias: Callable):
    """step(state, tokens[B,S] int32, batch_ok bool, phase_start int32) -> (state, metrics)."""
    model_cfg, guard_cfg, sched_cfg = config.model, config.guards, config.schedule

    def step(state, tokens, batch_ok, phase_start):
        params = state["params"]
        lr = learning_rate(state["step"] - phase_start, sched_cfg)
        (loss, aux), grads = jax.value_and_grad(
            lambda p: loss_fn(p, tokens, model_cfg, state["router_bias"]), has_aux=True)(params)
        grad_norm = global_norm(grads)
        decision = should_skip(guard_cfg, state["guard"], loss, grad_norm, batch_ok)
        skip = decision["skip"]
        grads, grad_clipped = clip_grads(guard_cfg, grads, grad_norm, skip)
        updates, new_opt = opt.update(grads, state["opt_state"], params, lr)
        updates, update_norm, update_clipped = clip_updates(guard_cfg, state["guard"], updates)
        # Skip-step: zero update AND the optimizer state stays as it was.
        new_params = jax.tree.map(lambda p, u: jnp.where(skip, p, p + u.astype(p.dtype)), params, updates)
        new_opt = jax.tree.map(lambda old, new: jnp.where(skip, old, new), state["opt_state"], new_opt)
        new_bias = jnp.where(skip, state["router_bias"],
                             next_router_bias(state["router_bias"], aux, model_cfg))
        guard = record(guard_cfg, state["guard"], decision, loss, grad_norm, update_norm,
                       grad_clipped, update_clipped)
        rng, _ = jax.random.split(state["rng"])
        new_state = {"params": new_params, "opt_state": new_opt, "guard": guard, "router_bias": new_bias,
                     "step": state["step"] + 1, "rng": rng}
        metrics = {"loss": loss, "lr": lr, "grad_norm": grad_norm, "update_norm": update_norm,
                   "skipped": skip, "counts": guard["counts"]}
        return new_state, metrics

    return jax.jit(step, donate_argnums=(0,))


def check_fits(config: TrainConfig) -> None:
    """Errors a run would otherwise hit mid-compute."""
    n = jax.device_count()
    if config.batch_size % n:
        raise ValueError(f"batch_size {config.batch_size} is not divisible by the {n} available devices")


def _resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder, or an out dir / checkpoints dir whose newest valid one is meant."""
    path = Path(path)
    if (path / ckpt.MARKER).exists() or (path / "meta.json").exists():
        return path
    for root in (path / "checkpoints", path):
        found = ckpt.latest_valid(root)
        if found is not None:
            return found
    raise FileNotFoundError(f"no valid checkpoint in {path}")


def _host_metrics(step: int, m: dict, config: TrainConfig, tokens: int) -> dict:
    m = jax.device_get(m)
    row = {"step": step, "loss": float(m["loss"]), "lr": float(m["lr"]), "grad_norm": float(m["grad_norm"]),
           "update_norm": float(m["update_norm"]), "skipped": bool(m["skipped"]), "tokens": tokens,
           "phase": config.phase}
    row["counts"] = {k: int(v) for k, v in m["counts"].items()}
    return row


def train(config: TrainConfig, cache_dirs: Mapping[str, str | Path] | str | Path, out_dir: str | Path,
          resume: bool = True, warm_start: str | Path | None = None, log_fn: Callable[[dict], None] | None = None,
          model_fns=None, stop_at_step: int | None = None) -> TrainResult:
    """Train one phase of ``config.num_steps`` steps; returns where it ended.

    cache_dirs: {source name: Levanter cache dir} (a single path is named "train").
    resume: continue from the newest valid checkpoint in ``out_dir`` if there is one.
    warm_start: a checkpoint (or another phase's out dir) to start this phase from: its
      params, router bias, global step and data position are kept; the schedule restarts at
      this phase's step 0; the optimizer state is kept if the optimizer is unchanged.
    log_fn: called with each step's metrics row (e.g. to forward to Dagster).
    model_fns: (init_params, loss_fn, init_router_bias, next_router_bias); default the MoE model.
    stop_at_step: abandon the loop (no final checkpoint) after this global step, as a kill would.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not isinstance(cache_dirs, Mapping):
        cache_dirs = {"train": cache_dirs}
    init_params, loss_fn, init_router_bias, next_router_bias = model_fns or default_model()

    # Everything that can be wrong with the config or data fails here, before compute.
    check_fits(config)
    loader = MixedLoader(cache_dirs, config.seq_len, config.batch_size, config.mixture, config.data_seed,
                         vocab_size=config.model.vocab_size)

    ckpt_root = out_dir / "checkpoints"
    params_template = jax.eval_shape(lambda: init_params(config.model, jax.random.PRNGKey(0)))
    opt = make_optimizer(config.optimizer, params_template)
    state = init_state(config, opt, init_params, init_router_bias)
    position, phase_start, tokens_before = DataPosition(), 0, 0
    logger = MetricsLogger(out_dir, use_wandb=config.wandb, run_name=f"{out_dir.name}-{config.phase}",
                           config=config_to_dict(config))

    latest = ckpt.latest_valid(ckpt_root) if resume else None
    if latest is not None:
        arrays, meta = ckpt.load(latest)
        state = ckpt.restore_like(state, arrays, where=str(latest))
        position = DataPosition.from_json(meta["data_position"])
        phase_start, tokens_before = int(meta["phase_start_step"]), int(meta["tokens_before_phase"])
        logger.truncate_after(int(meta["step"]))
        log.info("resumed from %s at step %d", latest, meta["step"])
    else:
        if (out_dir / "metrics.jsonl").exists():
            logger.truncate_after(-1)  # a fresh start owns the file
        if warm_start is not None:
            source = _resolve_checkpoint(warm_start)
            arrays, meta = ckpt.load(source)
            state["params"] = ckpt.restore_like(state["params"], arrays, "['params']", str(source))
            state["router_bias"] = ckpt.restore_like(state["router_bias"], arrays, "['router_bias']", str(source))
            state["rng"] = ckpt.restore_like(state["rng"], arrays, "['rng']", str(source))
            state["step"] = jnp.int32(int(meta["step"]))
            if meta.get("optimizer") == config_to_dict(config)["optimizer"]["name"]:
                try:
                    state["opt_state"] = ckpt.restore_like(state["opt_state"], arrays, "['opt_state']", str(source))
                except ValueError as e:
                    log.warning("warm start: optimizer state not reusable (%s); starting it fresh", e)
            position = DataPosition.from_json(meta["data_position"])
            phase_start = int(meta["step"])
            tokens_before = int(meta["tokens"])
            log.info("warm start from %s at step %d (data position kept: %s)", source, phase_start,
                     position.to_json())

    step_fn = make_train_step(config, opt, loss_fn, next_router_bias)
    # Fresh, distinct buffers: the step donates its input state, and init may share arrays.
    state = jax.tree.map(lambda x: jnp.array(x, copy=True), state)
    end_step = phase_start + config.num_steps
    start = int(state["step"])
    counts = {k: 0 for k in COUNTERS}

    def tokens_at(step: int) -> int:
        return tokens_before + (step - phase_start) * config.tokens_per_step

    def save(step: int, kind: str) -> Path:
        meta = {"data_position": position.to_json(), "phase_start_step": phase_start, "phase": config.phase,
                "tokens_before_phase": tokens_before, "tokens": tokens_at(step),
                "optimizer": config.optimizer.name, "config": config_to_dict(config)}
        logger.flush()
        return ckpt.save(ckpt_root, step, state, meta, kind)

    last_save_time = time.monotonic()
    pending = None
    last_row = None
    phase_start_arr = jnp.int32(phase_start)

    def emit(pending_item):
        nonlocal last_row, counts
        step_no, metrics = pending_item
        row = _host_metrics(step_no, metrics, config, tokens_at(step_no))
        counts = row["counts"]
        logger.write(row)
        last_row = row
        if log_fn is not None:
            log_fn(row)

    try:
        if start < end_step:
            batches = loader.iterate(position, prefetch=config.prefetch)
            for step in range(start + 1, end_step + 1):
                tokens, ok, next_position = next(batches)
                state, metrics = step_fn(state, tokens, np.bool_(ok), phase_start_arr)
                position = next_position
                if pending is not None:
                    emit(pending)  # the previous step's numbers, while this one computes
                pending = (step, metrics)
                if stop_at_step is not None and step >= stop_at_step:
                    raise _Stop()
                permanent = step % config.checkpoint_every_steps == 0 or step == end_step
                temporary = time.monotonic() - last_save_time >= config.checkpoint_every_seconds
                if permanent or temporary:
                    emit(pending)
                    pending = None
                    save(step, "permanent" if permanent else "temporary")
                    last_save_time = time.monotonic()
            if pending is not None:
                emit(pending)
                pending = None
    except _Stop:
        pass
    finally:
        logger.close()

    rows = read_metrics(logger.path)
    png = plot_loss_curve(rows, out_dir / "loss_curve.png", title=f"{out_dir.name}") if rows else None
    if rows:
        counts = rows[-1].get("counts", counts)
    final_step = int(jax.device_get(state["step"])) if stop_at_step is None else (
        int(rows[-1]["step"]) if rows else start)
    latest = ckpt.latest_valid(ckpt_root)
    (out_dir / "train_result.json").write_text(json.dumps(
        {"final_step": final_step, "counts": counts, "data_position": position.to_json()}, indent=1))
    return TrainResult(final_step=final_step, tokens=tokens_at(final_step), metrics_path=logger.path,
                       checkpoint_dir=latest, loss_curve_png=png, counts=counts,
                       data_position=position.to_json(), tokens_left=loader.tokens_left(position),
                       phase_start_step=phase_start,
                       last_loss=last_row["loss"] if last_row else None)
