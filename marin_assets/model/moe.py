"""The MoE MLP: fp32 router, shared experts, optional latent projection, routed experts,
the per-layer statistics quantile balancing needs, and the per-step MoE telemetry drawn from them."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.balancing import load_cv, quantile_shift_exact, quantile_shift_histogram, sequence_balance_loss
from kernels.dispatch import moe_local
from kernels.router import expert_load, route_topk, z_loss
from marin_assets.model.config import ModelConfig
from marin_assets.model.layers import swiglu


def moe_mlp(p: dict, x: jax.Array, config: ModelConfig, bias: jax.Array, ep=None) -> tuple[jax.Array, dict]:
    """x: [B, S, D]; bias: [E]. ep: optional ``kernels.expert_parallel.ExpertParallel``.

    Returns (out [B, S, D], stats) with stats: load [E] (assignments chosen per expert,
    before any drop), dropped (assignments lost to capacity), dropped_sender and
    dropped_receiver (the same split by the limit that dropped them; the single-device path
    is dropless, and an ``ep`` without ``with_drop_kinds`` reports its drops as receiver
    drops), shift [E] (the quantile balancing correction, zeros when balancing is off),
    router_z (router z-loss term), seq_balance (the sequence-wise balance loss, before its
    coefficient; 0 when ``sequence_balance_loss`` is off).
    """
    B, S, D = x.shape
    xt = x.reshape(B * S, D)
    logits = xt.astype(jnp.float32) @ p["router"].astype(jnp.float32)  # router in fp32
    ids, weights = route_topk(logits, bias, config.top_k, config.router_gating)

    routed_in = xt @ p["latent_down"] if config.latent_dim is not None else xt
    experts = (routed_in, ids, weights, p["e_gate"], p["e_up"], p["e_down"])
    if ep is None:  # no capacity is passed: dropless, so both kinds are 0
        routed, dropped_receiver = moe_local(*experts, impl=config.grouped_matmul)
        dropped_sender = jnp.int32(0)
    elif hasattr(ep, "with_drop_kinds"):
        routed, dropped_sender, dropped_receiver = ep.with_drop_kinds(*experts)
    else:
        routed, dropped_receiver = ep(*experts)
        dropped_sender = jnp.int32(0)
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
        "dropped": (dropped_sender + dropped_receiver).astype(jnp.int32),
        "dropped_sender": jnp.asarray(dropped_sender, jnp.int32),
        "dropped_receiver": jnp.asarray(dropped_receiver, jnp.int32),
        "shift": jax.lax.stop_gradient(shift),
        "router_z": z_loss(logits),
        "seq_balance": sequence_balance_loss(logits, ids, B) if config.sequence_balance_loss > 0 else jnp.float32(0.0),
    }
    return out.reshape(B, S, D), stats


def moe_step_metrics(aux: dict) -> dict:
    """The per-step MoE telemetry from ``forward``'s aux, on device (inside the jitted step).

    Per layer ([L] arrays): ``layer_load_max_over_mean`` (hottest expert's assignments over the
    mean, E when one expert takes every assignment of a top-1 router), ``layer_load_cv``
    (std/mean across experts), ``layer_drop_rate`` (dropped / routed assignments) and
    ``layer_router_z_loss``. Per step (scalars): ``drop_rate``, ``drop_rate_sender`` and
    ``drop_rate_receiver`` over every layer's routed assignments (fractions 0..1, the two kinds
    sum to ``drop_rate``), ``load_max_over_mean`` and ``load_cv`` (means over layers) and
    ``router_z_loss`` (mean over layers, before its loss coefficient). Routed assignments are
    counted from the load itself (tokens x top_k per layer), before any drop.
    """
    load = aux["expert_load"].astype(jnp.float32)  # [L, E]
    routed = jnp.sum(load, axis=-1)  # [L]
    sender = aux["dropped_sender"].astype(jnp.float32)
    receiver = aux["dropped_receiver"].astype(jnp.float32)
    max_over_mean = jnp.max(load, axis=-1) / jnp.maximum(jnp.mean(load, axis=-1), 1e-9)
    cv = load_cv(load)
    total = jnp.maximum(jnp.sum(routed), 1.0)
    router_z = aux["router_z"].astype(jnp.float32)
    return {
        "drop_rate": jnp.sum(sender + receiver) / total,
        "drop_rate_sender": jnp.sum(sender) / total,
        "drop_rate_receiver": jnp.sum(receiver) / total,
        "load_max_over_mean": jnp.mean(max_over_mean),
        "load_cv": jnp.mean(cv),
        "router_z_loss": jnp.mean(router_z),
        "layer_load_max_over_mean": max_over_mean,
        "layer_load_cv": cv,
        "layer_drop_rate": (sender + receiver) / jnp.maximum(routed, 1.0),
        "layer_router_z_loss": router_z,
    }
