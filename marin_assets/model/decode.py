"""Batched sampling with a KV cache: a prefill fills each layer's keys and values, then every
decode step runs one new token per sequence through the layers against that cache.

  generate(params, config, router_bias, prompts, *, max_new_tokens, temperature=0.0, top_p=1.0,
           stop_sequences=(), seed=0, compute_dtype="float32") -> new tokens per prompt
  Generator(params, config, router_bias)   the same, parameters placed on the device once

Layout
------
The cache is ``k``, ``v``: [L, B, T, KV, hd], stacked on the layer axis like the parameters, so
the layers still run under ``lax.scan``. Prompts are **left-padded** to one length P: every row's
newest token then sits in the same cache column (P + step), so a decode step writes the whole
batch with one ``dynamic_update_slice`` and reads every row's next-token logits from one column.
Each row's RoPE positions count from its first real token (column - pad), and its pad columns are
masked out of attention (weight exactly 0), so a row decodes as it would alone.

Shapes are bucketed (powers of two): the batch, the prompt length P, the cache length T and the
stop-sequence table. A new prompt length inside a bucket reuses the compiled functions (the jit
caches are module-level, keyed on the shapes and the static ModelConfig). ``TRACES`` counts how
often each function was traced (tests pin that a second bucket-mate does not retrace).

Sampling: temperature 0 is greedy (argmax); otherwise the logits are divided by the temperature,
cut to the nucleus (the most likely tokens whose probability mass before them is < top_p; the
first always stays, and tokens tied with the last kept one stay too), and sampled. Each row draws
from its own key (seed, row index, step), so a row's samples do not depend on the other rows'
state. Temperature and top_p are traced values: changing them does not recompile.

Stop sequences are token-id sequences matched on the generated tokens (not on the prompt); a row
stops at the first one it completes (the longest, when several end on the same token), and what
``generate`` returns excludes it. Rows also stop after ``max_new_tokens``.

MoE: the router runs per token and the single-device ``moe_mlp`` path is dropless (moe_local with
no capacity), so routing a 1-token step routes each token exactly as the full forward does. The
balancing statistic is a training quantity and is not computed (``balancing="none"``: routing
reads ``router_bias`` either way), as in evaluation/scoring.py.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import Counter
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from marin_assets.model.compute import dtype_of, for_compute
from marin_assets.model.config import DEFAULT_DTYPE, ModelConfig
from marin_assets.model.layers import attend, project_qkv, rms_norm, swiglu, window_array
from marin_assets.model.moe import moe_mlp

# How many times each jitted function was traced (a retrace = a compile): "prefill", "decode".
TRACES: Counter = Counter()
# Decode steps per device call: between calls the host updates progress and stops early once every
# row has stopped; a larger chunk only saves host round trips (one per chunk).
CHUNK_STEPS = 32
_MIN_LENGTH_BUCKET = 8
_NO_TOKEN = -1  # fills the stop-matching window before any token exists (never a token id)
_ANY = -2  # left-pads shorter stop sequences in their table: matches anything


def bucket(n: int, minimum: int = 1) -> int:
    """The smallest power of two >= max(n, minimum): the shape n is compiled at."""
    return 1 << (max(n, minimum) - 1).bit_length()


def _layers(
    params: dict,
    router_bias: jax.Array,
    tokens: jax.Array,
    pad: jax.Array,
    cache: dict,
    start: jax.Array,
    config: ModelConfig,
    dtype,
) -> tuple[jax.Array, dict]:
    """tokens [B, S] in cache columns start..start+S-1 of left-padded rows (``pad`` [B] columns of
    padding each) -> (next-token logits [B, V] float32 from the last column, the cache with their
    keys and values written)."""
    S, T = tokens.shape[1], cache["k"].shape[2]
    columns = start + jnp.arange(S)
    positions = jnp.maximum(columns[None, :] - pad[:, None], 0)  # [B, S]: each row counts from its first token
    keys = jnp.arange(T)
    # [B, 1, 1, S, T]: causal, and never a pad column (a pad query sees none: its output is unused)
    mask = ((keys[None, None, :] <= columns[None, :, None]) & (keys[None, None, :] >= pad[:, None, None]))[:, None, None]

    # each layer's window (GLOBAL: none), in column distance: a row's columns and positions differ by its pad
    windows = window_array(config)
    distance = columns[:, None] - keys[None, :]  # [S, T]

    def layer(x, inputs):
        p, bias, k_cache, v_cache, window = inputs
        p = for_compute(p, dtype)
        q, k, v = project_qkv(p, rms_norm(x, p["attn_norm"], config.norm_eps), config, positions)
        k_all = jax.lax.dynamic_update_slice(k_cache, k.astype(k_cache.dtype), (0, start, 0, 0))
        v_all = jax.lax.dynamic_update_slice(v_cache, v.astype(v_cache.dtype), (0, start, 0, 0))
        x = x + attend(p, q, k_all, v_all, mask & (distance < window), config)
        h = rms_norm(x, p["mlp_norm"], config.norm_eps)
        y = moe_mlp(p, h, config, bias)[0] if config.is_moe else swiglu(h, p["w_gate"], p["w_up"], p["w_down"])
        return x + y, (k, v)

    x = params["embed"][tokens].astype(dtype)
    bias = router_bias if config.is_moe else jnp.zeros((config.n_layers, 0), jnp.float32)
    x, (k_new, v_new) = jax.lax.scan(layer, x, (params["layers"], bias, cache["k"], cache["v"], windows))
    # Only this step's keys and values leave the scan; one write puts every layer's into the cache.
    cache = {
        name: jax.lax.dynamic_update_slice(cache[name], new.astype(cache[name].dtype), (0, 0, start, 0, 0))
        for name, new in (("k", k_new), ("v", v_new))
    }
    x = rms_norm(x[:, -1], params["final_norm"], config.norm_eps)
    return jnp.matmul(x, params["lm_head"].astype(dtype), preferred_element_type=jnp.float32), cache


@functools.partial(jax.jit, static_argnames=("config", "compute_dtype", "cache_len"))
def _prefill(params, router_bias, tokens, pad, *, config: ModelConfig, compute_dtype: str, cache_len: int):
    """Left-padded prompts [B, P] -> (next-token logits [B, V], cache of cache_len columns)."""
    TRACES["prefill"] += 1
    dtype = dtype_of(compute_dtype)
    B = tokens.shape[0]
    shape = (config.n_layers, B, cache_len, config.n_kv_heads, config.resolved_head_dim)
    cache = {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}
    return _layers(params, router_bias, tokens, pad, cache, jnp.int32(0), config, dtype)


def sample(logits: jax.Array, keys: jax.Array, temperature: jax.Array, top_p: jax.Array) -> jax.Array:
    """Next tokens [B] from logits [B, V]: argmax at temperature 0, else a draw from the top_p
    nucleus of softmax(logits / temperature), row b with keys[b]."""
    scaled = logits / jnp.maximum(temperature, 1e-6)
    ordered = jnp.sort(scaled, axis=-1)[:, ::-1]
    probs = jax.nn.softmax(ordered, axis=-1)
    kept = (jnp.cumsum(probs, axis=-1) - probs) < top_p  # mass before each token < top_p: the first always
    cutoff = jnp.min(jnp.where(kept, ordered, jnp.inf), axis=-1, keepdims=True)
    nucleus = jnp.where(scaled >= cutoff, scaled, -jnp.inf)
    drawn = jax.vmap(jax.random.categorical)(keys, nucleus)
    return jnp.where(temperature > 0, drawn, jnp.argmax(logits, axis=-1)).astype(jnp.int32)


def _stop_length(window: jax.Array, stops: jax.Array, stop_lengths: jax.Array) -> jax.Array:
    """[B]: the length of the longest stop sequence the generated tokens end with (0: none).
    window [B, W]: the last W generated tokens; stops [N, W] left-padded with _ANY."""
    ends = jnp.all((stops[None] == window[:, None]) | (stops[None] == _ANY), axis=-1)  # [B, N]
    return jnp.max(jnp.where(ends, stop_lengths[None], 0), axis=-1, initial=0)


@functools.partial(jax.jit, static_argnames=("config", "compute_dtype"), donate_argnames=("state",))
def _decode(
    params, router_bias, state: dict, until, temperature, top_p, stops, stop_lengths, *, config: ModelConfig, compute_dtype: str
) -> dict:
    """Emit tokens until ``state["step"] == until`` or every row has stopped. Each step samples from
    the pending logits, records the token (and a completed stop sequence), then runs it through
    the layers for the next logits."""
    TRACES["decode"] += 1
    dtype = dtype_of(compute_dtype)
    prompt_len = state["prompt_len"]

    def step(s):
        keys = jax.vmap(lambda row: jax.random.fold_in(jax.random.fold_in(s["key"], row), s["step"]))(
            jnp.arange(s["done"].shape[0])
        )
        token = sample(s["logits"], keys, temperature, top_p)
        out = jax.lax.dynamic_update_slice(s["out"], jnp.where(s["done"], 0, token)[:, None], (0, s["step"]))
        window = jnp.concatenate([s["window"][:, 1:], token[:, None]], axis=1)
        matched = _stop_length(window, stops, stop_lengths)
        stopping = ~s["done"] & (matched > 0)
        kept = jnp.where(stopping, s["step"] + 1 - matched, s["kept"])
        logits, cache = _layers(params, router_bias, token[:, None], s["pad"], s["cache"], prompt_len + s["step"], config, dtype)
        return s | {
            "logits": logits,
            "cache": cache,
            "out": out,
            "window": window,
            "kept": kept,
            "done": s["done"] | stopping,
            "step": s["step"] + 1,
        }

    return jax.lax.while_loop(lambda s: (s["step"] < until) & ~jnp.all(s["done"]), step, state)


class Generator:
    """``generate`` with the parameters placed on the device once, for many calls; the compiled
    functions are shared by every Generator of the same config (module-level jit caches)."""

    def __init__(self, params: dict, config: ModelConfig, router_bias, *, compute_dtype: str = DEFAULT_DTYPE):
        dtype_of(compute_dtype)
        self.config = dataclasses.replace(config, balancing="none")  # a training statistic: not computed
        self.compute_dtype = compute_dtype
        self.params, self.router_bias = jax.device_put((params, jnp.asarray(router_bias, jnp.float32)))

    def __call__(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop_sequences: Sequence[Sequence[int]] = (),
        seed: int = 0,
        on_progress: Callable[[int], object] | None = None,
    ) -> list[list[int]]:
        """New tokens per prompt (stop sequence excluded). ``on_progress(n)``: n more decode steps ran."""
        prompts, stop_sequences = _checked(self.config, prompts, max_new_tokens, temperature, top_p, stop_sequences, seed)
        if max_new_tokens == 0:
            return [[] for _ in prompts]
        tokens, pad = _left_padded(prompts)
        prompt_len = tokens.shape[1]
        cache_len = bucket(prompt_len + max_new_tokens)
        logits, cache = _prefill(
            self.params, self.router_bias, tokens, pad, config=self.config, compute_dtype=self.compute_dtype, cache_len=cache_len
        )
        stops, stop_lengths = _stop_table(stop_sequences)
        batch = tokens.shape[0]
        state = {
            "logits": logits,
            "cache": cache,
            "pad": jnp.asarray(pad),
            "prompt_len": jnp.int32(prompt_len),
            "out": jnp.zeros((batch, cache_len - prompt_len), jnp.int32),
            "window": jnp.full((batch, stops.shape[1]), _NO_TOKEN, jnp.int32),
            "kept": jnp.full((batch,), -1, jnp.int32),  # -1: no stop sequence yet
            "done": jnp.asarray(np.arange(batch) >= len(prompts)),  # bucket filler rows never run
            "step": jnp.int32(0),
            "key": jax.random.PRNGKey(seed),
        }
        temperature, top_p = jnp.float32(temperature), jnp.float32(top_p)
        steps = 0
        while steps < max_new_tokens:
            until = min(steps + CHUNK_STEPS, max_new_tokens)
            state = _decode(
                self.params,
                self.router_bias,
                state,
                jnp.int32(until),
                temperature,
                top_p,
                stops,
                stop_lengths,
                config=self.config,
                compute_dtype=self.compute_dtype,
            )
            done_now = int(state["step"])
            if on_progress is not None:
                on_progress(done_now - steps)
            steps = done_now
            if steps < until:  # every row stopped early
                break
        out, kept = np.asarray(state["out"]), np.asarray(state["kept"])
        return [out[row, : kept[row] if kept[row] >= 0 else steps].tolist() for row in range(len(prompts))]


def generate(
    params: dict,
    config: ModelConfig,
    router_bias,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    stop_sequences: Sequence[Sequence[int]] = (),
    seed: int = 0,
    compute_dtype: str = DEFAULT_DTYPE,
) -> list[list[int]]:
    """The new tokens of each prompt (its stop sequence excluded): see the module docstring."""
    return Generator(params, config, router_bias, compute_dtype=compute_dtype)(
        prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, stop_sequences=stop_sequences, seed=seed
    )


def _token_list(seq, what: str, vocab_size: int) -> list[int]:
    ids = list(seq)
    if not ids:
        raise ValueError(f"generate: {what} is empty")
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < vocab_size:
            raise ValueError(f"generate: {what} holds {i!r}, not a token id in [0, {vocab_size})")
    return [int(i) for i in ids]


def _checked(config: ModelConfig, prompts, max_new_tokens, temperature, top_p, stop_sequences, seed):
    """(prompts, stop sequences) as lists of int lists, or a ValueError naming the bad argument."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"generate: max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"generate: temperature must be a finite number >= 0, got {temperature!r}")
    if not (isinstance(top_p, (int, float)) and math.isfinite(top_p) and 0 < top_p <= 1):
        raise ValueError(f"generate: top_p must be in (0, 1], got {top_p!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ValueError(f"generate: seed must be an int in [0, 2**32), got {seed!r}")
    if not prompts:
        raise ValueError("generate: no prompts")
    prompts = [_token_list(p, f"prompt {i}", config.vocab_size) for i, p in enumerate(prompts)]
    for i, p in enumerate(prompts):
        if len(p) + max_new_tokens > config.max_seq_len:
            raise ValueError(
                f"generate: prompt {i} ({len(p)} tokens) + max_new_tokens {max_new_tokens} > the "
                f"model's max_seq_len {config.max_seq_len}"
            )
    stops = [_token_list(s, f"stop sequence {i}", config.vocab_size) for i, s in enumerate(stop_sequences)]
    return prompts, stops


def _left_padded(prompts: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(tokens [B', P'] int32 left-padded with 0, pad [B'] columns of padding per row): the batch
    and length rounded up to their buckets; filler rows are one-token prompts."""
    length = bucket(max(map(len, prompts)), _MIN_LENGTH_BUCKET)
    rows = [*prompts, *([[0]] * (bucket(len(prompts)) - len(prompts)))]
    tokens = np.zeros((len(rows), length), np.int32)
    for i, row in enumerate(rows):
        tokens[i, length - len(row) :] = row
    return tokens, np.asarray([length - len(row) for row in rows], np.int32)


def _stop_table(stops: list[list[int]]) -> tuple[jax.Array, jax.Array]:
    """(stops [N', W'] left-padded with _ANY, lengths [N']), both bucketed; no stop: a row of
    length 0, which never matches."""
    width = bucket(max((len(s) for s in stops), default=1))
    table = np.full((bucket(len(stops)), width), _ANY, np.int32)
    lengths = np.zeros(table.shape[0], np.int32)
    for i, s in enumerate(stops):
        table[i, width - len(s) :], lengths[i] = s, len(s)
    return jnp.asarray(table), jnp.asarray(lengths)
