"""The jitted train step and the learning rate it is fed.

The step is ``jax.jit``-compiled once; the guards and the skip decision happen inside it. The
learning rate comes in as an argument (``phase_lrs``), not from the schedule inside the step:
the compiled step then depends on the model, optimizer and guards only, so phases with other
schedules and sweep runs of other lengths reuse one compilation (the persistent compile cache
finds it by its HLO).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from marin_assets.model.config import DEFAULT_DTYPE, DEFAULT_REMAT
from marin_assets.model.moe import moe_step_metrics
from marin_assets.train import accumulate
from marin_assets.train.compile_cache import reuse_jitted
from marin_assets.train.config import TrainConfig
from marin_assets.train.data.batches import segment_keywords
from marin_assets.train.distributed import mesh as meshlib
from marin_assets.train.distributed import offload
from marin_assets.train.guards import clip_grads, clip_updates, global_norm, record, should_skip
from marin_assets.train.lr_schedules import learning_rate
from marin_assets.train.optimizers import Optimizer
from marin_assets.train.state import Model, TrainState, moe_model


def default_model() -> Model:
    """The model ``train`` uses when given none: the MoE of ``marin_assets.model``."""
    return moe_model()


def compute_options(config: TrainConfig) -> dict:
    """The compute knobs ``model.loss_fn`` is given as keywords (``compute_dtype``, ``remat``); those at
    their defaults are left out, so a loss_fn that takes neither (a test's stand-in) runs as before."""
    given = {"compute_dtype": (config.compute_dtype, DEFAULT_DTYPE), "remat": (config.remat, DEFAULT_REMAT)}
    return {name: value for name, (value, default) in given.items() if value != default}


def mesh_options(mesh) -> dict:
    """``model.loss_fn``'s keywords that come from the mesh: ``sp`` when its sequence axis splits each row
    (context parallelism), else none, so a loss_fn that does not take it runs as before."""
    sp = meshlib.context_parallel(mesh)
    return {} if sp is None else {"sp": sp}


def make_train_step(config: TrainConfig, opt: Optimizer, model: Model, mesh, state_sh, *, moe_telemetry: bool = True):
    """step(state, tokens[B,S] int32, batch_ok bool, lr float32) -> (state, metrics), jitted on
    ``mesh`` with the state laid out by ``state_sh`` (``mesh.state_shardings``). The tokens may come as
    ``MaskedRows`` (tokens, loss mask, segment ids) from a loader with a chat source or document masking:
    the loss then counts the masked targets only, and attention stays inside each document.
    ``config.microbatches`` > 1: the gradient is accumulated over that many microbatches
    (train/accumulate.py); the guards, clipping and the update run once, as for one batch.

    ``moe_telemetry``: add ``metrics["moe"]`` (``model.moe.moe_step_metrics``) for a MoE; off only
    to measure what it costs (``benchmarks/telemetry_overhead.py``).

    The params (and so the gradients, the optimizer state and the update) stay in their stored
    dtype (``config.param_dtype``); the model casts them to ``config.compute_dtype`` per use.
    With ``config.offload_optimizer`` the optimizer state comes in and goes out in host memory
    (train/distributed/offload.py) and is copied to the device for the update."""
    model_cfg, guard_cfg = config.model, config.guards
    ep = meshlib.expert_parallel(mesh, model_cfg)  # routed experts over the "expert" axis
    options = compute_options(config) | mesh_options(mesh)
    offloaded = config.offload_optimizer  # state_sh then holds the moments in host memory (restore.fresh_run)

    token_part = model.token_mean_loss
    token_mean_loss = None if token_part is None else (lambda aux: token_part(aux, model_cfg))

    def step(state: TrainState, batch, batch_ok, lr):
        params = state.params

        def loss_of(p, tokens, loss_mask, segment_ids):
            return model.loss_fn(
                p, tokens, model_cfg, state.router_bias, loss_mask, ep, **options, **segment_keywords(segment_ids)
            )

        (loss, aux), grads = accumulate.loss_and_grads(
            loss_of,
            params,
            batch,
            microbatches=config.microbatches,
            mesh=mesh,
            grad_sh=state_sh.params,
            token_mean_loss=token_mean_loss,
        )
        grad_norm = global_norm(grads)
        decision = should_skip(guard_cfg, state.guard, loss, grad_norm, batch_ok)
        skip = decision["skip"]
        grads, grad_clipped = clip_grads(guard_cfg, grads, grad_norm, skip)
        opt_state = offload.to_device(state.opt_state, state_sh.opt_state) if offloaded else state.opt_state
        updates, new_opt = opt.update(grads, opt_state, params, lr)
        updates, update_norm, update_clipped = clip_updates(guard_cfg, state.guard, updates)
        # Skip-step: zero update AND the optimizer state stays as it was.
        new_params = jax.tree.map(lambda p, u: jnp.where(skip, p, p + u.astype(p.dtype)), params, updates)
        new_opt = jax.tree.map(lambda old, new: jnp.where(skip, old, new), opt_state, new_opt)
        if offloaded:
            new_opt = offload.to_host(new_opt, state_sh.opt_state)
        new_bias = jnp.where(skip, state.router_bias, model.next_router_bias(state.router_bias, aux, model_cfg))
        guard = record(guard_cfg, state.guard, decision, loss, grad_norm, update_norm, grad_clipped, update_clipped)
        rng, _ = jax.random.split(state.rng)
        new_state = TrainState(
            params=new_params, opt_state=new_opt, guard=guard, router_bias=new_bias, step=state.step + 1, rng=rng
        )
        metrics = {
            "loss": loss,
            "lr": lr,
            "grad_norm": grad_norm,
            "update_norm": update_norm,
            "skipped": skip,
            "counts": guard["counts"],
            # routed-expert assignments lost to EP capacity, summed over layers
            "dropped": jnp.sum(aux["dropped"]) if isinstance(aux, dict) and "dropped" in aux else 0,
        }
        if moe_telemetry and model_cfg.is_moe and has_moe_stats(aux):
            # computed here from the step's own aux: they come back in the one metrics fetch
            metrics["moe"] = moe_step_metrics(aux)
        return new_state, metrics

    return meshlib.jit_step(step, mesh, state_sh, n_scalars=2)


def train_step_for(config: TrainConfig, opt: Optimizer, model: Model, mesh, state_sh):
    """``make_train_step``'s step, reused from an earlier run of this process whose step computes
    the same thing (``compile_cache.reuse_jitted``): the key is everything the step's closure reads
    (the model, guard and optimizer configs, the dtypes, remat, offloading, the microbatches, the model
    functions, the mesh and the state layout). The optimizer is rebuilt per run from the optimizer
    config and the params' names and shapes alone, so an earlier run's is the same function. The seed, the data
    and the schedule are arguments or state, not part of the step."""
    if jax.process_count() > 1:
        return make_train_step(config, opt, model, mesh, state_sh)
    layout, treedef = jax.tree.flatten(state_sh)
    key = (
        "train_step",
        repr(config.model),
        repr(config.guards),
        repr(config.optimizer),
        config.param_dtype,
        config.compute_dtype,
        config.remat,
        config.offload_optimizer,
        config.microbatches,
        model,
        mesh,
        tuple(layout),
        treedef,
    )
    return reuse_jitted(key, lambda: make_train_step(config, opt, model, mesh, state_sh))


def has_moe_stats(aux) -> bool:
    """Whether a loss_fn's aux carries what ``moe_step_metrics`` reads (a test's stand-in model may not)."""
    needed = ("expert_load", "dropped_sender", "dropped_receiver", "router_z")
    return isinstance(aux, dict) and all(name in aux for name in needed)


def phase_lrs(config: TrainConfig, phase_start: int, start: int, end_step: int) -> np.ndarray:
    """float32 LR of every global step in (start, end_step]: the schedule at the step's
    phase-relative index (the state's step before the update, as the step would read it)."""
    steps = np.arange(start, end_step, dtype=np.int64) - phase_start
    return np.asarray(learning_rate(steps, config.schedule), np.float32)
