"""Training batches from Levanter-format token caches: packed, Feistel-shuffled, mixed.

A Levanter cache (what ``marin datakit run`` and levanter's ``SerialCacheWriter`` write)
stores each document's ``input_ids`` as one jagged array: ``input_ids/data`` is the flat
token stream and ``input_ids/offsets`` the document ends (``offsets[0]`` is the row
count), both zarr3 arrays in tensorstore. Like Levanter's causal-LM dataset we pack by
cutting the flat stream into consecutive ``seq_len`` windows (documents end with EOS, so a
window may span a boundary). Window ``i`` of a source is read with one slice.

We open the two arrays with tensorstore directly rather than through
``levanter.store.JaggedArrayStore``: the bytes are identical (a test checks against
levanter's reader) but importing levanter costs ~15 s per process, which every
``marin train`` start and every resume would pay.

Order: each source's windows are visited in a keyed Feistel permutation per epoch.
Mixture (``datakit.mixture.Mixture``): each row of batch ``b`` picks a source by the weights in force at ``b``
with a generator seeded by (seed, b), so the batch's composition is a pure function of
the batch index. The data position is ``DataPosition(batches, consumed)``: how many
batches were served and how many windows each source has handed out. It is saved in
every checkpoint, and a warm-started phase keeps it even when the mix changes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import threading
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import numpy as np

from marin_assets.datakit.feistel import FeistelPermutation
from marin_assets.datakit.mixture import Mixture

log = logging.getLogger(__name__)


def permutation(n: int, key: int):
    """The datakit's keyed Feistel bijection on [0, n) (maps int arrays to positions)."""
    perm = FeistelPermutation(n, key)
    return lambda idx: np.asarray(perm(np.asarray(idx, np.int64)), np.int64)


class TokenCache:
    """Read-only view of one Levanter cache's flat ``input_ids`` stream."""

    def __init__(self, cache_dir: str | os.PathLike, field: str = "input_ids"):
        import tensorstore as ts

        self.path = Path(cache_dir)
        base = self.path / field
        if not (base / "data").exists() or not (base / "offsets").exists():
            raise FileNotFoundError(
                f"{cache_dir}: not a Levanter token cache (expected {field}/data and {field}/offsets)")

        def open_array(sub: str):
            spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str((base / sub).resolve())}}
            return ts.open(spec, open=True, read=True).result()

        self._data = open_array("data")
        offsets = open_array("offsets")
        self.num_docs = int(offsets[0].read().result())
        self.num_tokens = int(offsets[self.num_docs].read().result()) if self.num_docs else 0
        self.dtype = np.dtype(self._data.dtype.numpy_dtype)

    def read(self, starts: Sequence[int], length: int) -> np.ndarray:
        """[len(starts), length] windows of the token stream, read in one batch."""
        import tensorstore as ts

        with ts.Batch() as batch:
            futures = [self._data[int(s):int(s) + length].read(batch=batch) for s in starts]
        return np.stack([f.result() for f in futures]) if futures else np.zeros((0, length), self.dtype)


@dataclasses.dataclass(frozen=True)
class DataPosition:
    batches: int = 0
    consumed: tuple[tuple[str, int], ...] = ()  # (source name, windows handed out)

    def get(self, name: str) -> int:
        return dict(self.consumed).get(name, 0)

    def to_json(self) -> dict:
        return {"batches": self.batches, "consumed": dict(self.consumed)}

    @staticmethod
    def from_json(obj: Mapping) -> "DataPosition":
        return DataPosition(int(obj["batches"]), tuple(sorted((k, int(v)) for k, v in obj["consumed"].items())))


SPLITS = ("train", "validation")  # what `marin datakit run` writes under <prefix>/cache


def is_token_cache(path: str | os.PathLike, field: str = "input_ids") -> bool:
    base = Path(path) / field
    return (base / "data").exists() and (base / "offsets").exists()


def resolve_cache(path: str | os.PathLike) -> tuple[Path, Path | None]:
    """(train split, validation split or None) of a cache path.

    ``path`` is either one Levanter cache (a single split: trained on, no held-out split) or
    a DataKit cache folder holding ``train/`` and ``validation/`` caches (what ``marin
    datakit run`` reports as ``cache``).
    """
    path = Path(path)
    if is_token_cache(path):
        return path, None
    if is_token_cache(path / "train"):
        validation = path / "validation"
        return path / "train", validation if is_token_cache(validation) else None
    raise FileNotFoundError(
        f"{path}: not a Levanter token cache (expected input_ids/data and input_ids/offsets) "
        f"nor a DataKit cache folder (expected train/ and validation/ caches)")


def cache_vocab_size(path: str | os.PathLike) -> int | None:
    """The tokenizer vocabulary a DataKit cache was written with (its ``stats.json``, in the
    folder or, for one split, its parent); None when the cache does not say."""
    import json

    path = Path(path)
    for stats in (path / "stats.json", path.parent / "stats.json"):
        try:
            value = json.loads(stats.read_text()).get("vocab_size")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


