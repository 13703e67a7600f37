"""Causal self-attention through the field's kernels, with document masking and sliding windows.

One function, ``causal_attention(q, k, v, ...)``, five implementations of the same math:

``"reference"``  the naive path: the full [B, KV, G, S, S] score tensor in fp32, masked, softmaxed.
    Memory grows with S^2 (one 65K-token head is 16 GiB of scores). Kept as the reference.
``"blockwise"``  flash-style in plain XLA: a scan over query blocks, each a loop over the key blocks it
    may see (causal and window bounds: about half of them causally, a few under a window) with an
    online softmax (running max and sum in fp32), and a custom VJP that keeps only q, k, v, the output
    and the per-row log-sum-exp, recomputing each block's probabilities in the backward (a scan over
    key blocks, each a loop over the query blocks that may see it). Memory is linear in S (one
    [B, H, block, block] block of scores at a time), on any backend.
``"xla"`` / ``"cudnn"``  ``jax.nn.dot_product_attention``; ``"cudnn"`` is cuDNN's fused flash attention
    on NVIDIA GPUs (bf16/fp16 only).
``"splash"``  Pallas splash attention, the TPU kernel (``interpret=True`` runs it anywhere, slowly).

``"auto"`` picks cuDNN on a GPU for 16-bit inputs, splash on TPU, and on CPU the reference up to
``REFERENCE_MAX_SEQ`` tokens (faster there at short length, and the numerics every earlier run used)
and blockwise beyond. Every implementation gives the reference's outputs and gradients to fp32
rounding (tests/kernels/test_attention.py).

Masks: always causal; ``segment_ids`` [B, S] (packed documents: a query sees keys of its own
segment only); ``window`` w (a query at position i sees keys i-w+1..i; None = global). The window
may be a traced int32 scalar for the reference and blockwise paths (a per-layer pattern scanned
over layers); the library kernels need a static one, so the model switches between two static
variants there (``model/layers.attention``).
Shapes: q [B, S, H, hd], k and v [B, S, KV, hd] with H a multiple of KV (grouped-query); out [B, S, H, hd].
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, Literal, cast

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from kernels.choices import ATTENTION_IMPLS as IMPLS

REFERENCE_MAX_SEQ = 1024  # "auto" on CPU: the naive path up to here, blockwise beyond
DEFAULT_BLOCK = 512  # keys per block of the blockwise path
_NEG = float(jnp.finfo(jnp.float32).min)  # a masked logit: finite, so max/exp never see inf - inf


def resolve_impl(impl: str, seq_len: int, dtype) -> str:
    """``"auto"`` -> the implementation for the default backend, this length and this dtype."""
    if impl not in IMPLS:
        raise ValueError(f"attention impl must be one of {IMPLS}, got {impl!r}")
    if impl != "auto":
        return impl
    backend = jax.default_backend()
    if backend == "gpu" and jnp.dtype(dtype).itemsize == 2:
        return "cudnn"
    if backend == "tpu":
        return "splash"
    return "reference" if seq_len <= REFERENCE_MAX_SEQ else "blockwise"


def causal_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    segment_ids: jax.Array | None = None,
    window=None,
    impl: str = "auto",
    block: int = DEFAULT_BLOCK,
) -> jax.Array:
    """Causal grouped-query attention of q [B, S, H, hd] over k, v [B, S, KV, hd] -> [B, S, H, hd]."""
    B, S, H, hd = q.shape
    if k.shape != v.shape or k.shape[:2] != (B, S) or H % k.shape[2] or k.shape[3] != hd:
        raise ValueError(f"attention: q {q.shape} and k/v {k.shape}/{v.shape} do not fit (B, S, H|KV, hd)")
    if segment_ids is not None and segment_ids.shape != (B, S):
        raise ValueError(f"attention: segment_ids must be [batch, seq] = {(B, S)}, got {segment_ids.shape}")
    impl = resolve_impl(impl, S, q.dtype)
    if impl == "reference":
        return reference(q, k, v, segment_ids, window)
    if impl == "blockwise":
        return blockwise(q, k, v, segment_ids, window, block)
    if not (window is None or isinstance(window, int)):
        raise ValueError(f"attention impl {impl!r} needs a static window (an int or None), got {window!r}")
    if impl == "splash":
        return splash(q, k, v, segment_ids, window)
    return library(q, k, v, segment_ids, window, cast(Literal["xla", "cudnn"], impl))


def allowed(q_pos: jax.Array, k_pos: jax.Array, q_seg, k_seg, window) -> jax.Array:
    """[B or 1, 1, 1, Q, K] True where a query at q_pos [Q] may attend a key at k_pos [K]."""
    ok = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        ok = ok & (q_pos[:, None] - k_pos[None, :] < window)
    ok = ok[None]
    if q_seg is not None:
        ok = ok & (q_seg[:, :, None] == k_seg[:, None, :])
    return ok[:, None, None]


def _grouped(q: jax.Array, kv_heads: int) -> jax.Array:
    """q [B, S, H, hd] -> [B, KV, G, S, hd]: the query heads that share each key head, together."""
    B, S, H, hd = q.shape
    return q.reshape(B, S, kv_heads, H // kv_heads, hd).transpose(0, 2, 3, 1, 4)


def _ungrouped(out: jax.Array) -> jax.Array:
    """[B, KV, G, S, hd] -> [B, S, H, hd]."""
    B, KV, G, S, hd = out.shape
    return out.transpose(0, 3, 1, 2, 4).reshape(B, S, KV * G, hd)


def masked(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """The naive path under any mask: q [B, Q, H, hd] over k, v [B, K, KV, hd] where ``mask`` (True = may
    attend; broadcast to [B, KV, H/KV, Q, K]) allows -> [B, Q, H, hd]. Every score at once, softmax in fp32
    whatever the compute dtype (bf16 keeps ~3 significant digits, too few for exp() of logits in the tens;
    the einsum accumulates and returns fp32 from bf16 q and k). Decoding against a KV cache uses it too."""
    B, Q, H, hd = q.shape
    KV = k.shape[2]
    qg = q.reshape(B, Q, KV, H // KV, hd)
    scores = jnp.einsum("bqkgd,bskd->bkgqs", qg, k, preferred_element_type=jnp.float32) / jnp.sqrt(hd)
    scores = jnp.where(mask, scores, _NEG)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bkgqs,bskd->bqkgd", probs, v).reshape(B, Q, H, hd)


def reference(q, k, v, segment_ids=None, window=None, *, q_offset=0, k_segment_ids=None) -> jax.Array:
    """The naive path: the full [B, KV, G, Sq, Sk] scores of causal (document, window) attention; the
    queries may be a chunk at positions q_offset.. of the keys' sequence, as in ``blockwise``."""
    k_ids = segment_ids if k_segment_ids is None else k_segment_ids
    q_pos = q_offset + jnp.arange(q.shape[1])
    return masked(q, k, v, allowed(q_pos, jnp.arange(k.shape[1]), segment_ids, k_ids, window))


