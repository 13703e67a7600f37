"""Where a phase starts from: a fresh state, the newest checkpoint (resume) or another phase's (warm start).

``Run`` is the state of one ``train`` call plus the bookkeeping its checkpoints save (data
position, where the phase began, tokens before it, the tokenizers of its data), so a resume
continues bit-exact and a warm start keeps the data position while restarting the schedule.
Continuing on tokens of another tokenizer is refused unless allowed: the ids would mean other text.
A warm start from an HF model folder (``hf:PATH``) reads its weights through the ``read_weights`` the
caller hands over (``marin_assets.hf.warm_start_weights``): hf sits above train (docs/layers.md).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from marin_assets.model import init_params, init_router_bias
from marin_assets.model.config import ModelConfig, first_architecture_difference
from marin_assets.store.fsutil import child, filesystem, join
from marin_assets.train.checkpoints import checkpoint as ckpt
from marin_assets.train.checkpoints import sharded_checkpoint as sharded
from marin_assets.train.compile_cache import reuse_jitted
from marin_assets.train.config import TrainConfig, config_from_dict, config_to_dict
from marin_assets.train.data.batches import DataPosition
from marin_assets.train.distributed import hosts as distributed
from marin_assets.train.distributed import mesh as meshlib
from marin_assets.train.distributed import offload
from marin_assets.train.metrics import MetricsLogger
from marin_assets.train.optimizers import Optimizer, make_optimizer
from marin_assets.train.state import Model, TrainState, init_state

log = logging.getLogger(__name__)

HF_PREFIX = "hf:"  # how a user names an HF folder where a checkpoint could also be meant (--warm-start hf:PATH)
# Reads the HF folder an ``hf:PATH`` warm start names: (params in our tree, their ModelConfig, the sha256 of the
# folder's tokenizer or None). The callers of ``train`` pass ``marin_assets.hf.warm_start_weights``.
WeightsReader = Callable[[str], tuple[Any, ModelConfig, str | None]]


@dataclasses.dataclass
class Run:
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

    @property
    def end_step(self) -> int:
        """The global step this phase ends at."""
        return self.phase_start + self.config.num_steps

    def tokens_at(self, step: int) -> int:
        """Tokens trained on across every phase when the state is at global ``step``."""
        return self.tokens_before + (step - self.phase_start) * self.config.tokens_per_step

    def meta(self, step: int) -> dict:
        """What a checkpoint at ``step`` records beside the state."""
        return {
            "data_position": self.position.to_json(),
            "phase_start_step": self.phase_start,
            "phase": self.config.phase,
            "tokens_before_phase": self.tokens_before,
            "tokens": self.tokens_at(step),
            "optimizer": self.config.optimizer.name,
            "config": config_to_dict(self.config),
            "telemetry_run": self.telemetry_run,
            "data_tokenizers": dict(self.data_tokenizers),
        }

    def check_tokenizers(self, meta: Mapping[str, Any], where: str) -> None:
        """Continue only on tokens of the checkpoint's tokenizers (see ``check_same_tokenizer``)."""
        before = meta.get("data_tokenizers") or {}
        changed = sorted(k for k in set(before) & set(self.data_tokenizers) if before[k] != self.data_tokenizers[k])
        if not changed or self.allow_tokenizer_change:
            return
        name = changed[0]
        raise ValueError(
            f"{where} was trained on {name!r} tokenized by tokenizer {before[name][:12]}, but the data given "
            f"now was tokenized by {self.data_tokenizers[name][:12]}: the ids mean other text. Use data "
            f"tokenized by the checkpoint's tokenizer, or allow the change (marin train "
            f"--allow-tokenizer-change) to continue anyway"
        )


def fresh_run(config: TrainConfig, model: Model, mesh, ckpt_root: Path | str, **bookkeeping) -> tuple[Run, Optimizer]:
    """A ``Run`` at step 0 (the state created straight into its mesh layout) and its optimizer;
    ``bookkeeping``: ``Run``'s telemetry_run, data_tokenizers, allow_tokenizer_change."""
    key = (
        "init_state",
        repr(config.model),
        repr(config.guards),
        repr(config.optimizer),
        config.param_dtype,
        model,
        mesh,
        config.fsdp,
    )
    opt, init, state_sh = reuse_jitted(key, lambda: _jitted_init(config, model, mesh))
    state = init(np.asarray(jax.random.PRNGKey(config.seed)))
    if config.offload_optimizer:  # the moments move to host memory before the first step
        offload.check_supported(mesh)
        state_sh = offload.offloaded(state_sh)
        state = state.replace(opt_state=jax.device_put(state.opt_state, state_sh.opt_state))
    return Run(config, state, mesh, state_sh, ckpt_root, **bookkeeping), opt