class MixedLoader:
    """Batches of ``[batch_size, seq_len]`` token windows from several caches."""

    def __init__(self, caches: Mapping[str, str | os.PathLike], seq_len: int, batch_size: int,
                 mixture: Mixture | Mapping | None = None, seed: int = 0, vocab_size: int | None = None):
        if not caches:
            raise ValueError("MixedLoader: no caches given")
        self.sources = {name: TokenCache(path) for name, path in sorted(caches.items())}
        self.seq_len, self.batch_size, self.seed, self.vocab_size = seq_len, batch_size, seed, vocab_size
        self.mixture = Mixture.from_dict(mixture) if mixture else Mixture.constant({n: 1.0 for n in self.sources})
        self.mixture.check_sources(list(self.sources), where="mixture")
        self.windows = {}
        for name, cache in self.sources.items():
            n = cache.num_tokens // seq_len
            if n < 1:
                raise ValueError(
                    f"source {name!r} ({cache.path}) has {cache.num_tokens} tokens, fewer than one "
                    f"sequence of seq_len={seq_len}; lower seq_len or add data")
            self.windows[name] = n
        self._perms: dict[tuple[str, int], object] = {}

    def tokens_left(self, position: DataPosition) -> dict[str, int]:
        """Tokens of each source not yet seen in its first epoch (0 once it repeats)."""
        return {name: max(0, n - position.get(name)) * self.seq_len for name, n in self.windows.items()}

    def _window_starts(self, name: str, ordinals: np.ndarray) -> np.ndarray:
        """Token offsets of the source's windows number ``ordinals`` (counted across epochs)."""
        n = self.windows[name]
        ordinals = np.asarray(ordinals, np.int64)
        out = np.empty(ordinals.shape[0], np.int64)
        for epoch in np.unique(ordinals // n):
            sel = ordinals // n == epoch
            key = (name, int(epoch))
            if key not in self._perms:
                salt = int.from_bytes(name.encode()[:8].ljust(8, b"\0"), "little")
                self._perms[key] = permutation(n, (self.seed * 1_000_003 + salt + 7919 * int(epoch)) % 2**63)
            out[sel] = self._perms[key](ordinals[sel] % n)
        return out * self.seq_len

    def next_batch(self, position: DataPosition, rows: slice | None = None
                   ) -> tuple[np.ndarray, bool, DataPosition]:
        """(tokens int32 [B, S], batch_ok, position after this batch); a pure function of position.

        rows: read only these rows of the global batch (a process's share, ``mesh.process_rows``):
        tokens is then [rows, S] and batch_ok speaks for those rows only; the position after
        the batch is the same as for the whole batch, so every process stays in step.
        """
        lo, hi, _ = (rows or slice(0, self.batch_size)).indices(self.batch_size)
        weights = {n: w for n, w in self.mixture.weights_at(position.batches).items() if w > 0}
        names = sorted(weights)
        p = np.array([weights[n] for n in names], np.float64)
        rng = np.random.default_rng([self.seed, position.batches])
        choice = rng.choice(len(names), size=self.batch_size, p=p / p.sum())
        consumed = dict(position.consumed)
        out = np.empty((hi - lo, self.seq_len), np.int64)
        for i, name in enumerate(names):
            where = np.flatnonzero(choice == i)
            if where.size == 0:
                continue
            first = consumed.get(name, 0)
            mine = (where >= lo) & (where < hi)  # window ordinal of row where[j] is first + j
            if mine.any():
                starts = self._window_starts(name, first + np.flatnonzero(mine))
                out[where[mine] - lo] = self.sources[name].read(starts, self.seq_len)
            consumed[name] = first + int(where.size)
        ok = True
        if out.size and self.vocab_size is not None and (out.min() < 0 or out.max() >= self.vocab_size):
            log.warning("batch %d has token ids outside [0, %d): flagged corrupt, step will be skipped",
                        position.batches, self.vocab_size)
            ok = False
            out = np.clip(out, 0, self.vocab_size - 1)
        new = DataPosition(position.batches + 1, tuple(sorted(consumed.items())))
        return out.astype(np.int32), ok, new

    def iterate(self, position: DataPosition, prefetch: int = 2, rows: slice | None = None
                ) -> Iterator[tuple[np.ndarray, bool, DataPosition]]:
        """Batches from ``position`` on (only ``rows`` of each, see ``next_batch``), read ahead
        on a background thread."""
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
            except BaseException as e:  # surface reader errors in the consumer
                q.put(e)

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


def held_out_batches(caches: Mapping[str, str | os.PathLike], seq_len: int, batch_size: int,
                     max_batches: int = 8) -> list[np.ndarray]:
    """The held-out loss's batches: the first consecutive ``seq_len`` windows of each
    validation cache, in source order, in full batches only (at most ``max_batches``).

    Fixed windows, not a shuffle, so every evaluation of a run sees the same tokens. Empty
    when the caches hold less than one batch; the caller reports that instead of a number.
    """
    windows = []
    for name, path in sorted(caches.items()):
        cache = TokenCache(path)
        n = min(cache.num_tokens // seq_len, max_batches * batch_size - len(windows))
        if n > 0:
            windows.extend(cache.read([i * seq_len for i in range(n)], seq_len))
    if 0 < len(windows) < batch_size:  # a small split still gives a number, from one short batch
        return [np.stack(windows).astype(np.int32)]
    full = len(windows) // batch_size
    return [np.stack(windows[b * batch_size:(b + 1) * batch_size]).astype(np.int32) for b in range(full)]
