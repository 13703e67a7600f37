"""Expert parallelism with ``shard_map`` over an ``expert`` mesh axis.

Tokens and experts are both sharded over the axis: device i holds T/P tokens and experts
[i*E/P, (i+1)*E/P). Each assignment (token, slot) travels to the device owning its
expert, is processed there by a grouped matmul, and comes back to be combined.

Receiver capacity, the same in both transports: each local expert accepts at most
``ceil(cf_recv * A * P / E)`` rows, where A is the assignments per device, so A * P / E is
the rows one expert receives under a perfectly even load (all assignments over the axis /
experts). An expert's capacity is shared round-robin across sources: its first row from
every source (in source order), then its second, ...

Two transports:

``"ragged"``  Counts first: every device learns the full [src, expert] count matrix
    (all_gather), each expert's capacity is shared round-robin across sources, and exactly
    the accepted rows are sent. Only the receiver capacity binds. XLA:CPU has no
    ``ragged-all-to-all`` op, so the row exchange is a dense all_to_all of per-destination
    blocks padded to the largest possible block, then compacted on arrival; the
    semantics (what is accepted, what drops) are those of a ragged exchange, but the
    memory is that of the padded blocks.

``"pooled"``  The fixed pooled-wave all-to-all: no counts or metadata are exchanged.
    Each sender fills one fixed pool per destination device (``ceil(cf_send * A / P)``
    rows, rounded up to a multiple of ``waves``; overflow drops at the sender) with the
    local expert id packed into the payload (bit-cast into an extra column). The pool
    travels in ``waves`` all_to_alls of identical shape, inside a ``lax.scan``: the
    receiver runs its local experts on wave w and sends its results back before wave w+1
    arrives, so only one wave's expert activations are live. Each wave's arrivals take
    what is left of each expert's capacity (the per-expert counts run through the scan),
    round-robin across sources within the wave; earlier waves come first. For the
    backward the scan body is rematerialised (``jax.checkpoint``) keeping only each
    wave's received rows: the expert pass runs once more per wave instead of keeping
    every wave's activations until the backward. ``waves=1`` is the same exchange with
    all waves at once (one all_to_all of the whole pool, one expert pass over it):
    ``benchmarks/pooled_wave_memory.py`` compares the two at an equal pool size.

Dropped assignments contribute zero to their token's output and are counted (exactly,
summed over devices), by the side whose limit dropped them (``with_drop_kinds``): ``pooled``
drops at the sender (pool overflow) and at the receiver (past an expert's capacity);
``ragged`` has no sender limit, so its sender count is always 0 and every drop is a
receiver-capacity drop (applied before sending, since the counts are exchanged first).

On a mesh with more axes (``("data", "sequence", "expert")`` in training) pass ``token_axes``: the
tokens are sharded over all of them, the experts over ``axis`` only (replicated over the
others), and each group of devices that shares the other coordinates runs its own
exchange over ``axis``. shard_map's transpose sums the expert-weight gradients over the
axes they are replicated on (``check_vma=False`` psums unmentioned axes).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import cast

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint, checkpoint_name
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from kernels.choices import EP_TRANSPORTS as TRANSPORTS
from kernels.dispatch import position_in_group
from kernels.grouped_matmul import IMPLS, expert_swiglu

_WAVE_ARRIVED = "expert_parallel_wave_arrived"  # the one value a wave keeps for its backward


def round_robin_counts(counts: jax.Array, capacity: int | jax.Array) -> jax.Array:
    """How many rows of each source a receiver with ``capacity`` slots accepts.

    Rows are taken round-robin: row 0 of every source (in source order), then row 1, ...
    counts: [P] int -> accepted [P] int. Closed form: the largest level L with
    sum(min(counts, L)) <= capacity, then one extra row for the first sources above L.
    """
    counts = counts.astype(jnp.int32)

    def filled(level):
        return jnp.sum(jnp.minimum(counts, level))

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


def round_robin_per_expert(counts: jax.Array, capacity: int | jax.Array) -> jax.Array:
    """``round_robin_counts`` for each expert: counts [src, E], capacity scalar or [E] -> accepted [src, E]."""
    capacity = jnp.broadcast_to(jnp.asarray(capacity, jnp.int32), counts.shape[1:])
    return jax.vmap(round_robin_counts, in_axes=(1, 0), out_axes=1)(counts, capacity)


def _accept_wave(tags: jax.Array, taken: jax.Array, capacity: int) -> tuple[jax.Array, jax.Array]:
    """Which rows of one arrived wave the local experts take.

    tags: [src, rows] local expert id + 1 (0: empty slot); taken: [n_local] rows each expert
    accepted in earlier waves. Returns (expert id per row [src * rows], n_local where not
    taken; rows accepted per expert in this wave [n_local]).
    """
    n_local = taken.shape[0]
    key = jnp.where(tags > 0, tags - 1, n_local)  # empty slots group after the experts
    counts = jax.vmap(lambda k: jnp.bincount(k, length=n_local + 1))(key)[:, :n_local]
    accepted = round_robin_per_expert(counts, capacity - taken)  # [src, n_local]
    rank = jax.vmap(position_in_group, in_axes=(0, None))(key, n_local + 1)  # among its source's rows
    limit = jnp.take_along_axis(accepted, jnp.minimum(key, n_local - 1), axis=1)
    take = (key < n_local) & (rank < limit)
    return jnp.where(take, key, n_local).reshape(-1), jnp.sum(accepted, axis=0)


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


def _all_to_all(blocks: jax.Array, axis: str) -> jax.Array:
    """Block i of the leading [P, ...] axis goes to device i; the result's block j came from device j."""
    return jax.lax.all_to_all(blocks, axis, 0, 0, tiled=True)


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
            raise ValueError(
                f"ExpertParallel.token_axes {tokens} must be distinct axes of the mesh "
                f"{tuple(self.mesh.shape)} and include {self.axis!r}"
            )

    @property
    def size(self) -> int:
        return self.mesh.shape[self.axis]

    @property
    def tokens(self) -> tuple[str, ...]:
        return tuple(self.token_axes) if self.token_axes is not None else (self.axis,)

    @property
    def token_shards(self) -> int:
        return math.prod(self.mesh.shape[a] for a in self.tokens)

    def pool_rows(self, assignments: int) -> int:
        """``pooled``: rows of one sender's pool for one destination, given A assignments per device."""
        pool = math.ceil(self.capacity_factor_send * assignments / self.size)
        return self.waves * math.ceil(pool / self.waves)  # waves of identical shape

    def expert_capacity(self, assignments: int, n_local: int) -> int:
        """Rows one local expert accepts: cf_recv times its even share, A * P / E = A / n_local."""
        return math.ceil(self.capacity_factor_recv * assignments / n_local)

    def __call__(self, x, expert_ids, weights, w_gate, w_up, w_down):
        out, sender, receiver = self.with_drop_kinds(x, expert_ids, weights, w_gate, w_up, w_down)
        return out, sender + receiver

    def with_drop_kinds(self, x, expert_ids, weights, w_gate, w_up, w_down):
        """As ``__call__``, with the global drop count split: (out, dropped_sender, dropped_receiver)."""
        T, E = x.shape[0], w_gate.shape[0]
        if T % self.token_shards or E % self.size:
            raise ValueError(
                f"ExpertParallel: tokens ({T}) must be divisible by the {self.token_shards} "
                f"token shards over {self.tokens} and experts ({E}) by the {self.axis!r} "
                f"axis size ({self.size})"
            )
        body = self._pooled if self.transport == "pooled" else self._ragged
        tok, exp = P(self.tokens), P(self.axis)
        # jax types shard_map's result as the function or, for decorator use without f, a decorator
        fn = cast(
            Callable[..., tuple[jax.Array, jax.Array, jax.Array]],
            jax.shard_map(
                body, mesh=self.mesh, in_specs=(tok, tok, tok, exp, exp, exp), out_specs=(tok, P(), P()), check_vma=False
            ),
        )
        return fn(x, expert_ids, weights, w_gate, w_up, w_down)

    def _total(self, count):
        """A per-device count summed over every token shard (replicated on the mesh)."""
        return jax.lax.psum(count.astype(jnp.int32), self.tokens)

    # -- per-device bodies (local shapes) -------------------------------------------------

    def _route(self, x: jax.Array, expert_ids: jax.Array, n_local: int) -> tuple[jax.Array, jax.Array, jax.Array]:
        Tl, k = expert_ids.shape
        flat = expert_ids.reshape(-1)
        return flat // n_local, flat % n_local, x[jnp.arange(Tl * k) // k]

    def _combine(self, out_assign, weights):
        Tl, k = weights.shape
        out = out_assign.reshape(Tl, k, -1)
        return jnp.einsum("tkd,tk->td", out, weights.astype(out.dtype))

    def _pooled(
        self, x: jax.Array, expert_ids: jax.Array, weights: jax.Array, w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array
    ):
        Pn, El, D = self.size, w_gate.shape[0], x.shape[1]
        A = expert_ids.size
        pool, cap = self.pool_rows(A), self.expert_capacity(A, El)
        per_wave = pool // self.waves
        dest, local_e, rows = self._route(x, expert_ids, El)

        pos = position_in_group(dest, Pn)
        sent = pos < pool
        slot = jnp.where(sent, dest * pool + pos, Pn * pool)  # out of range: dropped
        buf = jnp.zeros((Pn * pool, D), x.dtype).at[slot].set(rows, mode="drop")
        tag = jnp.zeros((Pn * pool,), jnp.int32).at[slot].set(local_e + 1, mode="drop")
        # [waves, Pn(dst), per_wave, D + 1]: wave w carries rows [w * per_wave, (w + 1) * per_wave) of every pool.
        outgoing = _pack(buf, tag).reshape(Pn, self.waves, per_wave, -1).swapaxes(0, 1)

        def one_wave(carry, wave):
            taken, arrived = carry
            r_rows, r_tag = _unpack(checkpoint_name(_all_to_all(wave, self.axis), _WAVE_ARRIVED), D)
            ids, accepted = _accept_wave(r_tag, taken, cap)
            out = _local_experts(r_rows.reshape(-1, D), ids, El, w_gate, w_up, w_down, self.grouped_matmul)
            back = _all_to_all(out.reshape(Pn, per_wave, D), self.axis)
            return (taken + accepted, arrived + jnp.sum(r_tag > 0)), back

        keep_arrivals = jax.checkpoint_policies.save_only_these_names(_WAVE_ARRIVED)
        start = (jnp.zeros((El,), jnp.int32), jnp.int32(0))
        (taken, arrived), back = jax.lax.scan(checkpoint(one_wave, policy=keep_arrivals), start, outgoing)
        back = back.swapaxes(0, 1).reshape(Pn * pool, D)
        out_assign = jnp.take(back, slot, axis=0, mode="fill", fill_value=0)
        sender, receiver = A - jnp.sum(sent), arrived - jnp.sum(taken)
        return self._combine(out_assign, weights), self._total(sender), self._total(receiver)

    def _ragged(
        self, x: jax.Array, expert_ids: jax.Array, weights: jax.Array, w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array
    ):
        Pn, El, D = self.size, w_gate.shape[0], x.shape[1]
        A = expert_ids.size
        cap = self.expert_capacity(A, El)
        recv_rows = El * cap  # the most a device can accept
        block = min(A, recv_rows)  # the most one source can ever send to one receiver
        me = jax.lax.axis_index(self.axis)
        flat = expert_ids.reshape(-1)
        dest, local_e, rows = self._route(x, expert_ids, El)

        matrix = jax.lax.all_gather(jnp.bincount(flat, length=Pn * El).astype(jnp.int32), self.axis)  # [src, E]
        accepted = round_robin_per_expert(matrix, cap)
        sent = position_in_group(flat, Pn * El) < accepted[me][flat]
        pos = position_in_group(jnp.where(sent, dest, Pn), Pn + 1)  # among the rows sent to dest
        slot = jnp.where(sent, dest * block + pos, Pn * block)
        buf = jnp.zeros((Pn * block, D), x.dtype).at[slot].set(rows, mode="drop")
        tag = jnp.zeros((Pn * block,), jnp.int32).at[slot].set(local_e, mode="drop")
        r_rows, r_tag = _unpack(_all_to_all(_pack(buf, tag).reshape(Pn, block, -1), self.axis), D)

        # Compact on arrival: source s's rows go to [offset[s], offset[s] + n[s]).
        n_in = jnp.sum(jax.lax.dynamic_slice_in_dim(accepted, me * El, El, axis=1), axis=1)
        offset = jnp.cumsum(n_in) - n_in
        j = jnp.arange(block)[None, :]
        valid = j < n_in[:, None]
        where = jnp.where(valid, offset[:, None] + j, recv_rows).reshape(-1)
        compact = jnp.zeros((recv_rows, D), x.dtype).at[where].set(r_rows.reshape(-1, D), mode="drop")
        ids = jnp.full((recv_rows,), El, jnp.int32).at[where].set(r_tag.reshape(-1), mode="drop")
        out = _local_experts(compact, ids, El, w_gate, w_up, w_down, self.grouped_matmul)
        out_blocks = jnp.take(out, where, axis=0, mode="fill", fill_value=0).reshape(Pn, block, D)
        back = _all_to_all(out_blocks, self.axis).reshape(-1, D)
        out_assign = jnp.take(back, slot, axis=0, mode="fill", fill_value=0)
        # Only the receiver's capacity binds; the sender holds back what the receiver refuses.
        receiver = A - jnp.sum(sent)
        return self._combine(out_assign, weights), self._total(jnp.int32(0)), self._total(receiver)


