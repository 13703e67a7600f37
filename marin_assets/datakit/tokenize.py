"""Tokenizer training and tokenization into Levanter's cache format.

`train_tokenizer` fits a byte-level BPE with HF `tokenizers` and saves tokenizer.json.
`tokenize` encodes documents with `encode_batch_fast` in large batches (the Rust side
runs them in parallel) and appends them to a Levanter cache: on a local path through
`CacheWriter` (the same zarr3 arrays and ledger as `levanter.store.SerialCacheWriter`,
written with tensorstore directly: importing levanter costs 10-20 s per process, and a
per-shard tokenize step pays that per worker), elsewhere through SerialCacheWriter itself.
Either way Levanter's own `TreeCache.load` opens the result:
out_dir/train and out_dir/validation, each a cache of {"input_ids": int32[n]} rows (one
per document, EOS appended), plus out_dir/stats.json with tokens, bytes, bytes/token.

The split is a pure function of the document id (a hash slice), so adding documents never
moves an existing one between train and validation. The one exception is opt-in
(`min_validation_docs`, which `marin datakit run` sets to 1): when the slice picks fewer
documents than that, the smallest remaining ids (the ones nearest the slice) join it, so a
small input still gets a held-out split; train always keeps at least one document.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from marin_assets.numeric_checks import check_float, check_int
from marin_assets.datakit.shards import join, reset_dir, write_json

EOS = "<|endoftext|>"
SPLITS = ("train", "validation")


@dataclass(frozen=True)
class TokenizerTrainConfig:
    vocab_size: int = 4096
    min_frequency: int = 2
    max_chars_per_doc: int = 100_000  # bounds training time on book-length documents
    batch_docs: int = 1000

    def __post_init__(self):
        # 256 byte tokens + EOS + at least one merge; the upper bound keeps ids in int32.
        check_int("TokenizerTrainConfig.vocab_size", self.vocab_size, 256 + 2, 2**31 - 1)
        for name in ("min_frequency", "max_chars_per_doc", "batch_docs"):
            check_int(f"TokenizerTrainConfig.{name}", getattr(self, name), 1)


def _iter_texts(shard_paths: Sequence[str], batch_docs: int, max_chars: int | None = None) -> Iterator[list[str]]:
    import pyarrow.parquet as pq
    import fsspec

    for path in shard_paths:
        with fsspec.open(path, "rb") as f:
            for batch in pq.ParquetFile(f).iter_batches(batch_size=batch_docs, columns=["text"]):
                texts = batch.column(0).to_pylist()
                yield [t[:max_chars] for t in texts] if max_chars else texts


def train_tokenizer(shard_paths: Sequence[str], out_dir: str, config: TokenizerTrainConfig = TokenizerTrainConfig()) -> dict:
    """Train a byte-level BPE on the `text` column of shards; write out_dir/tokenizer.json."""
    import fsspec
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=config.min_frequency,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_iter_texts(shard_paths, config.batch_docs, config.max_chars_per_doc), trainer=trainer)
    fs, root = fsspec.core.url_to_fs(out_dir)
    fs.makedirs(root, exist_ok=True)
    with fs.open(join(root, "tokenizer.json"), "w") as f:
        f.write(tok.to_str())
    counts = {"vocab_size": tok.get_vocab_size(), "eos_id": tok.token_to_id(EOS)}
    write_json(counts, join(out_dir, "_counts.json"))
    return counts


def load_tokenizer(path: str):
    """A Tokenizer from a tokenizer.json path or a directory holding one (any fsspec URL)."""
    import fsspec
    from tokenizers import Tokenizer

    if not path.endswith(".json"):
        path = join(path, "tokenizer.json")
    with fsspec.open(path, "r") as f:
        return Tokenizer.from_str(f.read())


@dataclass(frozen=True)
class TokenizeConfig:
    validation_fraction: float = 0.01
    batch_docs: int = 2048  # documents per encode_batch call and per cache write
    append_eos: bool = True
    eos_token: str = EOS
    min_validation_docs: int = 0  # topped up from the smallest ids when the hash slice picks fewer

    def __post_init__(self):
        check_float("TokenizeConfig.validation_fraction", self.validation_fraction, 0.0, 1.0, hi_open=True)
        check_int("TokenizeConfig.batch_docs", self.batch_docs, 1)
        check_int("TokenizeConfig.min_validation_docs", self.min_validation_docs, 0)


def is_validation(doc_id: str, fraction: float) -> bool:
    # The id is a uniform hash already: its first 8 hex digits are a uniform 32-bit number.
    return int(doc_id[:8], 16) < fraction * 0x100000000


def _validation_top_up(shard_paths: Sequence[str], config: TokenizeConfig) -> frozenset[str]:
    """Ids moved into validation when the hash slice picks fewer than ``min_validation_docs``:
    the smallest ids it did not pick, never so many that train is left empty. A fraction of 0
    asks for no validation at all and gets none."""
    import heapq

    import pyarrow.parquet as pq
    import fsspec

    wanted = config.min_validation_docs
    if wanted == 0 or config.validation_fraction == 0:
        return frozenset()
    total = picked = 0
    smallest: list[str] = []  # the `wanted` smallest ids the slice did not pick, so far (sorted)
    for path in shard_paths:
        with fsspec.open(path, "rb") as f:
            for batch in pq.ParquetFile(f).iter_batches(batch_size=config.batch_docs, columns=["id"]):
                ids = batch.column(0).to_pylist()
                unpicked = [i for i in ids if not is_validation(i, config.validation_fraction)]
                total, picked = total + len(ids), picked + len(ids) - len(unpicked)
                smallest = heapq.nsmallest(wanted, [*smallest, *unpicked])
    missing = min(wanted, total - 1) - picked
    return frozenset(smallest[:missing]) if missing > 0 else frozenset()


def exemplar():
    import numpy as np

    return {"input_ids": np.zeros((0,), dtype=np.int32)}


# Levanter's jagged-array layout (levanter/store/jagged_array.py _get_spec): 2**54 rows,
# 128M-element shards of 256K-element blosc chunks. offsets[0] is the row count,
# offsets[i + 1] the end of row i in data.
_CHUNK, _WRITE_CHUNK = 256 * 1024, 256 * 1024 * 512
LEDGER_FILE = "shard_ledger.json"


def _zarr3_array(path: str, dtype: str):
    import tensorstore as ts

    metadata = {"chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [_WRITE_CHUNK]}},
                "codecs": [{"name": "sharding_indexed", "configuration": {
                    "chunk_shape": [_CHUNK], "codecs": [{"name": "blosc", "configuration": {"clevel": 5}}]}}]}
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": path}, "metadata": metadata}
    return ts.open(spec, dtype=dtype, shape=[2**54], create=True, delete_existing=True).result()


class CacheWriter:
    """A one-field ({"input_ids": int32 rows}) Levanter cache on a local path, written with
    tensorstore: what SerialCacheWriter writes, without importing levanter (and jax, ray,
    datasets). The ledger (is_finished) is written only on a clean exit."""

    def __init__(self, cache_dir: str):
        import os

        self.cache_dir = os.path.abspath(cache_dir)
        base = os.path.join(self.cache_dir, "input_ids")
        os.makedirs(base, exist_ok=True)
        self._offsets = _zarr3_array(os.path.join(base, "offsets"), "int64")
        self._data = _zarr3_array(os.path.join(base, "data"), "int32")
        self.rows = self.tokens = 0

    def write_batch(self, batch: dict) -> None:
        import numpy as np

        arrays = [np.asarray(a, dtype=np.int32) for a in batch["input_ids"]]
        if not arrays:
            return
        ends = self.tokens + np.cumsum([a.size for a in arrays], dtype=np.int64)
        data = np.concatenate(arrays)
        self._data[self.tokens:self.tokens + data.size].write(data).result()
        self._offsets[self.rows + 1:self.rows + 1 + len(arrays)].write(ends).result()
        self.rows, self.tokens = self.rows + len(arrays), int(ends[-1])
        self._offsets[0].write(self.rows).result()  # after the rows: a reader never sees a partial batch

    def __exit__(self, exc_type, exc, tb) -> None:
        import json
        import os

        if exc_type is None:
            ledger = {"total_num_rows": self.rows, "shard_rows": {"": self.rows}, "is_finished": True,
                      "finished_shards": [""], "field_counts": {}, "metadata": {"preprocessor_metadata": None}}
            with open(os.path.join(self.cache_dir, LEDGER_FILE), "w") as f:
                f.write(json.dumps(ledger))


def cache_writer(cache_dir: str):
    """CacheWriter on a local path; Levanter's SerialCacheWriter on any other filesystem."""
    import fsspec

    protocol = fsspec.core.split_protocol(cache_dir)[0]
    if protocol in (None, "file", "local"):
        return CacheWriter(fsspec.core.strip_protocol(cache_dir) if protocol else cache_dir)
    from levanter.store.cache import SerialCacheWriter

    return SerialCacheWriter(cache_dir, exemplar())


