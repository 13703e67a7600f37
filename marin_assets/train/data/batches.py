"""Training batches from Levanter-format token caches: packed, Feistel-shuffled, mixed.

The sources are token streams (``train/data/token_caches.py``: Levanter caches read in place). Like
Levanter's causal-LM dataset we pack by cutting a stream into consecutive ``seq_len`` windows
(documents end with EOS, so a window may span a document or a shard boundary).

Order: each source's windows are visited in a keyed Feistel permutation per epoch.
Mixture (``datakit.mixture.Mixture``): each row of batch ``b`` picks a source by the weights in force at ``b``
with a generator seeded by (seed, b), so the batch's composition is a pure function of
the batch index. The data position is ``DataPosition(batches, consumed)``: how many
batches were served and how many windows each source has handed out. It is saved in
every checkpoint, and a warm-started phase keeps it even when the mix changes.

Context phases (a phase with another ``seq_len``): the order is over *blocks* of
``block_tokens`` (the run's first seq_len unless the loader is told otherwise), and each
source is a stream of tokens read block after block in the permuted order. A window is the
next ``seq_len`` tokens of that stream, so the position is a token count
(``consumed`` x ``unit_tokens``) and survives a seq_len change exactly: no token skipped or
repeated. A window lies in one block (contiguous text) when seq_len divides the block; a
longer window is several consecutive blocks of the stream (set ``block_tokens`` to the run's
longest context up front to keep every window contiguous).

Document masking (``eos_ids``, one EOS id per source): each row also carries segment ids, which start a
new segment after every EOS (the cache writer ends each document with one) and at every block join of
a window longer than a block (the blocks around a join are unrelated text); attention stays inside a
segment. Such a loader hands out ``MaskedRows`` with its ``segment_ids``.

Loss masks: a chat cache (``datakit/chat.py``) holds a ``loss_mask`` field aligned with its ids. A
source whose caches have one is ``masked``; a loader with a masked source reads each row's mask at the
same offsets as its tokens and hands out ``MaskedRows`` (rows of unmasked sources count every target).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import queue
import threading
from collections.abc import Generator, Mapping
from typing import NamedTuple

import numpy as np

from marin_assets.datakit.datasets import LOSS_MASK
from marin_assets.datakit.feistel import FeistelPermutation
from marin_assets.datakit.mixture import Mixture
from marin_assets.train.data.token_caches import SourceData, TokenCache, TokenStream, as_stream

log = logging.getLogger(__name__)


def permutation(n: int, key: int):
    """The datakit's keyed Feistel bijection on [0, n) (maps int arrays to positions)."""
    perm = FeistelPermutation(n, key)
    return lambda idx: np.asarray(perm(np.asarray(idx, np.int64)), np.int64)


@dataclasses.dataclass(frozen=True)
class DataPosition:
    """Where the loader stands: batches served and, per source, ``consumed`` units of ``unit_tokens``
    tokens of its stream. ``unit_tokens``/``block_tokens`` None: a position written before context phases
    (both are the reader's seq_len, the only seq_len such a position was ever read at)."""

    batches: int = 0
    consumed: tuple[tuple[str, int], ...] = ()  # (source name, units handed out)
    unit_tokens: int | None = None  # tokens per consumed unit: the gcd of the seq_lens read so far
    block_tokens: int | None = None  # the shuffle's block, fixed for the run

    def __post_init__(self) -> None:
        for field in ("unit_tokens", "block_tokens"):
            value = getattr(self, field)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"DataPosition.{field} must be a positive int or None, got {value!r}")

    def get(self, name: str) -> int:
        return dict(self.consumed).get(name, 0)

    def tokens(self, seq_len: int) -> dict[str, int]:
        """Tokens each source has handed out, for a reader at ``seq_len`` (the unit of a legacy position)."""
        unit = self.unit_tokens or seq_len
        return {name: n * unit for name, n in self.consumed}

    def to_json(self) -> dict:
        out = {"batches": self.batches, "consumed": dict(self.consumed)}
        for field in ("unit_tokens", "block_tokens"):
            if getattr(self, field) is not None:
                out[field] = getattr(self, field)
        return out

    @staticmethod
    def from_json(obj: Mapping) -> DataPosition:
        return DataPosition(
            int(obj["batches"]),
            tuple(sorted((k, int(v)) for k, v in obj["consumed"].items())),
            obj.get("unit_tokens"),
            obj.get("block_tokens"),
        )


