"""Every attention implementation equals the naive reference, forward and gradients, under causal,
document and sliding-window masks; the blockwise path keeps its statistics in fp32 and its memory
linear in the sequence length."""

import functools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import attention as A

# float32, the same sums in another order (online softmax, blocked): a few ulps of O(1) values.
TOL = 1e-5
B, S, H, KV, HD = 2, 256, 4, 2, 16


def _qkv(seed=0, S=S, dtype=jnp.float32):
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    q = jax.random.normal(keys[0], (B, S, H, HD), dtype)
    k, v = (jax.random.normal(key, (B, S, KV, HD), dtype) for key in keys[1:3])
    return q, k, v, jax.random.normal(keys[3], (B, S, H, HD))


def _segments(S=S):
    """Row 0: three documents (100, 56, 100 tokens); row 1: one."""
    return jnp.asarray(np.stack([np.repeat([0, 1, 2], [100, 56, S - 156]), np.zeros(S, int)]), jnp.int32)


def _value_and_grads(impl, q, k, v, cotangent, segment_ids, window, **kw):
    def f(q, k, v):
        out = A.causal_attention(q, k, v, segment_ids=segment_ids, window=window, impl=impl, **kw)
        return jnp.sum(out * cotangent), out

    (_, out), grads = jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True)(q, k, v)
    return out, grads


def _assert_same(got, ref):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=TOL, rtol=TOL)


@pytest.mark.parametrize("documents", [False, True])
@pytest.mark.parametrize("window", [None, 37])
@pytest.mark.parametrize("impl, kw", [("blockwise", {"block": 64}), ("blockwise", {"block": 100}), ("xla", {})])
def test_matches_reference_forward_and_grads(impl, kw, window, documents):
    q, k, v, cot = _qkv()
    seg = _segments() if documents else None
    ref = _value_and_grads("reference", q, k, v, cot, seg, window)
    _assert_same(_value_and_grads(impl, q, k, v, cot, seg, window, **kw), ref)


@pytest.mark.parametrize("window", [None, 37])
def test_splash_kernel_matches_reference(window):
    """Pallas splash attention (the TPU kernel) in the Pallas interpreter, documents masked."""
    q, k, v, cot = _qkv(seed=1)
    seg = _segments()
    ref = _value_and_grads("reference", q, k, v, cot, seg, window)
    _assert_same(_value_and_grads("splash", q, k, v, cot, seg, window), ref)


