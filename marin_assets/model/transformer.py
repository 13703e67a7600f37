"""Decoder-only transformer as plain functions over a dict of arrays.

Layer weights are stacked on a leading ``n_layers`` axis and the layers run under
``jax.lax.scan``, so compile time does not grow with depth.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.balancing import apply_shift, load_cv
from marin_assets.model.compute import dtype_of, for_compute, rematerialised
from marin_assets.model.config import DEFAULT_DTYPE, DEFAULT_REMAT, ModelConfig
from marin_assets.model.layers import attention, rms_norm, scanned_windows, swiglu
from marin_assets.model.moe import moe_mlp


def init_params(config: ModelConfig, key: jax.Array) -> dict:
    """Normal(0, init_std) matrices (output projections scaled by 1/sqrt(2*layers)), unit norms."""
    L, D, V = config.n_layers, config.d_model, config.vocab_size
    H, KV, hd = config.n_heads, config.n_kv_heads, config.resolved_head_dim
    std, out_std = config.init_std, config.init_std / (2 * L) ** 0.5
    keys = iter(jax.random.split(key, 16))

    def normal(shape, scale=std):
        return scale * jax.random.normal(next(keys), shape, jnp.float32)

    layers = {
        "attn_norm": jnp.ones((L, D)),
        "mlp_norm": jnp.ones((L, D)),
        "q_norm": jnp.ones((L, hd)),
        "k_norm": jnp.ones((L, hd)),
        "wq": normal((L, D, H * hd)),
        "wk": normal((L, D, KV * hd)),
        "wv": normal((L, D, KV * hd)),
        "wo": normal((L, H * hd, D), out_std),
    }
    dense_width = config.d_ff * (config.n_shared_experts if config.is_moe else 1)
    if dense_width > 0:
        layers |= {
            "w_gate": normal((L, D, dense_width)),
            "w_up": normal((L, D, dense_width)),
            "w_down": normal((L, dense_width, D), out_std),
        }
    if config.is_moe:
        E, F, R = config.n_routed_experts, config.expert_d_ff, config.routed_dim
        layers |= {
            "router": normal((L, D, E)),
            "e_gate": normal((L, E, R, F)),
            "e_up": normal((L, E, R, F)),
            "e_down": normal((L, E, F, R), out_std),
        }
        if config.latent_dim is not None:
            layers |= {"latent_down": normal((L, D, R)), "latent_up": normal((L, R, D), out_std)}
    return {"embed": normal((V, D)), "layers": layers, "final_norm": jnp.ones((D,)), "lm_head": normal((D, V))}


def init_router_bias(config: ModelConfig) -> jax.Array:
    """Zero balancing bias: [n_layers, n_routed_experts] (0 experts for a dense model)."""
    return jnp.zeros((config.n_layers, config.n_routed_experts), jnp.float32)


def forward(
    params: dict,
    tokens: jax.Array,
    config: ModelConfig,
    router_bias: jax.Array,
    ep=None,
    *,
    compute_dtype: str = DEFAULT_DTYPE,
    remat: str = DEFAULT_REMAT,
    segment_ids: jax.Array | None = None,
    sp=None,
) -> tuple[jax.Array, dict]:
    """tokens: [B, S] int -> (logits [B, S, V] float32, aux).

    segment_ids [B, S]: the document of each position of a packed row; attention never crosses
    documents (None: one document per row). The layers' windows come from the config. sp: context
    parallelism (``kernels.attention.SequenceParallel``): attention with the sequence split over a mesh axis.

    compute_dtype: the dtype of the activations and matmuls (model/compute.py); the parameters
    keep theirs and are cast per use inside each layer. remat: what the backward keeps of each
    layer (``compute.REMAT_POLICIES``). Neither changes the result beyond rounding.

    aux (per layer, stacked on axis 0; all zeros/empty for a dense model):
      expert_load [L, E] assignments chosen per expert; dropped [L] assignments lost to
      capacity, split by the limit that dropped them as dropped_sender [L] and
      dropped_receiver [L] (``moe_mlp``); balance_shift [L, E] quantile correction for ``next_router_bias``;
      router_z [L] router z-loss terms; seq_balance [L] sequence-wise balance loss terms (0 when off);
      load_cv [L] std/mean of expert load.
    """
    if tokens.ndim != 2:
        raise ValueError(f"forward: tokens must be [batch, seq], got shape {tokens.shape}")
    if tokens.shape[1] > config.max_seq_len:
        raise ValueError(f"forward: sequence length {tokens.shape[1]} > max_seq_len {config.max_seq_len}")
    dtype = dtype_of(compute_dtype)
    x = params["embed"][tokens].astype(dtype)  # gather first: only the rows used are cast
    E = config.n_routed_experts

    windows = scanned_windows(config)
    per_layer = isinstance(windows, jax.Array)

    def layer(x, inputs):
        p, bias, window = inputs if per_layer else (*inputs, windows)
        p = for_compute(p, dtype)
        x = x + attention(p, rms_norm(x, p["attn_norm"], config.norm_eps), config, segment_ids, window, sp)
        h = rms_norm(x, p["mlp_norm"], config.norm_eps)
        if config.is_moe:
            y, stats = moe_mlp(p, h, config, bias, ep)
        else:
            y = swiglu(h, p["w_gate"], p["w_up"], p["w_down"])
            stats = {
                "load": jnp.zeros((0,), jnp.int32),
                "dropped": jnp.int32(0),
                "dropped_sender": jnp.int32(0),
                "dropped_receiver": jnp.int32(0),
                "shift": jnp.zeros((0,), jnp.float32),
                "router_z": jnp.float32(0.0),
                "seq_balance": jnp.float32(0.0),
            }
        return x + y, stats

    bias = router_bias if E > 0 else jnp.zeros((config.n_layers, 0), jnp.float32)
    scanned = (params["layers"], bias, windows) if per_layer else (params["layers"], bias)
    x, stats = jax.lax.scan(rematerialised(layer, remat), x, scanned)
    x = rms_norm(x, params["final_norm"], config.norm_eps)
    # Logits in fp32 (accumulated in fp32 from bf16 operands): the loss's logsumexp and z-loss read them.
    logits = jnp.matmul(x, params["lm_head"].astype(dtype), preferred_element_type=jnp.float32)
    aux = {
        "expert_load": stats["load"],
        "dropped": stats["dropped"],
        "dropped_sender": stats["dropped_sender"],
        "dropped_receiver": stats["dropped_receiver"],
        "balance_shift": stats["shift"],
        "router_z": stats["router_z"],
        "seq_balance": stats["seq_balance"],
        "load_cv": load_cv(stats["load"]) if E > 0 else jnp.zeros((config.n_layers,)),
    }
    return logits, aux


def loss_fn(
    params: dict,
    tokens: jax.Array,
    config: ModelConfig,
    router_bias: jax.Array,
    loss_mask: jax.Array | None = None,
    ep=None,
    *,
    compute_dtype: str = DEFAULT_DTYPE,
    remat: str = DEFAULT_REMAT,
    segment_ids: jax.Array | None = None,
    sp=None,
) -> tuple[jax.Array, dict]:
    """Next-token cross-entropy + LM-logit z-loss + router z-loss + sequence-wise balance loss (when on),
    computed in fp32 from fp32 logits.

    Position s predicts token s+1; ``loss_mask`` [B, S] (1 = count) masks the *targets*.
    ``compute_dtype``, ``remat``, ``segment_ids`` (document masking) and ``sp`` (context parallelism) as in ``forward``.
    Returns (loss, aux) with aux = forward's aux plus ce_loss, lm_z_loss, router_z_loss,
    n_tokens. Use with ``jax.value_and_grad(loss_fn, has_aux=True)``.
    """
    logits, aux = forward(
        params, tokens, config, router_bias, ep, compute_dtype=compute_dtype, remat=remat, segment_ids=segment_ids, sp=sp
    )
    logits, targets = logits[:, :-1], tokens[:, 1:]
    mask = jnp.ones(targets.shape, jnp.float32) if loss_mask is None else loss_mask[:, 1:].astype(jnp.float32)
    n = jnp.maximum(jnp.sum(mask), 1.0)
    lse = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    ce = jnp.sum((lse - target_logit) * mask) / n
    lm_z = jnp.sum(jnp.square(lse) * mask) / n
    router_z = jnp.mean(aux["router_z"]) if config.is_moe else jnp.float32(0.0)
    loss = ce + config.lm_z_loss * lm_z + config.router_z_loss * router_z
    if config.is_moe and config.sequence_balance_loss > 0:  # off: the loss (and its graph) as before
        loss = loss + config.sequence_balance_loss * jnp.mean(aux["seq_balance"])
    aux = aux | {"ce_loss": ce, "lm_z_loss": lm_z, "router_z_loss": router_z, "n_tokens": n}
    return loss, aux


def token_mean_loss(aux: dict, config: ModelConfig) -> jax.Array:
    """The part of ``loss_fn``'s loss that is a mean over the counted targets (cross-entropy and LM z-loss),
    from its aux; the rest (router z-loss, sequence balance) are means over every token or sequence. Gradient
    accumulation weighs this part by a microbatch's share of the batch's counted targets (train/accumulate.py)."""
    return aux["ce_loss"] + config.lm_z_loss * aux["lm_z_loss"]


def next_router_bias(router_bias: jax.Array, aux: dict, config: ModelConfig) -> jax.Array:
    """Quantile balancing: the bias for the NEXT step, mean-centred per layer, no gradient."""
    if not config.is_moe or config.balancing == "none":
        return jax.lax.stop_gradient(router_bias)
    return apply_shift(router_bias, aux["balance_shift"], config.balancing_rate)