class MaskedRows(NamedTuple):
    """A batch whose loss counts only some targets: ``loss_mask`` [B, S] is 1 where token s is a target (the
    model's ``loss_fn`` reads ``loss_mask[:, 1:]`` against ``tokens[:, 1:]``). ``segment_ids`` [B, S] int32:
    the packed document of each position, for document masking (None: off)."""

    tokens: np.ndarray
    loss_mask: np.ndarray
    segment_ids: np.ndarray | None = None


def segment_ids(tokens: np.ndarray, offsets: np.ndarray, block: int, eos_id: int) -> np.ndarray:
    """[rows, S] int32 segment ids of windows read from stream ``offsets``: a new segment after each EOS
    and at each shuffle-block join inside a window (the text on either side is not contiguous)."""
    starts = np.zeros(tokens.shape, bool)
    starts[:, 1:] = tokens[:, :-1] == eos_id
    starts |= (np.asarray(offsets, np.int64)[:, None] + np.arange(tokens.shape[1])) % block == 0
    starts[:, 0] = False
    return np.cumsum(starts, axis=1, dtype=np.int32)


def tokens_and_mask(batch):
    """(tokens, loss mask or None) of a loader's batch: a ``MaskedRows`` or a bare token array. What
    every consumer passes to ``loss_fn`` (the train step, necromancy's gradients, the held-out loss)."""
    return (batch.tokens, batch.loss_mask) if isinstance(batch, MaskedRows) else (batch, None)


def segments_of(batch):
    """The segment ids of a loader's batch (document masking), or None: a bare token array has none."""
    return batch.segment_ids if isinstance(batch, MaskedRows) else None


def segment_keywords(segment_ids) -> dict:
    """``loss_fn``'s document-masking keyword: ``segment_ids`` when there are some, else none (a stand-in
    model's loss_fn need not take it). What every consumer passes: the train step, necromancy, the held-out loss."""
    return {} if segment_ids is None else {"segment_ids": segment_ids}


