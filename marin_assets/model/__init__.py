"""The MoE / dense decoder transformer in plain JAX (Grug style: dicts of arrays).

Public API
----------
ModelConfig(...)                                   validated config (config.py)
init_params(config, key) -> params                 dict pytree of float32 arrays
init_router_bias(config) -> bias [n_layers, E]     zeros; carried by the train loop
forward(params, tokens[B,S], config, router_bias, ep=None, *, compute_dtype="float32", remat="none")
    -> (logits[B,S,V] float32, aux)
loss_fn(params, tokens[B,S], config, router_bias, loss_mask=None, ep=None, *, compute_dtype, remat) -> (loss, aux)
    for jax.value_and_grad(loss_fn, has_aux=True); config is static (hashable).
    compute_dtype "bfloat16": matmuls in bf16, params kept in their dtype and cast per use;
    remat "full" | "save_matmuls": jax.checkpoint per layer (compute.py).
    aux: ce_loss, lm_z_loss, router_z_loss, n_tokens, expert_load [L,E], dropped [L],
         balance_shift [L,E], router_z [L], load_cv [L]
token_mean_loss(aux, config) -> the part of the loss that is a mean over the counted targets
next_router_bias(router_bias, aux, config) -> bias [L,E]
    quantile balancing: apply from the next step; mean-centred; never differentiated.
count_params(config) -> (total, active)
flops_per_token(config, seq_len) -> float          training FLOPs/token (see flops.py)

Expert parallelism: pass ``ep=kernels.expert_parallel.ExpertParallel(mesh, ...)`` to
forward/loss_fn to run the routed experts with shard_map over the mesh's expert axis.
"""

import importlib
from typing import TYPE_CHECKING, Any

from marin_assets.model.config import ModelConfig
from marin_assets.model.flops import active_matmul_params, count_params, flops_per_token

# The JAX half loads on first use (PEP 562): a process that only reads or checks a ModelConfig (the Dagster
# code location, a config file's validation) never imports JAX.
if TYPE_CHECKING:  # what __getattr__ returns, as type checkers see it
    from marin_assets.model.transformer import (
        forward,
        init_params,
        init_router_bias,
        loss_fn,
        next_router_bias,
        token_mean_loss,
    )

_IN_TRANSFORMER = ("forward", "init_params", "init_router_bias", "loss_fn", "next_router_bias", "token_mean_loss")


def __getattr__(name: str) -> Any:
    if name in _IN_TRANSFORMER:
        return getattr(importlib.import_module("marin_assets.model.transformer"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ModelConfig",
    "init_params",
    "init_router_bias",
    "forward",
    "loss_fn",
    "next_router_bias",
    "token_mean_loss",
    "count_params",
    "flops_per_token",
    "active_matmul_params",
]
