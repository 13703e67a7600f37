"""Building blocks: RMSNorm, (partial) RoPE, grouped-query causal attention with optional
QK-norm, document masking and sliding windows (the kernels in kernels/attention.py), SwiGLU."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.attention import SequenceParallel, causal_attention, masked, resolve_impl
from marin_assets.model.config import MAX_INT32, ModelConfig


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
    return (normed * weight).astype(x.dtype)


def rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotary embedding on the last axis of x: [B, S, heads, head_dim]; positions: [S], or [B, S]
    (each row its own, as decoding left-padded prompts needs)."""
    half = x.shape[-1] // 2
    freqs = 1.0 / (theta ** (jnp.arange(half, dtype=jnp.float32) / half))
    angles = positions.astype(jnp.float32)[..., None] * freqs  # [S, half] or [B, S, half]
    cos, sin = jnp.cos(angles)[..., None, :], jnp.sin(angles)[..., None, :]  # broadcast over heads
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    out = jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
    return out.astype(x.dtype)


def rope_dims(config: ModelConfig) -> int:
    """Leading dims of each head that RoPE rotates: ``rope_fraction`` of the head, rounded
    down to an even count. The remaining dims carry no position (partial RoPE)."""
    return 2 * int(config.resolved_head_dim * config.rope_fraction / 2)


def partial_rope(x: jax.Array, positions: jax.Array, config: ModelConfig) -> jax.Array:
    """RoPE on the first ``rope_dims`` of the last axis; the full head is today's ``rope``."""
    rotated = rope_dims(config)
    if rotated == x.shape[-1]:
        return rope(x, positions, config.rope_theta)
    if rotated == 0:
        return x
    return jnp.concatenate([rope(x[..., :rotated], positions, config.rope_theta), x[..., rotated:]], axis=-1)


def project_qkv(p: dict, x: jax.Array, config: ModelConfig, positions: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """q [B, S, H, hd], k and v [B, S, KV, hd] of x [B, S, D], q and k RMS-normalised (QK-norm)
    and rotated at ``positions`` ([S], or [B, S] per row). attention and model/decode.py share it."""
    B, S, _ = x.shape
    H, KV, hd = config.n_heads, config.n_kv_heads, config.resolved_head_dim
    q = (x @ p["wq"]).reshape(B, S, H, hd)
    k = (x @ p["wk"]).reshape(B, S, KV, hd)
    v = (x @ p["wv"]).reshape(B, S, KV, hd)
    # QK-norm: bounded attention logits, which is what stopped loss spikes in Marin's 32B.
    # With qk_norm off the q_norm/k_norm gains stay in the params (same tree) but go unused.
    if config.qk_norm:
        q = rms_norm(q, p["q_norm"], config.norm_eps)
        k = rms_norm(k, p["k_norm"], config.norm_eps)
    return partial_rope(q, positions, config), partial_rope(k, positions, config), v


def attend(p: dict, q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, config: ModelConfig) -> jax.Array:
    """Grouped-query attention of q [B, Q, H, hd] over k, v [B, K, KV, hd] where ``mask`` (True =
    may attend; broadcast to [B, KV, H/KV, Q, K]) allows, through the output projection: [B, Q, D].
    The naive path, for any mask (model/decode.py attends a KV cache with it)."""
    B, Q = q.shape[:2]
    return masked(q, k, v, mask).reshape(B, Q, -1) @ p["wo"]


def document_positions(segment_ids: jax.Array) -> jax.Array:
    """[B, S] positions that restart at 0 where a row's segment id changes (each packed document's own)."""
    pos = jnp.arange(segment_ids.shape[1])
    starts = jnp.concatenate([jnp.ones_like(segment_ids[:, :1], bool), segment_ids[:, 1:] != segment_ids[:, :-1]], 1)
    return pos - jax.lax.cummax(jnp.where(starts, pos, 0), axis=1)


GLOBAL = MAX_INT32  # a layer's window in a scanned per-layer pattern: no window


def window_array(config: ModelConfig) -> jax.Array:
    """Every layer's window as int32 [L], ``GLOBAL`` for a global layer (what a scan over layers reads)."""
    return jnp.array([GLOBAL if w is None else w for w in config.layer_windows], jnp.int32)


def scanned_windows(config: ModelConfig) -> jax.Array | int | None:
    """The per-layer window to hand each scanned layer: None (every layer global) or one int (the same
    window everywhere) stay static; a mixed pattern is ``window_array``."""
    windows = set(config.layer_windows)
    if len(windows) == 1:
        return windows.pop()
    return window_array(config)


def attention(
    p: dict,
    x: jax.Array,
    config: ModelConfig,
    segment_ids: jax.Array | None = None,
    window: jax.Array | int | None = None,
    sp: SequenceParallel | None = None,
) -> jax.Array:
    """Causal GQA self-attention, by default with RMS-normalised q and k (QK-norm) and RoPE
    on the whole head. x: [B, S, D]. segment_ids [B, S]: packed documents, none attends across
    another (and with ``rope_per_document`` each counts its positions from 0). window: this layer's
    (None: global; a traced int32 from a scanned pattern, ``GLOBAL`` meaning none). sp: context parallelism
    (the sequence split over a mesh axis; the reference or blockwise kernel)."""
    B, S, _ = x.shape
    positions = jnp.arange(S)
    if config.rope_per_document and segment_ids is not None:
        positions = document_positions(segment_ids)
    q, k, v = project_qkv(p, x, config, positions)
    impl = resolve_impl(config.attention_impl, S, q.dtype)

    if sp is not None:
        impl = "reference" if impl == "reference" else "blockwise"

    def run(w):
        if sp is not None:
            return sp(q, k, v, segment_ids, w, impl=impl)
        return causal_attention(q, k, v, segment_ids=segment_ids, window=w, impl=impl)

    if window is None or isinstance(window, int) or impl in ("reference", "blockwise"):
        out = run(window)  # those two read a traced window; GLOBAL masks nothing
    else:  # the library kernels take a static window: the layer picks one of two compiled variants
        out = jax.lax.cond(window == GLOBAL, lambda: run(None), lambda: run(config.sliding_window))
    return out.reshape(B, S, -1) @ p["wo"]


def swiglu(x: jax.Array, w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array) -> jax.Array:
    return (jax.nn.silu(x @ w_gate) * (x @ w_up)) @ w_down