def compiled_temp_bytes(layer, T: int, D: int, E: int, F: int, k: int, train: bool = True) -> int:
    """Temp bytes XLA's compiled layer needs at these shapes (``memory_analysis().temp_size_in_bytes``:
    what is live beyond its inputs and outputs), compiled only, never run.

    layer: an ``ExpertParallel`` (or ``kernels.dispatch.moe_local``); x: [T, D], top-k routing,
    E experts of width F. train: the forward + backward (gradients of a sum of the output for x,
    the routing weights and the expert weights), else the forward alone.
    """

    def forward(x, ids, weights, w_gate, w_up, w_down):
        return layer(x, ids, weights, w_gate, w_up, w_down)

    def gradients(x, ids, weights, w_gate, w_up, w_down):
        loss = lambda x, weights, *experts: jnp.sum(layer(x, ids, weights, *experts)[0])  # noqa: E731
        return jax.grad(loss, argnums=(0, 1, 2, 3, 4))(x, weights, w_gate, w_up, w_down)

    f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)  # noqa: E731
    shapes = (f32(T, D), jax.ShapeDtypeStruct((T, k), jnp.int32), f32(T, k), f32(E, D, F), f32(E, D, F), f32(E, F, D))
    compiled = jax.jit(gradients if train else forward).lower(*shapes).compile()
    analysis = compiled.memory_analysis()
    if analysis is None:
        raise RuntimeError(f"the {jax.default_backend()} backend reports no memory analysis for a compiled program")
    return int(analysis.temp_size_in_bytes)