class MixedLoader:
    """Batches of ``[batch_size, seq_len]`` token windows from several caches.

    block_tokens: the shuffle's block (default: the position's, or seq_len for a fresh run); a run that
    will grow its context can set it to its longest seq_len up front so every window is contiguous text."""

    def __init__(
        self,
        caches: Mapping[str, TokenStream | TokenCache | SourceData | str | os.PathLike],
        seq_len: int,
        batch_size: int,
        mixture: Mixture | Mapping | None = None,
        seed: int = 0,
        vocab_size: int | None = None,
        block_tokens: int | None = None,
        eos_ids: Mapping[str, int] | None = None,
    ):
        if not caches:
            raise ValueError("MixedLoader: no caches given")
        if eos_ids is not None and set(eos_ids) != set(caches):
            raise ValueError(
                f"MixedLoader: document masking needs every source's EOS id; missing for {sorted(set(caches) - set(eos_ids))}"
            )
        self.eos_ids = dict(eos_ids) if eos_ids is not None else None
        self.sources = {name: as_stream(value) for name, value in sorted(caches.items())}
        self.seq_len, self.batch_size, self.seed, self.vocab_size = seq_len, batch_size, seed, vocab_size
        self.block_tokens = block_tokens
        self.masked = any(stream.masked for stream in self.sources.values())  # batches then carry a loss mask
        self.mixture = Mixture.from_dict(mixture) if mixture else Mixture.constant({n: 1.0 for n in self.sources})
        self.mixture.check_sources(list(self.sources), where="mixture")
        self.windows = {}
        for name, cache in self.sources.items():
            n = cache.num_tokens // seq_len
            if n < 1:
                raise ValueError(
                    f"source {name!r} ({cache.path}) has {cache.num_tokens} tokens, fewer than one "
                    f"sequence of seq_len={seq_len}; lower seq_len or add data"
                )
            self.windows[name] = n
        if block_tokens is not None:
            self._check_block(block_tokens)
        self._perms: dict[tuple[str, int, int], object] = {}

    def _check_block(self, block: int) -> None:
        for name, cache in self.sources.items():
            if cache.num_tokens < block:
                raise ValueError(
                    f"source {name!r} ({cache.path}) has {cache.num_tokens} tokens, fewer than one "
                    f"shuffle block of {block} tokens; lower block_tokens or add data"
                )

    def block_for(self, position: DataPosition) -> int:
        """The shuffle block of the run ``position`` belongs to (fixed for the run: its order depends on it)."""
        if position.block_tokens is not None:
            block = position.block_tokens
        elif position.batches or position.consumed:
            block = self.seq_len  # a legacy position: its blocks were the windows it was read in
        else:
            block = self.block_tokens or self.seq_len
        if self.block_tokens is not None and self.block_tokens != block:
            raise ValueError(
                f"data position was read in shuffle blocks of {block} tokens, the loader asks for "
                f"{self.block_tokens}: a run's data order cannot change mid-run"
            )
        return block

    def tokens_left(self, position: DataPosition) -> dict[str, int]:
        """Tokens of each source not yet seen in its first epoch (0 once it repeats)."""
        block, seen = self.block_for(position), position.tokens(self.seq_len)
        return {name: max(0, cache.num_tokens // block * block - seen.get(name, 0)) for name, cache in self.sources.items()}

    def _block_starts(self, name: str, block: int, ordinals: np.ndarray) -> np.ndarray:
        """Token offsets of the source's blocks number ``ordinals`` (counted across epochs)."""
        n = self.sources[name].num_tokens // block
        ordinals = np.asarray(ordinals, np.int64)
        out = np.empty(ordinals.shape[0], np.int64)
        for epoch in np.unique(ordinals // n):
            sel = ordinals // n == epoch
            key = (name, block, int(epoch))
            if key not in self._perms:
                salt = int.from_bytes(name.encode()[:8].ljust(8, b"\0"), "little")
                self._perms[key] = permutation(n, (self.seed * 1_000_003 + salt + 7919 * int(epoch)) % 2**63)
            out[sel] = self._perms[key](ordinals[sel] % n)
        return out * block

    def _window_starts(self, name: str, ordinals: np.ndarray) -> np.ndarray:
        """Token offsets of the source's ``seq_len`` windows number ``ordinals`` when the blocks are windows."""
        return self._block_starts(name, self.seq_len, ordinals)

    def _read_stream(self, name: str, block: int, offsets: np.ndarray, field: str | None = None) -> np.ndarray:
        """[len(offsets), seq_len]: the source's stream tokens (or ``field``) from each offset on, cut at block
        ends into contiguous reads (one read per piece length: one read in all when windows lie in blocks)."""
        pieces: dict[int, list[tuple[int, int, int, int]]] = {}  # length -> (row, column, block ordinal, within)
        for row, offset in enumerate(int(o) for o in offsets):
            column = 0
            while column < self.seq_len:
                pos = offset + column
                take = min(block - pos % block, self.seq_len - column)
                pieces.setdefault(take, []).append((row, column, pos // block, pos % block))
                column += take
        out = np.empty((len(offsets), self.seq_len), np.int64)
        for take, group in pieces.items():
            rows, columns, ordinals, within = (np.array(v, np.int64) for v in zip(*group, strict=True))
            values = self.sources[name].read(self._block_starts(name, block, ordinals) + within, take, field)
            for row, column, value in zip(rows, columns, values, strict=True):
                out[row, column : column + take] = value
        return out

    def next_batch(self, position: DataPosition, rows: slice | None = None) -> tuple[np.ndarray | MaskedRows, bool, DataPosition]:
        """(tokens int32 [B, S], batch_ok, position after this batch); a pure function of position.
        A loader with a masked source (``masked``) gives ``MaskedRows(tokens, loss_mask)`` instead of the
        tokens: the mask is 1 on every row of an unmasked source, the source's own mask on its rows.
        With ``eos_ids`` (document masking) it always gives ``MaskedRows``, with their ``segment_ids``.

        rows: read only these rows of the global batch (a process's share, ``mesh.process_rows``):
        tokens is then [rows, S] and batch_ok speaks for those rows only; the position after
        the batch is the same as for the whole batch, so every process stays in step.
        """
        lo, hi, _ = (rows or slice(0, self.batch_size)).indices(self.batch_size)
        block = self.block_for(position)
        if position.block_tokens is None:
            self._check_block(block)
        weights = {n: w for n, w in self.mixture.weights_at(position.batches).items() if w > 0}
        names = sorted(weights)
        p = np.array([weights[n] for n in names], np.float64)
        rng = np.random.default_rng([self.seed, position.batches])
        choice = rng.choice(len(names), size=self.batch_size, p=p / p.sum())
        seen = position.tokens(self.seq_len)
        out = np.empty((hi - lo, self.seq_len), np.int64)
        mask = np.ones((hi - lo, self.seq_len), np.int32) if self.masked or self.eos_ids is not None else None
        eos_ids = self.eos_ids
        segments = np.zeros((hi - lo, self.seq_len), np.int32) if eos_ids is not None else None
        for i, name in enumerate(names):
            where = np.flatnonzero(choice == i)
            if where.size == 0:
                continue
            first = seen.get(name, 0)
            mine = (where >= lo) & (where < hi)  # row where[j] reads the stream from first + j * seq_len
            if mine.any():
                offsets = first + np.flatnonzero(mine) * self.seq_len
                out[where[mine] - lo] = self._read_stream(name, block, offsets)
                if mask is not None and self.sources[name].masked:
                    mask[where[mine] - lo] = self._read_stream(name, block, offsets, LOSS_MASK)
                if segments is not None and eos_ids is not None:
                    segments[where[mine] - lo] = segment_ids(out[where[mine] - lo], offsets, block, eos_ids[name])
            seen[name] = first + int(where.size) * self.seq_len
        ok = True
        if out.size and self.vocab_size is not None and (out.min() < 0 or out.max() >= self.vocab_size):
            log.warning(
                "batch %d has token ids outside [0, %d): flagged corrupt, step will be skipped", position.batches, self.vocab_size
            )
            ok = False
            out = np.clip(out, 0, self.vocab_size - 1)
        unit = math.gcd(position.unit_tokens or self.seq_len, self.seq_len)
        new = DataPosition(position.batches + 1, tuple(sorted((n, t // unit) for n, t in seen.items())), unit, block)
        tokens = out.astype(np.int32)
        return (MaskedRows(tokens, mask, segments) if mask is not None else tokens), ok, new

    def iterate(
        self, position: DataPosition, prefetch: int = 2, rows: slice | None = None
    ) -> Generator[tuple[np.ndarray, bool, DataPosition], None, None]:
        """Batches from ``position`` on (only ``rows`` of each, see ``next_batch``), read ahead
        on a background thread. Close the iterator when done (``contextlib.closing``): that
        stops the thread and waits for it, so no tensorstore read is in flight when the
        process exits (which aborts it)."""
        q: queue.Queue = queue.Queue(maxsize=max(prefetch, 1))
        stop = threading.Event()

        def work():
            pos = position
            try:
                while not stop.is_set():
                    item = self.next_batch(pos, rows)
                    pos = item[2]
                    while not stop.is_set():
                        try:
                            q.put(item, timeout=0.1)
                            break
                        except queue.Full:
                            continue
            except BaseException as e:  # surface reader errors in the consumer, unless it has gone
                while not stop.is_set():
                    try:
                        q.put(e, timeout=0.1)
                        break
                    except queue.Full:
                        continue

        thread = threading.Thread(target=work, daemon=True, name="marin-data-prefetch")
        thread.start()
        try:
            while True:
                item = q.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            thread.join(timeout=PREFETCH_JOIN_S)


PREFETCH_JOIN_S = 60.0  # longer than any one batch read; a hung read is left behind (daemon thread)
