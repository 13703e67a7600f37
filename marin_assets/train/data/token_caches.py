"""Levanter-format token caches, read in place: one cache, a dataset's shard caches as one stream, and the
sources a trainer is pointed at (a dataset index, a DataKit cache folder, one split).

A Levanter cache (what DataKit's ``shards/tokenized`` and levanter's ``SerialCacheWriter``
write) stores each document's ``input_ids`` as one jagged array: ``input_ids/data`` is the
flat token stream and ``input_ids/offsets`` the document ends (``offsets[0]`` is the row
count), both zarr3 arrays in tensorstore, on a local disk or gs://. A source is a
``TokenStream``: one cache, or a dataset's shard caches read in place as one concatenated
stream (``datakit.datasets``: the index's token counts are the offsets). A chat cache
(``datakit/chat.py``) holds a ``loss_mask`` field aligned with its ids: its stream is ``masked``.

We open the arrays with tensorstore directly rather than through
``levanter.store.JaggedArrayStore``: the bytes are identical (a test checks against
levanter's reader) but importing levanter costs ~15 s per process, which every
``marin train`` start and every resume would pay.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from marin_assets.datakit.datasets import LOSS_MASK, check_shard, index_path, read_dataset
from marin_assets.datakit.levanter_cache import check_cache
from marin_assets.store.fsutil import kvstore_spec


class TokenCache:
    """Read-only view of one Levanter cache's flat ``input_ids`` stream (a local path or gs://).

    ``num_tokens`` known from a dataset index lets the arrays open lazily, on the first read:
    a source of 10,000 shards costs no I/O until its windows are read. The cache is checked
    once, before its first read (``check``; default ``levanter_cache.check_cache``: a finished
    ledger that agrees with the offsets, no data chunk missing): tensorstore reads a missing or
    emptied chunk as zeros, and 0 is a valid token id, so an unchecked damaged cache would be
    trained on silently. A cache opened without ``num_tokens`` is checked at once."""

    def __init__(
        self,
        cache_dir: str | os.PathLike,
        num_tokens: int | None = None,
        field: str = "input_ids",
        check: Callable[[], object] | None = None,
    ):
        self.path = os.fspath(cache_dir)
        self.field = field
        self._arrays: dict[str, Any] = {}  # field -> its opened tensorstore data array
        self._check = check if check is not None else functools.partial(_check_cache, self.path, (field,), None, num_tokens)
        self._checked = False
        if num_tokens is None:
            if not is_token_cache(self.path, field):
                raise FileNotFoundError(f"{self.path}: not a Levanter token cache (expected {field}/data and {field}/offsets)")
            self._check_once()
            offsets = self._open("offsets")
            num_docs = int(offsets[0].read().result())
            num_tokens = int(offsets[num_docs].read().result()) if num_docs else 0
        self.num_tokens = num_tokens

    def _check_once(self) -> None:
        if not self._checked:  # two prefetch threads may both check: harmless, and no lock on the read path
            self._check()
            self._checked = True

    def _open(self, sub: str, field: str | None = None):
        import tensorstore as ts

        spec = {"driver": "zarr3", "kvstore": kvstore_spec(f"{self.path.rstrip('/')}/{field or self.field}/{sub}")}
        return ts.open(spec, open=True, read=True).result()

    @property
    def data(self):
        return self.field_data(self.field)

    def field_data(self, field: str):
        """The flat data array of one of the cache's fields (a chat cache's ``loss_mask`` is aligned with its ids)."""
        if field not in self._arrays:
            self._check_once()
            self._arrays[field] = self._open("data", field)
        return self._arrays[field]

    def read(self, starts: Sequence[int], length: int) -> np.ndarray:
        """[len(starts), length] windows of the token stream, read in one batch."""
        return TokenStream([self]).read(starts, length)


class TokenStream:
    """One source's tokens: the concatenation of its caches (a dataset's shards, in order),
    read in place. A window that crosses a shard boundary is read from both shards."""

    def __init__(self, caches: Sequence[TokenCache], masked: bool = False):
        self.caches = list(caches)
        self.masked = masked  # its caches hold a LOSS_MASK field beside the ids
        self.ends = np.cumsum([c.num_tokens for c in self.caches], dtype=np.int64)
        self.num_tokens = int(self.ends[-1]) if self.caches else 0

    @property
    def path(self) -> str:
        return self.caches[0].path if len(self.caches) == 1 else f"{len(self.caches)} caches from {self.caches[0].path}"

    def read(self, starts: Sequence[int], length: int, field: str | None = None) -> np.ndarray:
        """[len(starts), length] windows at global token offsets ``starts`` (of ``field``, default the ids),
        in one batch of reads."""
        import tensorstore as ts

        out = np.empty((len(starts), length), np.int32)
        if not len(starts):
            return out
        offsets = np.asarray(starts, np.int64)
        if offsets.min() < 0 or offsets.max() + length > self.num_tokens:
            raise IndexError(f"window outside the {self.num_tokens} tokens of {self.path}")
        pieces = []  # (row, column, future)
        with ts.Batch() as batch:
            for row, start in enumerate(offsets):
                pos, end = int(start), int(start) + length
                shard = int(np.searchsorted(self.ends, pos, side="right"))
                while pos < end:
                    first = int(self.ends[shard - 1]) if shard else 0
                    stop = min(end, int(self.ends[shard]))
                    data = self.caches[shard].field_data(field or self.caches[shard].field)
                    pieces.append((row, pos - int(start), data[pos - first : stop - first].read(batch=batch)))
                    pos, shard = stop, shard + 1
        for row, column, future in pieces:
            values = future.result()
            out[row, column : column + values.shape[0]] = values
        return out


SPLITS = ("train", "validation")  # a DataKit cache folder's splits


def is_token_cache(path: str | os.PathLike, field: str = "input_ids") -> bool:
    import fsspec

    base = f"{os.fspath(path).rstrip('/')}/{field}"
    fs, root = fsspec.core.url_to_fs(base)
    return fs.exists(f"{root}/data") and fs.exists(f"{root}/offsets")


@dataclasses.dataclass(frozen=True)
class SourceData:
    """What the trainer reads of one source: its train stream, its held-out stream (None
    when it has none) and the tokenizer it was written with (when the cache says): its hash and
    the EOS id that ends every document (document masking reads the boundaries from it)."""

    where: str
    train: TokenStream
    validation: TokenStream | None
    vocab_size: int | None = None
    tokenizer_sha256: str | None = None
    eos_id: int | None = None


def _check_cache(path: str, fields: tuple[str, ...], rows: int | None, tokens: int | None) -> None:
    """levanter_cache.check_cache, its error naming the cache: a write that failed or was killed (no
    finished ledger) holds a prefix of the documents; a missing chunk reads as zeros."""
    try:
        check_cache(path, fields, rows, tokens)
    except ValueError as e:
        raise ValueError(f"unfinished token cache {path}, or a damaged one: {e}; rerun the step that writes it") from None


def _finished(split: str, fields: tuple[str, ...] = ("input_ids",)) -> TokenCache:
    """A single cache, checked at once (all of its ``fields``)."""
    return TokenCache(split, check=functools.partial(_check_cache, split, fields, None, None))


def _cache_source(where: str, train: TokenStream, held: TokenStream | None, stats: dict) -> SourceData:
    """A plain cache's source: its streams, and the vocabulary and tokenizer hash its stats.json records."""
    tokenizer = stats.get("tokenizer")
    tokenizer = tokenizer if isinstance(tokenizer, dict) else {}
    return SourceData(
        where, train, held, _positive_int(stats.get("vocab_size")), tokenizer.get("sha256"), _token_id(tokenizer.get("eos_id"))
    )


