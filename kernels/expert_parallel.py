"""Expert parallelism with ``shard_map`` over an ``expert`` mesh axis.

Tokens and experts are both sharded over the axis: device i holds T/P tokens and experts
[i*E/P, (i+1)*E/P). Each assignment (token, slot) travels to the device owning its
expert, is processed there by a grouped matmul, and comes back to be combined.

Two transports:

``"ragged"``  Counts first: every device learns the full [src, dst] count matrix
    (all_gather), the receiver capacity ``ceil(cf_recv * A)`` (A = assignments per
    device) is shared round-robin across sources, and exactly the accepted rows are sent.
    Only the receiver capacity binds. XLA:CPU has no ``ragged-all-to-all`` op, so the
    row exchange is a dense all_to_all of per-destination blocks padded to the
    largest possible block, then compacted on arrival; the semantics (what is accepted,
    what drops) are those of a ragged exchange.

``"pooled"``  The fixed pooled-wave all-to-all: no counts or metadata are exchanged.
    Each sender fills one fixed pool per destination device (``ceil(cf_send * A / P)``
    rows; overflow drops at the sender) with the local expert id packed into the payload
    (bit-cast into extra columns). The pool travels in ``waves`` all_to_alls of identical
    shape. The receiver accepts up to ``ceil(cf_recv * A)`` rows, round-robin across
    sources (row 0 of every source, then row 1, ...), and drops the rest.

Dropped assignments contribute zero to their token's output and are counted (exactly,
summed over devices), by the side whose limit dropped them (``with_drop_kinds``): ``pooled``
drops at the sender (pool overflow) and at the receiver (past its capacity); ``ragged`` has
no sender limit, so its sender count is always 0 and every drop is a receiver-capacity drop
(applied before sending, since the counts are exchanged first).

On a mesh with more axes (``("data", "expert")`` in training) pass ``token_axes``: the
tokens are sharded over all of them, the experts over ``axis`` only (replicated over the
others), and each group of devices that shares the other coordinates runs its own
exchange over ``axis``. shard_map's transpose sums the expert-weight gradients over the
axes they are replicated on (``check_vma=False`` psums unmentioned axes).
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P

from kernels.dispatch import position_in_group
from kernels.grouped_matmul import IMPLS, expert_swiglu

TRANSPORTS = ("ragged", "pooled")


def round_robin_counts(counts: jax.Array, capacity: int) -> jax.Array:
    """How many rows of each source a receiver with ``capacity`` slots accepts.

    Rows are taken round-robin: row 0 of every source (in source order), then row 1, ...
    counts: [P] int -> accepted [P] int. Closed form: the largest level L with
    sum(min(counts, L)) <= capacity, then one extra row for the first sources above L.
    """
    counts = counts.astype(jnp.int32)
    filled = lambda level: jnp.sum(jnp.minimum(counts, level))

    def search(_, lo_hi):  # binary search for L in [0, max(counts)]
        lo, hi = lo_hi
        mid = (lo + hi + 1) // 2
        ok = filled(mid) <= capacity
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid - 1)

    level, _ = jax.lax.fori_loop(0, 32, search, (jnp.int32(0), jnp.max(counts)))
    left = capacity - filled(level)
    above = counts > level
    extra = above & (jnp.cumsum(above) <= left)
    return jnp.minimum(counts, level) + extra.astype(jnp.int32)


def _pack(rows: jax.Array, tags: jax.Array) -> jax.Array:
    """Append int32 tags to float rows by bit-casting them into extra columns."""
    bits = jax.lax.bitcast_convert_type(tags.astype(jnp.int32), rows.dtype)
    bits = bits.reshape(tags.shape + (-1,))
    return jnp.concatenate([rows, bits], axis=-1)


def _unpack(payload: jax.Array, width: int) -> tuple[jax.Array, jax.Array]:
    rows, bits = payload[..., :width], payload[..., width:]
    if bits.shape[-1] == 1:
        bits = bits[..., 0]
    return rows, jax.lax.bitcast_convert_type(bits, jnp.int32)


def _local_experts(rows, local_ids, n_local, w_gate, w_up, w_down, impl="auto"):
    """Grouped SwiGLU on unsorted rows; local_ids == n_local marks rows to skip (zeros)."""
    order = jnp.argsort(local_ids, stable=True)
    sizes = jnp.bincount(local_ids, length=n_local + 1)[:n_local]
    out_sorted = expert_swiglu(rows[order], w_gate, w_up, w_down, sizes, impl)
    return jnp.zeros_like(out_sorted).at[order].set(out_sorted)


def _exchange(blocks: jax.Array, axis: str, waves: int) -> jax.Array:
    """all_to_all over leading [P, rows, ...] blocks, in ``waves`` equal chunks of rows."""
    chunks = jnp.split(blocks, waves, axis=1)
    moved = [jax.lax.all_to_all(c, axis, 0, 0, tiled=True) for c in chunks]
    return jnp.concatenate(moved, axis=1)


@dataclasses.dataclass(frozen=True)
class ExpertParallel:
    """Callable routed-expert layer: (x, expert_ids, weights, w_gate, w_up, w_down) -> (out, dropped).

    x: [T, D]; expert_ids, weights: [T, k]; w_gate, w_up: [E, D, F]; w_down: [E, F, D].
    T must be divisible by the number of token shards, E by the axis size. ``dropped`` is
    the global count. ``token_axes``: the mesh axes the tokens are sharded over (None: just
    ``axis``); it must contain ``axis``.
    """

    mesh: Mesh
    axis: str = "expert"
    token_axes: tuple[str, ...] | None = None
    transport: str = "ragged"
    capacity_factor_send: float = 1.10
    capacity_factor_recv: float = 1.15
    waves: int = 3
    grouped_matmul: str = "auto"  # kernels.grouped_matmul.IMPLS

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise ValueError(f"ExpertParallel.transport must be one of {TRANSPORTS}, got {self.transport!r}")
        if self.axis not in self.mesh.shape:
            raise ValueError(f"ExpertParallel: mesh has no axis {self.axis!r} (axes: {tuple(self.mesh.shape)})")
        if self.waves < 1:
            raise ValueError(f"ExpertParallel.waves must be >= 1, got {self.waves}")
        if self.capacity_factor_send <= 0 or self.capacity_factor_recv <= 0:
            raise ValueError("ExpertParallel: capacity factors must be > 0")
        if self.grouped_matmul not in IMPLS:
            raise ValueError(f"ExpertParallel.grouped_matmul must be one of {IMPLS}, got {self.grouped_matmul!r}")
        tokens = self.tokens
        if self.axis not in tokens or any(a not in self.mesh.shape for a in tokens) or len(set(tokens)) != len(tokens):
            raise ValueError(f"ExpertParallel.token_axes {tokens} must be distinct axes of the mesh "
                             f"{tuple(self.mesh.shape)} and include {self.axis!r}")

    @property
    def size(self) -> int:
        return self.mesh.shape[self.axis]

    @property
    def tokens(self) -> tuple[str, ...]:
        return tuple(self.token_axes) if self.token_axes is not None else (self.axis,)

    @property
    def token_shards(self) -> int:
        return math.prod(self.mesh.shape[a] for a in self.tokens)

    def __call__(self, x, expert_ids, weights, w_gate, w_up, w_down):
        out, sender, receiver = self.with_drop_kinds(x, expert_ids, weights, w_gate, w_up, w_down)
        return out, sender + receiver

    def with_drop_kinds(self, x, expert_ids, weights, w_gate, w_up, w_down):
        """As ``__call__``, with the global drop count split: (out, dropped_sender, dropped_receiver)."""
        T, E = x.shape[0], w_gate.shape[0]
        if T % self.token_shards or E % self.size:
            raise ValueError(f"ExpertParallel: tokens ({T}) must be divisible by the {self.token_shards} "
                             f"token shards over {self.tokens} and experts ({E}) by the {self.axis!r} "
                             f"axis size ({self.size})")
        body = self._pooled if self.transport == "pooled" else self._ragged
        tok, exp = P(self.tokens), P(self.axis)
        fn = jax.shard_map(body, mesh=self.mesh, in_specs=(tok, tok, tok, exp, exp, exp),
                           out_specs=(tok, P(), P()), check_vma=False)
        return fn(x, expert_ids, weights, w_gate, w_up, w_down)

    def _total(self, count):
        """A per-device count summed over every token shard (replicated on the mesh)."""
        return jax.lax.psum(count.astype(jnp.int32), self.tokens)

    # -- per-device bodies (local shapes) -------------------------------------------------

    def _route(self, x, expert_ids, n_local):
        Tl, k = expert_ids.shape
        flat = expert_ids.reshape(-1)
        return flat // n_local, flat % n_local, x[jnp.arange(Tl * k) // k]

    def _combine(self, out_assign, weights):
        Tl, k = weights.shape
        out = out_assign.reshape(Tl, k, -1)
        return jnp.einsum("tkd,tk->td", out, weights.astype(out.dtype))

    def _pooled(self, x, expert_ids, weights, w_gate, w_up, w_down):
        Pn, El, D = self.size, w_gate.shape[0], x.shape[1]
        A = expert_ids.size
        pool = math.ceil(self.capacity_factor_send * A / Pn)
        pool = self.waves * math.ceil(pool / self.waves)  # waves of identical shape
        recv_cap = math.ceil(self.capacity_factor_recv * A)
        dest, local_e, rows = self._route(x, expert_ids, El)

        pos = position_in_group(dest, Pn)
        sent = pos < pool
        slot = jnp.where(sent, dest * pool + pos, Pn * pool)  # out of range: dropped
        buf = jnp.zeros((Pn * pool, D), x.dtype).at[slot].set(rows, mode="drop")
        tag = jnp.zeros((Pn * pool,), jnp.int32).at[slot].set(local_e + 1, mode="drop")
        recv = _exchange(_pack(buf, tag).reshape(Pn, pool, -1), self.axis, self.waves)
        r_rows, r_tag = _unpack(recv, D)  # [Pn(src), pool, D], [Pn, pool]

        # Pools are front-packed, so "row j of every source" order is round-robin.
        valid = r_tag > 0
        accepted = round_robin_counts(jnp.sum(valid, axis=1), recv_cap)
        accept = jnp.arange(pool)[None, :] < accepted[:, None]
        ids = jnp.where(accept, r_tag - 1, El).reshape(-1)
        out = _local_experts(r_rows.reshape(-1, D), ids, El, w_gate, w_up, w_down, self.grouped_matmul)
        back = _exchange(out.reshape(Pn, pool, D), self.axis, self.waves).reshape(-1, D)
        out_assign = jnp.take(back, slot, axis=0, mode="fill", fill_value=0)
        sender, receiver = A - jnp.sum(sent), jnp.sum(valid) - jnp.sum(accept)
        return self._combine(out_assign, weights), self._total(sender), self._total(receiver)

    def _ragged(self, x, expert_ids, weights, w_gate, w_up, w_down):
        Pn, El, D = self.size, w_gate.shape[0], x.shape[1]
        A = expert_ids.size
        recv_cap = math.ceil(self.capacity_factor_recv * A)
        block = min(A, recv_cap)  # the most one source can ever send to one receiver
        me = jax.lax.axis_index(self.axis)
        dest, local_e, rows = self._route(x, expert_ids, El)

        counts = jnp.bincount(dest, length=Pn).astype(jnp.int32)
        matrix = jax.lax.all_gather(counts, self.axis)  # [src, dst]
        accepted = jax.vmap(lambda c: round_robin_counts(c, recv_cap), in_axes=1, out_axes=1)(matrix)
        pos = position_in_group(dest, Pn)
        sent = pos < accepted[me][dest]
        slot = jnp.where(sent, dest * block + pos, Pn * block)
        buf = jnp.zeros((Pn * block, D), x.dtype).at[slot].set(rows, mode="drop")
        tag = jnp.zeros((Pn * block,), jnp.int32).at[slot].set(local_e, mode="drop")
        recv = _exchange(_pack(buf, tag).reshape(Pn, block, -1), self.axis, 1)
        r_rows, r_tag = _unpack(recv, D)

        # Compact on arrival: source s's rows go to [offset[s], offset[s] + n[s]).
        n_in = accepted[:, me]
        offset = jnp.cumsum(n_in) - n_in
        j = jnp.arange(block)[None, :]
        valid = j < n_in[:, None]
        where = jnp.where(valid, offset[:, None] + j, recv_cap).reshape(-1)
        compact = jnp.zeros((recv_cap, D), x.dtype).at[where].set(r_rows.reshape(-1, D), mode="drop")
        ids = jnp.full((recv_cap,), El, jnp.int32).at[where].set(r_tag.reshape(-1), mode="drop")
        out = _local_experts(compact, ids, El, w_gate, w_up, w_down, self.grouped_matmul)
        out_blocks = jnp.take(out, where, axis=0, mode="fill", fill_value=0).reshape(Pn, block, D)
        back = _exchange(out_blocks, self.axis, 1).reshape(-1, D)
        out_assign = jnp.take(back, slot, axis=0, mode="fill", fill_value=0)
        # Only the receiver's capacity binds; the sender holds back what the receiver refuses.
        receiver = A - jnp.sum(sent)
        return self._combine(out_assign, weights), self._total(jnp.int32(0)), self._total(receiver)