def _jitted_init(config: TrainConfig, model: Model, mesh) -> tuple[Optimizer, Callable, TrainState]:
    """The optimizer, ``init(seed key) -> TrainState`` jitted straight into the mesh's layout (no process ever
    holds an unsharded copy on device), and that layout. The seed's key is an argument (host data, the same on
    every process), not a constant of the trace, so runs that differ in their seed share one compiled init
    (``fresh_run`` reuses it through ``compile_cache.reuse_jitted``; the key names what the closure reads)."""
    opt, _, state_sh = state_layout(config, model, mesh)

    def init(key) -> TrainState:
        return init_state(config, opt, model, key)

    return opt, jax.jit(init, out_shardings=state_sh), state_sh


def optimizer_for(config: TrainConfig, model: Model) -> Optimizer:
    """``config.optimizer`` built for ``model``'s params, from their names and shapes alone (nothing allocated)."""
    return make_optimizer(config.optimizer, jax.eval_shape(lambda: model.init_params(config.model, jax.random.PRNGKey(0))))


def state_layout(config: TrainConfig, model: Model, mesh, offloaded: bool = False) -> tuple[Optimizer, TrainState, TrainState]:
    """The optimizer of ``config`` (built from the params' names and shapes alone), the train state's
    shapes (``jax.ShapeDtypeStruct`` leaves: no state is allocated) and its shardings on ``mesh``, laid
    out as a run lays it out (``config.fsdp``); with ``offloaded``, the moments' shardings in host memory
    (what a ``config.offload_optimizer`` run steps with). What a run's init builds its state on, and what the
    benchmarks and tests that compile or time a step without ``train`` use (a state they make for it:
    ``meshlib.init_sharded(..., config.fsdp)``, the same layout)."""
    opt = optimizer_for(config, model)
    shapes = jax.eval_shape(lambda key: init_state(config, opt, model, key), jax.random.PRNGKey(0))
    state_sh = meshlib.state_shardings(mesh, shapes, fsdp=config.fsdp)
    return opt, shapes, offload.offloaded(state_sh) if offloaded else state_sh


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


def load_model_from_checkpoint(checkpoint_dir: str | Path):
    """(params, ModelConfig, router_bias, meta) from a train checkpoint (or an out dir)."""
    folder = resolve_checkpoint(checkpoint_dir)
    arrays, meta = ckpt.load(folder)
    config = config_from_dict(meta["config"], where=f"{folder}/meta.json")
    template = jax.eval_shape(lambda: init_params(config.model, jax.random.PRNGKey(0)))
    params = ckpt.restore_like(template, arrays, "['params']", str(folder))
    bias = ckpt.restore_like(init_router_bias(config.model), arrays, "['router_bias']", str(folder))
    return params, config.model, bias, meta


class NoValidCheckpoint(ValueError):
    """A resume found checkpoint folders and none of them verifies: starting over would destroy them."""


def start(
    run: Run, logger: MetricsLogger, resume: bool, warm_start: str | Path | None, read_weights: WeightsReader | None = None
) -> None:
    """Resume from the newest valid checkpoint, else warm start, else begin fresh. A resume onto
    checkpoint folders none of which verifies is refused (``NoValidCheckpoint``): a fresh start would
    cut metrics.jsonl and overwrite those folders as leftovers. ``read_weights`` reads an ``hf:PATH``
    warm start's folder (``WeightsReader``)."""
    latest = ckpt.latest_valid(run.ckpt_root) if resume else None
    if latest is not None:
        _resume(run, latest, logger)
        return
    if resume:
        refuse_unverified_checkpoints(run.ckpt_root)
    if distributed.is_writer():
        logger.truncate_after(-1)  # a fresh start owns the file
    if warm_start is not None and str(warm_start).startswith(HF_PREFIX):
        _warm_start_hf(run, str(warm_start), read_weights)
    elif warm_start is not None:
        _warm_start(run, resolve_checkpoint(warm_start))


def refuse_unverified_checkpoints(root: Path | str) -> None:
    """Raise ``NoValidCheckpoint`` when ``root`` holds checkpoint folders and none verifies; touch nothing."""
    folders = ckpt.list_checkpoints(root)
    if not folders:
        return
    first = folders[-1]
    raise NoValidCheckpoint(
        f"--resume: {root} holds {len(folders)} checkpoint folder(s) and none is valid (newest, {first}: "
        f"{ckpt.marker_problem(first)}); nothing was changed. Restore the checkpoints (an interrupted copy lacks "
        f"its COMMITTED markers), or to start over on purpose move {root} aside or give another --out"
    )


def checkpoint_position(meta: Mapping[str, Any]) -> DataPosition:
    """A checkpoint's data position. One written before context phases counts windows of the seq_len it
    was trained at, which its config records: read it in those units, whatever this run's seq_len is."""
    position = DataPosition.from_json(meta["data_position"])
    if position.unit_tokens is None:
        seq_len = int(meta["config"]["seq_len"])
        position = dataclasses.replace(position, unit_tokens=seq_len, block_tokens=seq_len)
    return position


