"""The MoE MLP: fp32 router, shared experts, optional latent projection, routed experts,
and the per-layer statistics quantile balancing needs."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.balancing import quantile_shift_exact, quantile_shift_histogram
from kernels.dispatch import moe_local
from kernels.routing import expert_load, route_topk, z_loss
from marin_assets.model.config import ModelConfig
from marin_assets.model.layers import swiglu


def moe_mlp(p: dict, x: jax.Array, config: ModelConfig, bias: jax.Array, ep=None
            ) -> tuple[jax.Array, dict]:
    """x: [B, S, D]; bias: [E]. ep: optional ``kernels.expert_parallel.ExpertParallel``.

    Returns (out [B, S, D], stats) with stats: load [E] (assignments chosen per expert,
    before any drop), dropped (assignments lost to capacity), shift [E] (the quantile
    balancing correction, zeros when balancing is off), router_z (router z-loss term).
    """
    B, S, D = x.shape
    xt = x.reshape(B * S, D)
    logits = xt.astype(jnp.float32) @ p["router"].astype(jnp.float32)  # router in fp32
    ids, weights = route_topk(logits, bias, config.top_k)

    routed_in = xt @ p["latent_down"] if config.latent_dim is not None else xt
    experts = (routed_in, ids, weights, p["e_gate"], p["e_up"], p["e_down"])
    if ep is None:
        routed, dropped = moe_local(*experts, impl=config.grouped_matmul)
    else:
        routed, dropped = ep(*experts)
    if config.latent_dim is not None:
        routed = routed @ p["latent_up"]
    out = routed.astype(x.dtype)
    if config.n_shared_experts > 0:
        out = out + swiglu(xt, p["w_gate"], p["w_up"], p["w_down"])

    if config.balancing == "quantile_exact":
        shift = quantile_shift_exact(logits, bias, config.top_k)
    elif config.balancing == "quantile_histogram":
        shift = quantile_shift_histogram(logits, bias, config.top_k, config.histogram_bins)
    else:
        shift = jnp.zeros_like(bias, dtype=jnp.float32)
    stats = {
        "load": expert_load(ids, config.n_routed_experts),
        "dropped": dropped,
        "shift": jax.lax.stop_gradient(shift),
        "router_z": z_loss(logits),
    }
    return out.reshape(B, S, D), stats