def blockwise(q, k, v, segment_ids=None, window=None, block: int = DEFAULT_BLOCK, *, q_offset=0, k_segment_ids=None) -> jax.Array:
    """Flash-style attention in XLA, memory linear in S (see the module doc). The queries may be a chunk
    of the keys' sequence (context parallelism): q [B, Sq, ...] at positions q_offset.. of k, v [B, Sk, ...];
    ``segment_ids`` are then the queries' and ``k_segment_ids`` the keys' (default: the same)."""
    B, Sq, H, hd = q.shape
    Sk, KV = k.shape[1], k.shape[2]
    block = min(block, Sk)
    pad = -Sk % block  # padded keys sit at positions >= Sk: the causal mask hides them from every query
    seg = jnp.zeros((B, Sq), jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)
    if k_segment_ids is not None:
        k_ids = k_segment_ids.astype(jnp.int32)
    else:  # the queries' own ids (the whole sequence), or none: one document of Sk keys (a chunk's queries are fewer)
        k_ids = seg if segment_ids is not None else jnp.zeros((B, Sk), jnp.int32)
    k_seg = jnp.pad(k_ids, ((0, 0), (0, pad)), constant_values=-1)
    kb, vb = (jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))) for x in (k, v))
    # [n_blocks, B, KV, block, hd]: the scan walks the leading axis
    kb, vb = (x.reshape(B, -1, block, KV, hd).transpose(1, 0, 3, 2, 4) for x in (kb, vb))
    k_seg = k_seg.reshape(B, -1, block).transpose(1, 0, 2)
    has_window = window is not None
    w = jnp.stack([jnp.asarray(window if has_window else 0, jnp.int32), jnp.asarray(q_offset, jnp.int32)])
    qg = _grouped(q, KV)
    if jax.default_backend() == "cpu":
        # XLA:CPU has no bf16 x bf16 -> f32 dot inside a loop ("Unsupported element type for DotThunk").
        # A bf16 product is exact in fp32, so fp32 operands compute the same sums.
        qg, kb, vb = (x.astype(jnp.float32) for x in (qg, kb, vb))
    out = _flash(qg, kb, vb, seg, k_seg, w, has_window, segment_ids is not None)
    return _ungrouped(out).astype(q.dtype)