def _resume(run: Run, folder: Path | str, logger: MetricsLogger) -> None:
    """The whole state and bookkeeping of ``folder``; the metrics rows after its step are dropped."""
    source = Source(folder, verified=True)  # latest_valid has just checked every digest
    meta = source.meta
    run.check_tokenizers(meta, f"checkpoint {folder}")
    state = source.read(run.state.to_dict(), run.state_sh.to_dict())
    run.state = TrainState.from_dict(state)
    run.position = checkpoint_position(meta)
    run.phase_start, run.tokens_before = int(meta["phase_start_step"]), int(meta["tokens_before_phase"])
    if distributed.is_writer():
        logger.truncate_after(int(meta["step"]))
    log.info("resumed from %s at step %d", folder, meta["step"])


def _warm_start(run: Run, source_dir: Path | str) -> None:
    """Params, router bias, RNG, global step and data position from ``source_dir``; the optimizer
    state too when the optimizer is the same; the schedule restarts at this phase's step 0."""
    source = Source(source_dir)
    meta = source.meta
    run.check_tokenizers(meta, f"warm start {source_dir}")
    state, sh = run.state, run.state_sh
    state = state.replace(
        params=source.read(state.params, sh.params, "['params']"),
        router_bias=source.read(state.router_bias, sh.router_bias, "['router_bias']"),
        rng=source.read(state.rng, sh.rng, "['rng']"),
        step=meshlib.place_state(np.int32(int(meta["step"])), sh.step),
    )
    if meta.get("optimizer") == run.config.optimizer.name:
        try:
            state = state.replace(opt_state=source.read(state.opt_state, sh.opt_state, "['opt_state']"))
        except ValueError as e:
            log.warning("warm start: optimizer state not reusable (%s); starting it fresh", e)
    run.state = state
    run.position = checkpoint_position(meta)
    run.phase_start, run.tokens_before = int(meta["step"]), int(meta["tokens"])
    log.info("warm start from %s at step %d (data position kept: %s)", source_dir, run.phase_start, run.position.to_json())


def _warm_start_hf(run: Run, source: str, read_weights: WeightsReader | None) -> None:
    """Params from an HF model folder (``hf:PATH``, read by ``read_weights``: marin_assets.hf.warm_start_weights);
    everything else fresh: step 0, data position 0, the optimizer new. Its model must be the run's (the first
    differing field is named)."""
    if read_weights is None:
        raise ValueError(
            f"warm start {source}: an HF model folder, and this caller of train passed no read_weights "
            f"(marin_assets.hf.warm_start_weights) to read it"
        )
    params, imported, tokenizer = read_weights(source)
    if tokenizer is None:
        log.warning("warm start %s: the folder has no tokenizer.json, so its tokenizer is not checked", source)
    else:  # as a checkpoint's: continue only on tokens of the same tokenizer
        run.check_tokenizers({"data_tokenizers": {name: tokenizer for name in run.data_tokenizers}}, f"warm start {source}")
    differs = first_architecture_difference(imported, run.config.model)
    if differs is not None:
        raise ValueError(
            f"warm start {source}: its model differs from this run's in ModelConfig.{differs} "
            f"({getattr(imported, differs)!r} there, {getattr(run.config.model, differs)!r} here)"
        )
    state, sh = run.state, run.state_sh
    params = jax.tree.map(lambda x, t: np.asarray(x, t.dtype), params, state.params)
    run.state = state.replace(params=meshlib.place_state(params, sh.params))
    log.info("warm start from the HF weights at %s (step 0, data position 0, fresh optimizer)", source)


class Source:
    """A verified checkpoint to start from, read straight into the run's layout: a sharded one slice by
    slice (each process reads what its devices hold), a single-file one whole on every process."""

    def __init__(self, folder: Path | str, verified: bool = False) -> None:
        problem = None if verified else ckpt.marker_problem(folder)
        if problem is not None:
            raise ValueError(f"checkpoint {folder} is corrupt or incomplete: {problem}")
        self.folder, self.where = folder, str(folder)
        self.arrays = None
        if ckpt.is_sharded(folder):
            self.meta = sharded.read_meta(folder)
        else:
            self.arrays, self.meta = ckpt.load(folder)

    def read(self, template, shardings, prefix: str = ""):
        """``template``'s tree (arrays or shapes) from the saved leaves ``prefix + key``, laid out by ``shardings``."""
        shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), template)
        if self.arrays is None:
            return sharded.restore(self.folder, self.meta, shapes, shardings, prefix, self.where)
        return meshlib.place_state(ckpt.restore_like(shapes, self.arrays, prefix, self.where), shardings)