def _stats(folder: str) -> dict:
    import json

    import fsspec

    path = f"{folder.rstrip('/')}/stats.json"
    fs, root = fsspec.core.url_to_fs(path)
    try:
        stats = json.loads(fs.cat_file(root))
    except (FileNotFoundError, ValueError):
        return {}
    return stats if isinstance(stats, dict) else {}


def _positive_int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _token_id(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _split_stream(split: str) -> TokenStream:
    """One finished cache as a stream, masked when it holds a loss mask (a chat cache)."""
    masked = is_token_cache(split, LOSS_MASK)
    return TokenStream([_finished(split, ("input_ids", LOSS_MASK) if masked else ("input_ids",))], masked=masked)


def open_source(path: str | os.PathLike) -> SourceData:
    """The data at ``path``: a dataset index (``dataset.json`` or its folder: many shard
    caches, read in place), a DataKit cache folder (``train/`` + ``validation/`` + stats.json)
    or one Levanter split (trained on, no held-out split)."""
    where = os.fspath(path)
    if index_path(where) is not None:
        dataset = read_dataset(where)
        if not dataset.shards:
            raise ValueError(f"{where}: dataset {dataset.name!r} has no shards")
        masked = dataset.has_loss_mask

        def shard_cache(shard, split: str, tokens: int) -> TokenCache:  # checked on its first read, not here
            return TokenCache(shard.split(split), tokens, check=functools.partial(check_shard, shard, split, dataset.fields))

        train = TokenStream([shard_cache(s, "train", s.train_tokens) for s in dataset.shards], masked)
        held = [shard_cache(s, "validation", s.validation_tokens) for s in dataset.shards if s.validation_tokens]
        return SourceData(
            where,
            train,
            TokenStream(held, masked) if held else None,
            _positive_int(dataset.vocab_size),
            dataset.tokenizer.get("sha256"),
            _token_id(dataset.tokenizer.get("eos_id")),
        )
    if is_token_cache(where):
        return _cache_source(where, _split_stream(where), None, _stats(where.rstrip("/").rsplit("/", 1)[0]))
    train, validation = f"{where.rstrip('/')}/train", f"{where.rstrip('/')}/validation"
    if is_token_cache(train):
        held = _split_stream(validation) if is_token_cache(validation) else None
        return _cache_source(where, _split_stream(train), held, _stats(where))
    raise FileNotFoundError(
        f"{where}: not a dataset index (dataset.json), a Levanter token cache (input_ids/data and "
        f"input_ids/offsets) nor a DataKit cache folder (train/ and validation/ caches)"
    )


def as_stream(value) -> TokenStream:
    """A TokenStream from what callers hand the loader: a stream, a cache, SourceData or a path."""
    if isinstance(value, TokenStream):
        return value
    if isinstance(value, TokenCache):
        return TokenStream([value])
    if isinstance(value, SourceData):
        return value.train
    return TokenStream([TokenCache(value)])
