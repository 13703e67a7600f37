"""Necromancy: rebuild a checkpoint's optimizer state from gradients at its frozen parameters.

A loss spike whose cause sits in the optimizer state (a second moment that shrank over a quiet
stretch, so the next large gradient takes a huge step; moments damaged by a bad batch) can be
recovered without losing the parameters: throw the moments away, take N gradients on the run's
next batches with the parameters frozen, and let the optimizer fold them in exactly as its own
update would (``optimizers.Optimizer.update`` at learning rate 0, so the betas, the param groups
and the bias-correction count are the optimizer's own). The rebuilt checkpoint keeps the step,
the parameters, the router bias, the guard windows and the data position of the one it came
from, so ``marin train --resume`` on its out dir continues the same run, on the same batches.

Count convention: the rebuilt moments are an exponential average started from zero ``n``
gradients ago, and the optimizer's count is set to ``n``, so its bias correction (``1 -
beta**count``) undoes exactly that start. The gradients are the ones the train step would feed
the optimizer: clipped to ``guards.grad_clip``; a batch the step would skip (flagged corrupt by
the loader, or a non-finite loss or gradient norm) is left out and counted.

    rebuilt = necromancy(checkpoint_dir, {"web": cache_dir}, n_steps=32, out="run-rebuilt")
    # marin train --cache web=... --config same.yaml --out run-rebuilt --resume
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from marin_assets.numeric_checks import check_int
from marin_assets.store.fsutil import child, filesystem, join
from marin_assets.train.checkpoints import checkpoint as ckpt
from marin_assets.train.config import TrainConfig, config_from_dict
from marin_assets.train.data.batches import DataPosition, MaskedRows, MixedLoader, segment_keywords, segments_of, tokens_and_mask
from marin_assets.train.data.sources import check_vocab, data_identity, open_sources, train_loader
from marin_assets.train.distributed import hosts as distributed
from marin_assets.train.distributed import mesh as meshlib
from marin_assets.train.guards import clip_grads, global_norm
from marin_assets.train.optimizers import Optimizer
from marin_assets.train.restore import Run, optimizer_for, resolve_checkpoint
from marin_assets.train.state import Model, TrainState, init_state, moe_model
from marin_assets.train.step import compute_options, mesh_options

META_KEY = "necromancy"  # the record the rebuilt checkpoint's meta.json carries


@dataclasses.dataclass(frozen=True)
class Rebuilt:
    """What ``necromancy`` wrote: the new checkpoint and the gradients its moments came from."""

    checkpoint: Path | str
    step: int  # the global step of the source checkpoint (and of the rebuilt one)
    gradients: int  # gradients folded into the moments (the optimizer's count)
    skipped: int  # batches the train step would have skipped, left out
    steps: tuple[int, int]  # the global steps whose batches were read: [first, last]
    mean_loss: float  # mean loss over the batches used, at the frozen parameters


def rebuild_opt_state(opt: Optimizer, params: Any, gradients: Iterable[Any]) -> tuple[Any, int]:
    """(the optimizer state after ``gradients``, how many) from a fresh ``opt.init(params)``, the
    parameters frozen: each gradient goes through ``opt.update`` at learning rate 0 and only the
    state is kept. ValueError when ``gradients`` is empty (there would be nothing to rebuild from)."""
    take = jax.jit(lambda grads, state, p: opt.update(grads, state, p, jnp.float32(0.0))[1], donate_argnums=(1,))
    state, count = opt.init(params), 0
    for grads in gradients:
        state = take(grads, state, params)
        count += 1
    if count == 0:
        raise ValueError("necromancy: no usable gradient to rebuild the optimizer state from")
    return state, count


class BatchGradients:
    """The gradients the train step would hand the optimizer, one per batch, at frozen parameters.

    Iterating yields the clipped gradient of each usable batch; afterwards ``losses`` holds the
    loss of every batch used and ``skipped`` the number left out (corrupt batch, non-finite loss or
    gradient norm: what the step skips whatever its guard windows say)."""

    def __init__(
        self,
        config: TrainConfig,
        model: Model,
        mesh,
        params: Any,
        router_bias: jax.Array,
        batches: Iterable[tuple[jax.Array | MaskedRows, bool]],
    ) -> None:
        self.params, self.router_bias, self.batches = params, router_bias, batches
        self.losses: list[float] = []
        self.skipped = 0
        self._grad = jax.jit(self._make_grad(config, model, mesh))

    @staticmethod
    def _make_grad(config: TrainConfig, model: Model, mesh):
        model_cfg, guards = config.model, config.guards
        ep, options = meshlib.expert_parallel(mesh, model_cfg), compute_options(config) | mesh_options(mesh)

        def grad(params, router_bias, batch, batch_ok):
            tokens, loss_mask = tokens_and_mask(batch)
            masking = segment_keywords(segments_of(batch))  # as the train step passes them
            (loss, _), grads = jax.value_and_grad(
                lambda p: model.loss_fn(p, tokens, model_cfg, router_bias, loss_mask, ep, **options, **masking), has_aux=True
            )(params)
            grad_norm = global_norm(grads)
            usable = batch_ok & jnp.isfinite(loss) & jnp.isfinite(grad_norm)
            grads, _ = clip_grads(guards, grads, grad_norm, ~usable)  # the step's own clipping
            return grads, loss, usable

        return grad

    def __iter__(self) -> Iterator[Any]:
        for tokens, ok in self.batches:
            grads, loss, usable = self._grad(self.params, self.router_bias, tokens, jnp.bool_(ok))
            if not bool(usable):
                self.skipped += 1
                continue
            self.losses.append(float(loss))
            yield grads


def load_state(arrays: Mapping[str, np.ndarray], where: str, config: TrainConfig, model: Model, opt: Optimizer) -> TrainState:
    """The whole train state in a checkpoint's ``arrays`` (``checkpoint.load``) as host arrays, laid out as
    ``config`` makes it (ValueError naming the leaf and ``where`` when the checkpoint's tree differs)."""
    template = jax.eval_shape(lambda: init_state(config, opt, model))
    return TrainState.from_dict(ckpt.restore_like(template.to_dict(), dict(arrays), where=where))


def _next_batches(loader: MixedLoader, mesh, position: DataPosition, n: int, batch_size: int):
    """The ``n`` global batches from ``position`` on, as the loop shards them (each process its rows)."""
    rows = meshlib.process_rows(mesh, batch_size)
    for _ in range(n):
        local, ok, position = loader.next_batch(position, rows)
        yield meshlib.shard_batch(mesh, local, batch_size), distributed.all_processes(ok)


def check_new_out(out: str, tool: str) -> None:
    """``out`` must hold no checkpoint yet: a save onto a step that is already stored keeps the old one."""
    fs, root = filesystem(out)
    folder = join(root, "checkpoints")
    if fs.isdir(folder) and fs.ls(folder, detail=False):
        raise ValueError(f"{out} already has checkpoints: give {tool} an out dir of its own")


def necromancy(
    checkpoint: str | os.PathLike,
    caches: Mapping[str, str | os.PathLike] | str | os.PathLike,
    n_steps: int,
    out: str | os.PathLike,
    model: Model | None = None,
    mesh=None,
    allow_tokenizer_change: bool = False,
) -> Rebuilt:
    """Rebuild the optimizer state of ``checkpoint`` (a checkpoint folder or an out dir: its newest
    valid one) from ``n_steps`` gradients on the run's next batches of ``caches`` (what ``train``
    takes), parameters frozen, and write it as ``out/checkpoints/step-<same step>``.

    The run's config comes from the checkpoint's meta.json; the rebuilt meta is the source's plus a
    ``necromancy`` record (source, gradients, skipped batches, the global steps whose batches were
    read). ValueError / FileNotFoundError, one line, for a bad count, checkpoint, cache or out dir."""
    check_int("necromancy: the number of gradient steps", n_steps, lo=1)
    out = os.fspath(out)
    check_new_out(out, "necromancy")
    model = model or moe_model()
    folder, meta, config, opt, host = open_checkpoint(checkpoint, model)
    mesh = mesh or meshlib.train_mesh(config)
    meshlib.check_fits(mesh, config.model, config.batch_size, config.seq_len, sequence=config.sequence_parallel)
    sources = open_sources(caches)
    check_vocab(config, sources)
    run = _run_of(config, host, mesh, out, meta, data_identity(sources), allow_tokenizer_change)
    run.check_tokenizers(meta, f"checkpoint {folder}")
    # Only what the gradients read goes to the devices: the old optimizer state is thrown away.
    params = meshlib.place_state(host.params, meshlib.state_shardings(mesh, host.params, fsdp=config.fsdp))
    router_bias = meshlib.place_state(host.router_bias, meshlib.replicated(mesh))
    batches = _next_batches(train_loader(config, sources), mesh, run.position, n_steps, config.batch_size)
    stream = BatchGradients(config, model, mesh, params, router_bias, batches)
    opt_state, count = rebuild_opt_state(opt, params, stream)
    step = int(meta["step"])
    record = {
        "source": str(folder),
        "step": step,
        "requested": n_steps,
        "gradients": count,
        "skipped_batches": stream.skipped,
        "batch_steps": [step + 1, step + n_steps],
        "mean_loss": float(np.mean(stream.losses)),
        "count_convention": "optimizer count = gradients",
    }
    state = host.replace(opt_state=meshlib.host_state(opt_state))
    # The source's meta as it was (save rewrites its own step/kind/leaf keys): the same bookkeeping, so a
    # resume reads the rebuilt checkpoint exactly as it would have read the source.
    written = ckpt.save(run.ckpt_root, step, state.to_dict(), dict(meta, **{META_KEY: record}))
    return Rebuilt(written, step, count, stream.skipped, (step + 1, step + n_steps), record["mean_loss"])


META_FIELDS = ("step", "config", "data_position", "phase_start_step", "tokens_before_phase")


def open_checkpoint(checkpoint: str | os.PathLike, model: Model) -> tuple[Path | str, dict, TrainConfig, Optimizer, TrainState]:
    """(folder, meta, config, optimizer, host state) of ``checkpoint`` (a folder or an out dir: its newest
    valid one); ValueError naming the folder for a meta.json without what a resume reads."""
    folder = resolve_checkpoint(os.fspath(checkpoint))
    arrays, meta = ckpt.load(folder)
    missing = [key for key in META_FIELDS if key not in meta]
    if missing:
        raise ValueError(f"{folder}/meta.json has no {missing[0]!r}: not a checkpoint marin train wrote")
    config = config_from_dict(meta["config"], where=f"{folder}/meta.json: config")
    opt = optimizer_for(config, model)
    return folder, meta, config, opt, load_state(arrays, str(folder), config, model, opt)


def _run_of(
    config: TrainConfig,
    host: TrainState,
    mesh,
    out: str,
    meta: Mapping[str, Any],
    tokenizers: Mapping[str, str],
    allow_tokenizer_change: bool,
) -> Run:
    """The source checkpoint's bookkeeping (data position, phase, tokens, telemetry run) as a ``Run``
    writing into ``out``, so the rebuilt checkpoint's meta is the one a resume reads."""
    return Run(
        config,
        host,
        mesh,
        None,
        child(out, "checkpoints"),
        position=DataPosition.from_json(meta["data_position"]),
        phase_start=int(meta["phase_start_step"]),
        tokens_before=int(meta["tokens_before_phase"]),
        telemetry_run=meta.get("telemetry_run"),
        data_tokenizers=tokenizers,
        allow_tokenizer_change=allow_tokenizer_change,
    )