def test_masks_mean_what_they_say():
    """A query's output is a mix of the values it may see only: a document's first token sees itself
    alone (output = its value), and a window of 1 is the same everywhere."""
    q, k, v, _ = _qkv()
    seg = _segments()
    for impl in ("reference", "blockwise"):
        out = A.causal_attention(q, k, v, segment_ids=seg, impl=impl, block=64)
        for start in (0, 100, 156):  # row 0's documents
            np.testing.assert_allclose(out[0, start], jnp.repeat(v[0, start], H // KV, axis=0), atol=TOL)
        alone = A.causal_attention(q, k, v, window=1, impl=impl, block=64)
        np.testing.assert_allclose(alone, jnp.repeat(v, H // KV, axis=2), atol=TOL)


@pytest.mark.parametrize("window, static", [(37, 37), (2**31 - 1, None)])
def test_traced_window_equals_static(window, static):
    """A per-layer pattern hands the window in as a traced int32 (scanned over layers), a global layer's
    as the largest int32 (model.layers.GLOBAL): forward and gradients as the static window's."""
    q, k, v, cot = _qkv()
    seg = _segments()
    ref = _value_and_grads("blockwise", q, k, v, cot, seg, static, block=64)
    traced = jax.jit(lambda w: _value_and_grads("blockwise", q, k, v, cot, seg, w, block=64))(jnp.int32(window))
    _assert_same(traced, ref)


def test_blockwise_visits_only_the_blocks_a_query_may_see():
    """NaN values in key blocks no query of a block may see (later keys; keys before a window) leave
    that block's outputs finite and equal to the reference: the blocks are skipped, not masked (a
    visited block would multiply its NaN values by zero probabilities: NaN)."""
    q, k, v, _ = _qkv()
    later = v.at[:, 128:].set(jnp.nan)
    causal = A.causal_attention(q, k, later, impl="blockwise", block=64)
    np.testing.assert_allclose(causal[:, :128], A.causal_attention(q, k, v, impl="reference")[:, :128], atol=TOL)
    earlier = v.at[:, :64].set(jnp.nan)  # with window 37, queries from 128 on see keys from 92 on
    windowed = A.causal_attention(q, k, earlier, window=37, impl="blockwise", block=64)
    np.testing.assert_allclose(windowed[:, 128:], A.causal_attention(q, k, v, window=37, impl="reference")[:, 128:], atol=TOL)
    assert np.isnan(np.asarray(windowed[:, 64:128])).any()  # the block that may see them does visit them


@pytest.mark.parametrize("window", [None, 37])
def test_a_chunk_of_queries_without_documents_equals_the_reference(window):
    """Context parallelism hands a device its chunk of queries (q_offset) over every key; without
    document masking there are no segment ids at all (the blockwise path once took the chunk's
    placeholder ids for the keys' and failed to reshape them)."""
    q, k, v, cot = _qkv()
    chunk = slice(96, 160)

    def attend(kernel):
        def f(q_chunk, k, v):
            out = kernel(q_chunk, k, v, None, window, q_offset=chunk.start)
            return jnp.sum(out * cot[:, chunk]), out

        (_, out), grads = jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True)(q[:, chunk], k, v)
        return out, grads

    _assert_same(attend(functools.partial(A.blockwise, block=64)), attend(A.reference))


def test_bf16_statistics_stay_fp32():
    """Under bf16 inputs the blockwise path's softmax statistics are fp32 and its output stays within
    bf16 rounding of the fp32 reference."""
    q, k, v, _ = _qkv()
    kb = k.reshape(B, 1, S, KV, HD).transpose(1, 0, 3, 2, 4)
    forward = functools.partial(A._flash_forward, has_window=False, has_segments=False)
    out, lse = jax.eval_shape(
        forward,
        A._grouped(q.astype(jnp.bfloat16), KV),
        kb.astype(jnp.bfloat16),
        kb.astype(jnp.bfloat16),
        jnp.zeros((B, S), jnp.int32),
        jnp.zeros((1, B, S), jnp.int32),
        jnp.zeros(2, jnp.int32),
    )
    assert out.dtype == jnp.bfloat16 and lse.dtype == jnp.float32
    got = jax.jit(lambda q, k, v: A.causal_attention(q, k, v, impl="blockwise", block=64))(
        *(x.astype(jnp.bfloat16) for x in (q, k, v))
    )
    ref = A.causal_attention(q, k, v, impl="reference")
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(got, np.float32), ref, atol=3e-2)


def _temp_bytes(impl: str, seq: int) -> int:
    q, k, v, _ = (jax.ShapeDtypeStruct(x.shape[:1] + (seq,) + x.shape[2:], x.dtype) for x in _qkv(S=8))

    def loss(q, k, v):
        return jnp.sum(A.causal_attention(q, k, v, impl=impl, block=128))

    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, v).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_blockwise_memory_grows_linearly():
    """Compiled gradient temporaries, 512 -> 2048 tokens: the reference's S x S scores grow ~16x, the
    blockwise path's about 4x (the benchmark measures 2K-32K)."""
    ref_growth = _temp_bytes("reference", 2048) / _temp_bytes("reference", 512)
    blockwise_growth = _temp_bytes("blockwise", 2048) / _temp_bytes("blockwise", 512)
    assert ref_growth > 10
    assert blockwise_growth < 5
    assert _temp_bytes("reference", 2048) > 4 * _temp_bytes("blockwise", 2048)


def test_auto_picks_per_backend_and_length():
    assert A.resolve_impl("auto", A.REFERENCE_MAX_SEQ, jnp.float32) == "reference"  # on CPU
    assert A.resolve_impl("auto", A.REFERENCE_MAX_SEQ + 1, jnp.bfloat16) == "blockwise"
    assert A.resolve_impl("xla", 8, jnp.float32) == "xla"
    with pytest.raises(ValueError, match="attention impl must be one of"):
        A.resolve_impl("flash", 8, jnp.float32)


def test_bad_shapes_are_named():
    q, k, v, _ = _qkv()
    with pytest.raises(ValueError, match="do not fit"):
        A.causal_attention(q, k[:, :10], v[:, :10])
    with pytest.raises(ValueError, match="segment_ids must be"):
        A.causal_attention(q, k, v, segment_ids=jnp.zeros((B, 3), jnp.int32))
    with pytest.raises(ValueError, match="static window"):
        jax.jit(lambda w: A.causal_attention(q, k, v, window=w, impl="xla"))(jnp.int32(4))


@pytest.mark.slow
def test_a_1x4_sequence_split_equals_one_device():
    """Context parallelism at S = 4096 on 4 host devices (a subprocess, context_parallel_check.py), documents
    masked: the kernel's outputs and gradients, and a model's loss and gradients (document-wise RoPE, a
    window on one layer of two), within 1e-5 of one device (relative past magnitude 1)."""
    script = Path(__file__).with_name("context_parallel_check.py")
    root = script.parents[2]
    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=root,
        env=dict(os.environ, PYTHONPATH=str(root)),
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    report = json.loads(out.stdout)
    assert (report["devices"], report["split"]) == (4, 4)
    for name in ("kernel_window_300", "model_loss", "model_grads"):
        assert report[name] <= 1e-5, (name, report)
    assert math.isfinite(report["loss"]) and report["loss"] > 0