def tokenize(
    shard_paths: Sequence[str], tokenizer_path: str, out_dir: str, config: TokenizeConfig = TokenizeConfig(), progress=None
) -> dict:
    """Tokenize the `text` of shards into Levanter caches out_dir/{train,validation}; return stats.

    `progress`, if given, is called with the number of documents done after each batch.
    """
    import numpy as np
    import pyarrow.parquet as pq
    import fsspec

    tok = load_tokenizer(tokenizer_path)
    eos_id = tok.token_to_id(config.eos_token) if config.append_eos else None
    if config.append_eos and eos_id is None:
        raise ValueError(f"tokenizer {tokenizer_path} has no {config.eos_token!r} token; set append_eos=False or eos_token")
    stats = {s: {"documents": 0, "tokens": 0, "bytes": 0} for s in SPLITS}
    # Start from empty split dirs and no stats.json: nothing of an earlier cache survives a rerun.
    for s in SPLITS:
        reset_dir(join(out_dir, s))
    fs, root = fsspec.core.url_to_fs(join(out_dir, "stats.json"))
    if fs.exists(root):
        fs.rm(root)
    top_up = _validation_top_up(shard_paths, config)
    writers = {s: cache_writer(join(out_dir, s)) for s in SPLITS}
    failure: BaseException | None = None
    try:
        for path in shard_paths:
            with fsspec.open(path, "rb") as f:
                for batch in pq.ParquetFile(f).iter_batches(batch_size=config.batch_docs, columns=["id", "text"]):
                    ids, texts = batch.column(0).to_pylist(), batch.column(1).to_pylist()
                    encodings = tok.encode_batch_fast(texts, add_special_tokens=False)
                    rows = {s: [] for s in SPLITS}
                    for doc_id, text, enc in zip(ids, texts, encodings):
                        held_out = doc_id in top_up or is_validation(doc_id, config.validation_fraction)
                        split = "validation" if held_out else "train"
                        arr = np.asarray(enc.ids, dtype=np.int32)
                        if eos_id is not None:
                            arr = np.append(arr, np.int32(eos_id))
                        rows[split].append(arr)
                        s = stats[split]
                        s["documents"] += 1
                        s["tokens"] += len(arr)
                        s["bytes"] += len(text.encode("utf-8"))
                    for split, arrays in rows.items():
                        if arrays:
                            writers[split].write_batch({"input_ids": arrays})
                    if progress is not None:
                        progress(len(texts))
    except BaseException as e:
        failure = e
        raise
    finally:
        # The ledger (is_finished=True) is written only when every document made it in; a
        # failed run leaves a cache that Levanter refuses to open as finished.
        for w in writers.values():
            w.__exit__(type(failure) if failure else None, failure, None)
    for s in stats.values():
        s["bytes_per_token"] = s["bytes"] / s["tokens"] if s["tokens"] else None
    stats["vocab_size"] = tok.get_vocab_size()
    stats["tokenizer"] = tokenizer_path
    write_json(stats, join(out_dir, "stats.json"))
    return stats


def open_cache(cache_dir: str):
    """Open one split with Levanter's own reader (TreeCache.load)."""
    from levanter.store.cache import TreeCache

    return TreeCache.load(cache_dir, exemplar())
