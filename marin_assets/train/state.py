"""What the trainer carries between steps (``TrainState``) and what it needs of a model (``Model``).

``TrainState`` is a registered JAX pytree, so the jitted step takes and returns it whole and
``jax.tree.map`` works on it. Checkpoints store it as the dict ``to_dict()`` gives
(``['params'][...]``, ``['opt_state'][...]``, ... keys), the layout checkpoints had when the
state was a plain dict, so older checkpoints keep loading.

``Model`` is the functions the loop calls; ``moe_model()`` is the default (the MoE /
dense decoder of ``marin_assets.model``). Swap one function to test a guard, e.g.
``dataclasses.replace(moe_model(), loss_fn=poisoned)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from marin_assets import model
from marin_assets.model.compute import dtype_of
from marin_assets.model.config import ModelConfig
from marin_assets.train.guards import init_guard_state

FIELDS = ("params", "opt_state", "guard", "router_bias", "step", "rng")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    params: Any  # the model's parameter pytree
    opt_state: Any  # the optimizer's state pytree (optimizers.Optimizer.init)
    guard: dict  # rolling windows and event counters (guards.init_guard_state)
    router_bias: jax.Array  # MoE balancing bias [n_layers, n_experts]; updated outside the gradient
    step: jax.Array  # int32 global step: steps taken across every phase of the run
    rng: jax.Array  # PRNG key, split once per step

    def to_dict(self) -> dict:
        """The checkpoint layout: {field name: subtree}."""
        return {name: getattr(self, name) for name in FIELDS}

    @classmethod
    def from_dict(cls, data: dict) -> TrainState:
        return cls(**{name: data[name] for name in FIELDS})

    def replace(self, **changes) -> TrainState:
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class Model:
    """The model functions the train loop calls (all pure; ``config`` is static).

    init_params(config, key) -> params
    loss_fn(params, tokens[B, S] int32, config, router_bias, loss_mask=None, ep=None, **options)
        -> (scalar loss, aux dict); the loop passes ``ep``, the mesh's routed-expert layer
        (``train.distributed.mesh.expert_parallel``: a ``kernels.expert_parallel.ExpertParallel``, None
        for a dense model), which a MoE must use for its routed experts; ``options`` are the
        compute knobs a TrainConfig sets away from their defaults (``step.compute_options``:
        compute_dtype, remat), which a loss_fn that does not take them cannot be used with
    init_router_bias(config) -> router_bias
    next_router_bias(router_bias, aux, config) -> router_bias  (not differentiated)
    token_mean_loss(aux, config) -> the part of loss_fn's loss that is a mean over the counted
        targets (the loss mask's); gradient accumulation weighs it by each microbatch's share of
        them (train/accumulate.py). None: the whole loss is such a mean.
    """

    init_params: Callable[[ModelConfig, jax.Array], Any]
    loss_fn: Callable[..., tuple[jax.Array, dict]]
    init_router_bias: Callable[[ModelConfig], jax.Array]
    next_router_bias: Callable[[jax.Array, dict, ModelConfig], jax.Array]
    token_mean_loss: Callable[[dict, ModelConfig], jax.Array] | None = None


def moe_model() -> Model:
    return Model(model.init_params, model.loss_fn, model.init_router_bias, model.next_router_bias, model.token_mean_loss)


def init_state(config, opt, model: Model, key=None) -> TrainState:
    """A fresh state for ``config`` (a TrainConfig): params from ``config.seed`` in ``config.param_dtype``
    (the optimizer state follows the params' dtype), step 0. ``key``: ``jax.random.PRNGKey(config.seed)``
    given as an argument, so a jitted init is one computation for every seed (the same bits either way)."""
    key = jax.random.PRNGKey(config.seed) if key is None else key
    key, init_key = jax.random.split(key)
    dtype = dtype_of(config.param_dtype, "TrainConfig.param_dtype")
    params = jax.tree.map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, model.init_params(config.model, init_key)
    )
    return TrainState(
        params=params,
        opt_state=opt.init(params),
        guard=init_guard_state(config.guards),
        router_bias=model.init_router_bias(config.model),
        step=jnp.int32(0),
        rng=key,
    )