def _block_mask(j, block, S, q_seg, k_seg_j, w, has_window, has_segments):
    """w: int32 [window, position of the first query] (the queries may be a chunk of the sequence)."""
    q_pos, k_pos = w[1] + jnp.arange(S), j * block + jnp.arange(block)
    return allowed(q_pos, k_pos, q_seg if has_segments else None, k_seg_j if has_segments else None, w[0] if has_window else None)


def _block_scores(q, k_j, scale):
    return jnp.einsum("bkgqd,bkcd->bkgqc", q, k_j, preferred_element_type=jnp.float32) * scale


def _scores_and_mask(q, k_j, scale, j, block, S, q_seg, k_seg_j, w, has_window, has_segments) -> tuple[jax.Array, jax.Array]:
    """A block's scores and mask. The block's index goes through an optimization barrier with its keys:
    the mask depends on positions alone, and under an outer scan over layers the compiler would otherwise
    compute every block's mask up front, [n_blocks, S, block]: S x S memory again (measured on a one-layer
    scan at 8K: 837 MB of temporaries against 342 MB for the kernel alone)."""
    j, k_j = jax.lax.optimization_barrier((j, k_j))
    mask = _block_mask(j, block, S, q_seg, k_seg_j, w, has_window, has_segments)
    return _block_scores(q, k_j, scale), mask


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7))
def _flash(q, kb, vb, q_seg, k_seg, w, has_window, has_segments):
    return _flash_forward(q, kb, vb, q_seg, k_seg, w, has_window, has_segments)[0]


def _to_blocks(x: jax.Array, axis: int, size: int, fill=0) -> jax.Array:
    """`x` cut along `axis` into blocks of `size` (the last padded with `fill`), the block index leading."""
    x = jnp.pad(x, [(0, -x.shape[axis] % size if a == axis else 0) for a in range(x.ndim)], constant_values=fill)
    x = x.reshape(*x.shape[:axis], -1, size, *x.shape[axis + 1 :])
    return jnp.moveaxis(x, axis, 0)


def _from_blocks(x: jax.Array, axis: int, length: int) -> jax.Array:
    """The inverse of ``_to_blocks`` (the padding cut off)."""
    x = jnp.moveaxis(x, 0, axis)
    x = x.reshape(*x.shape[:axis], -1, *x.shape[axis + 2 :])
    return jax.lax.slice_in_dim(x, 0, length, axis=axis)


_WIDEST = 1 << 30  # a window at least this wide masks nothing here; capped so the bounds stay in int32


def _key_blocks_seen(i, q_block, k_block, n_k, w, has_window):
    """[lo, hi) of the key blocks that query block i may see; the others are wholly masked (keys after
    its last query, or before the window of its first). The blocks in range are still masked inside."""
    first = w[1] + i * q_block
    hi = jnp.minimum(n_k, (first + q_block - 1) // k_block + 1)
    lo = jnp.maximum(0, (first - jnp.minimum(w[0], _WIDEST) + 1) // k_block) if has_window else jnp.int32(0)
    return lo, hi


def _query_blocks_seeing(j, q_block, k_block, n_q, w, has_window):
    """[lo, hi) of the query blocks that may see key block j (the converse of ``_key_blocks_seen``)."""
    lo = jnp.clip((j * k_block - w[1]) // q_block, 0, n_q)
    reach = (j + 1) * k_block + jnp.minimum(w[0], _WIDEST) - 2 - w[1]  # the last query position that sees block j
    hi = jnp.clip(reach // q_block + 1, 0, n_q) if has_window else jnp.int32(n_q)
    return lo, hi


def _flash_forward(q, kb, vb, q_seg, k_seg, w, has_window, has_segments):
    """q [B, KV, G, S, hd]; kb, vb [n, B, KV, block, hd] -> (out [B, KV, G, S, hd] in q's dtype, accumulated
    in fp32; the fp32 log-sum-exp of each query's scores [B, KV, G, S]).

    The queries go a block at a time too, and each visits only the key blocks it may see
    (``_key_blocks_seen``): causal attention skips about half the blocks, a window all but a few."""
    S, hd = q.shape[3], q.shape[4]
    n_k, block, scale = kb.shape[0], kb.shape[3], 1.0 / jnp.sqrt(hd).astype(jnp.float32)
    q_block = min(block, S)
    # Padded queries belong to no document (-2): they see nothing, and their rows are cut off.
    qb, q_segb = _to_blocks(q, 3, q_block), _to_blocks(q_seg, 1, q_block, fill=-2)

    def query_block(_, inputs):
        i, q_i, seg_i = inputs
        w_i = w.at[1].add(i * q_block)  # the block's first query position

        def step(j, carry):
            m, total, acc = carry
            k_j, v_j, k_seg_j = kb[j], vb[j], k_seg[j]
            s, mask = _scores_and_mask(q_i, k_j, scale, j, block, q_block, seg_i, k_seg_j, w_i, has_window, has_segments)
            s = jnp.where(mask, s, _NEG)
            m_new = jnp.maximum(m, s.max(-1))
            p = jnp.where(mask, jnp.exp(s - m_new[..., None]), 0.0)
            correction = jnp.exp(m - m_new)
            total = total * correction + p.sum(-1)
            pv = jnp.einsum("bkgqc,bkcd->bkgqd", p.astype(v_j.dtype), v_j, preferred_element_type=jnp.float32)
            return m_new, total, acc * correction[..., None] + pv

        rows = q_i.shape[:-1]
        init = (jnp.full(rows, _NEG, jnp.float32), jnp.zeros(rows, jnp.float32), jnp.zeros(q_i.shape, jnp.float32))
        lo, hi = _key_blocks_seen(i, q_block, block, n_k, w, has_window)
        m, total, acc = cast(tuple[jax.Array, jax.Array, jax.Array], jax.lax.fori_loop(lo, hi, step, init))
        # Every real query sees at least itself (causal), so total > 0; a padded one may see nothing.
        seen = total > 0
        total = jnp.where(seen, total, 1.0)
        out = jnp.where(seen[..., None], acc / total[..., None], 0.0)
        return None, (out.astype(q.dtype), jnp.where(seen, m + jnp.log(total), 0.0))

    _, (out, lse) = jax.lax.scan(query_block, None, (jnp.arange(qb.shape[0]), qb, q_segb))
    return _from_blocks(out, 3, S), _from_blocks(lse, 3, S)


def _flash_fwd(q, kb, vb, q_seg, k_seg, w, has_window, has_segments):
    out, lse = _flash_forward(q, kb, vb, q_seg, k_seg, w, has_window, has_segments)
    return out, (q, kb, vb, q_seg, k_seg, w, out, lse)


def _flash_bwd(has_window, has_segments, residuals, d_out):
    """FlashAttention's backward: per key block, over the query blocks that may see it (the same blocks
    the forward visited), p from the saved log-sum-exp, then dv and dk for the key block and dq for the
    query block."""
    q, kb, vb, q_seg, k_seg, w, out, lse = residuals
    S, hd = q.shape[3], q.shape[4]
    block, scale = kb.shape[3], 1.0 / jnp.sqrt(hd).astype(jnp.float32)
    q_block = min(block, S)
    d_out = d_out.astype(jnp.float32)
    delta = jnp.sum(d_out * out.astype(jnp.float32), axis=-1)  # [B, KV, G, S]: rowsum(dO * O)
    qb, dob = (_to_blocks(x, 3, q_block) for x in (q.astype(jnp.float32), d_out))
    lseb, deltab, q_segb = _to_blocks(lse, 3, q_block), _to_blocks(delta, 3, q_block), _to_blocks(q_seg, 1, q_block, fill=-2)
    n_q = qb.shape[0]

    def key_block(dq, inputs):
        j, k_j, v_j, k_seg_j = inputs
        k32, v32 = k_j.astype(jnp.float32), v_j.astype(jnp.float32)

        def step(i, carry):
            dq, dk_j, dv_j = carry
            q_i, do_i = qb[i], dob[i]
            w_i = w.at[1].add(i * q_block)
            s, mask = _scores_and_mask(q_i, k32, scale, j, block, q_block, q_segb[i], k_seg_j, w_i, has_window, has_segments)
            p = jnp.where(mask, jnp.exp(s - lseb[i][..., None]), 0.0)
            dv_j = dv_j + jnp.einsum("bkgqc,bkgqd->bkcd", p, do_i)
            dp = jnp.einsum("bkgqd,bkcd->bkgqc", do_i, v32)
            ds = p * (dp - deltab[i][..., None]) * scale
            dq = dq.at[i].add(jnp.einsum("bkgqc,bkcd->bkgqd", ds, k32))
            return dq, dk_j + jnp.einsum("bkgqc,bkgqd->bkcd", ds, q_i), dv_j

        zeros = jnp.zeros(k_j.shape, jnp.float32)
        lo, hi = _query_blocks_seeing(j, q_block, block, n_q, w, has_window)
        dq, dk_j, dv_j = jax.lax.fori_loop(lo, hi, step, (dq, zeros, zeros))
        return dq, (dk_j.astype(k_j.dtype), dv_j.astype(v_j.dtype))

    dq, (dk, dv) = jax.lax.scan(key_block, jnp.zeros(qb.shape, jnp.float32), (jnp.arange(kb.shape[0]), kb, vb, k_seg))
    return _from_blocks(dq, 3, S).astype(q.dtype), dk, dv, None, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


@dataclasses.dataclass(frozen=True)
class SequenceParallel:
    """Context parallelism: the sequence is split over ``axis`` of ``mesh`` (rows over ``batch_axes``); each
    device attends its chunk of queries over the whole sequence's keys and values, all-gathered along the
    axis (the backward reduce-scatters their gradients). Per device: S/P queries' activations and every key
    and value, so a context P times longer than one device's queries fits. Reference or blockwise kernel (the
    chunk's position offset is traced per device); document masking and windows as everywhere."""

    mesh: Any  # jax.sharding.Mesh
    axis: str = "sequence"
    batch_axes: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        return self.mesh.shape[self.axis]

    def __call__(self, q, k, v, segment_ids=None, window=None, impl: str = "blockwise", block: int = DEFAULT_BLOCK):
        """As ``causal_attention`` on global [B, S, ...] arrays, the sequence split over the axis."""
        if impl not in ("reference", "blockwise"):
            raise ValueError(f"context parallelism runs the reference or blockwise kernel, not {impl!r}")
        if q.shape[1] % self.size:
            raise ValueError(
                f"context parallelism: seq_len {q.shape[1]} does not split over the {self.size} devices "
                f"of mesh axis {self.axis!r}"
            )
        rows = self.batch_axes or None
        heads, ids = P(rows, self.axis, None, None), P(rows, self.axis)
        seg = jnp.zeros(q.shape[:2], jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)
        w = jnp.asarray(0 if window is None else window, jnp.int32)
        kernel = reference if impl == "reference" else functools.partial(blockwise, block=block)

        def local(q, k, v, seg, w):
            gather = functools.partial(jax.lax.all_gather, axis_name=self.axis, axis=1, tiled=True)
            offset = jax.lax.axis_index(self.axis) * q.shape[1]
            return kernel(
                q,
                gather(k),
                gather(v),
                None if segment_ids is None else seg,
                None if window is None else w,
                q_offset=offset,
                k_segment_ids=None if segment_ids is None else gather(seg),
            )

        fn = jax.shard_map(local, mesh=self.mesh, in_specs=(heads, heads, heads, ids, P()), out_specs=heads, check_vma=False)
        return cast(Callable[..., jax.Array], fn)(q, k, v, seg, w)


def library(q, k, v, segment_ids, window: int | None, impl: Literal["xla", "cudnn"]) -> jax.Array:
    """``jax.nn.dot_product_attention`` (XLA, or cuDNN flash attention on NVIDIA GPUs). Documents are
    masked with a [B, 1, S, S] boolean mask (cuDNN fuses it; the jax 0.7 API has no segment ids)."""
    mask = None
    if segment_ids is not None:
        mask = (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]
    local = None if window is None else (window - 1, 0)
    return jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=True, local_window_size=local, implementation=impl)


def splash(q, k, v, segment_ids, window: int | None, interpret: bool | None = None) -> jax.Array:
    """Pallas splash attention (TPU): one MQA kernel per key head over its group of query heads,
    vmapped over the batch. ``interpret`` (default: off TPU) runs the kernel in Pallas's interpreter."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash_kernel
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_mask

    B, S, H, hd = q.shape
    KV = k.shape[2]
    G = H // KV
    interpret = jax.default_backend() != "tpu" if interpret is None else interpret
    head = splash_mask.CausalMask((S, S)) if window is None else splash_mask.LocalMask((S, S), (window - 1, 0), 0)
    block = min(512, S)
    sizes = splash_kernel.BlockSizes(
        block_q=block,
        block_kv=block,
        block_kv_compute=block,
        block_q_dkv=block,
        block_kv_dkv=block,
        block_kv_dkv_compute=block,
        block_q_dq=block,
        block_kv_dq=block,
    )
    kernel = splash_kernel.make_splash_mqa_single_device(
        splash_mask.MultiHeadMask([head] * G), block_sizes=sizes, interpret=interpret
    )
    qg = _grouped(q * (1.0 / hd**0.5), KV)  # splash applies no scale: [B, KV, G, S, hd]
    kt, vt = (x.transpose(0, 2, 1, 3) for x in (k, v))  # [B, KV, S, hd]

    def one(q_kv, k_kv, v_kv, seg):  # [G, S, hd], [S, hd], [S, hd], [S]
        ids = None if seg is None else splash_kernel.SegmentIds(q=seg, kv=seg)
        return cast(jax.Array, kernel(q_kv, k_kv, v_kv, segment_ids=ids))  # the output alone (no residuals asked)

    per_head = jax.vmap(one, in_axes=(0, 0, 0, None))  # over key heads
    seg = None if segment_ids is None else segment_ids.astype(jnp.int32)
    out = jax.vmap(per_head, in_axes=(0, 0, 0, None if seg is None else 0))(qg, kt, vt, seg)
    return _ungrouped(out).astype(q.dtype)
