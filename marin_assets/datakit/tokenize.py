"""Tokenizers and tokenization into Levanter's cache format.

Tokenizers are pinned, never trained on the corpus they tokenize, so a shard's tokens depend
on nothing but its own documents and the tokenizer's bytes:

- ``olmo`` (the default for user corpora): OLMo's GPT-NeoX/Dolma v1.5 BPE, 50,280 ids, the
  ``tokenizer.json`` that the ``ai2-olmo-eval`` package ships (installed from our lock).
- ``bytes``: one id per UTF-8 byte (0-255) plus EOS (256). The tiny demo models use it: no
  training, nothing to re-tokenize ever, and an LM head small enough that an IsoFLOP ladder
  of CPU-sized models has interior optima.
- any ``tokenizer.json`` a user points at.

``tokenize`` encodes documents in large batches (HF ``encode_batch_fast``, whose Rust side
runs them in parallel; the byte tokenizer is a plain UTF-8 encode) and appends them to a
Levanter cache through ``levanter_cache.CacheWriter`` (the format without importing levanter,
which costs 10-20 s a process), on a local path or ``gs://``. Levanter's ``TreeCache.load`` opens
the result: out_dir/train and out_dir/validation, each a cache of {"input_ids": int32[n]}
rows (one per document, EOS appended), out_dir/validation_docs.parquet (the held-out
documents' id and text, for bits-per-byte evals), and out_dir/stats.json (tokens, bytes,
bytes/token, the tokenizer's identity).

The split is a pure function of the document id (a hash slice), so adding documents never
moves an existing one between train and validation; ``min_validation_docs`` tops a split up
from the smallest remaining ids (the ones nearest the slice) when the slice picks fewer, so a
small shard still holds out a document; train always keeps at least one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from marin_assets.datakit.levanter_cache import CacheWriter
from marin_assets.datakit.shards import join, reset_dir, write_json, write_table
from marin_assets.knobs import knob
from marin_assets.numeric_checks import check_float, check_int

EOS = "<|endoftext|>"
SPLITS = ("train", "validation")
VALIDATION_DOCS = "validation_docs.parquet"
BYTES = "bytes"
# name -> (package, file inside it, what it is)
PRETRAINED = {
    "olmo": (
        "olmo_eval",
        "tokenizers/allenai_gpt-neox-olmo-dolma-v1_5.json",
        "OLMo's GPT-NeoX/Dolma v1.5 BPE (50,280 ids; ai2-olmo-eval's tokenizer.json)",
    )
}
TOKENIZER_NAMES = (*PRETRAINED, BYTES)


def _pretrained_path(name: str) -> str:
    import importlib.util
    import os

    package, relative, _ = PRETRAINED[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"tokenizer {name!r} comes from the {package} package, which is not installed "
            f"(make venv installs it from requirements-nodeps.lock)"
        )
    return os.path.join(list(spec.submodule_search_locations)[0], relative)


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (what HF's ByteLevel uses)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = dict(zip(printable, map(chr, printable))), 0
    for b in range(256):
        if b not in chars:
            chars[b], extra = chr(256 + extra), extra + 1
    return chars


def byte_tokenizer_json() -> str:
    """tokenizer.json of the byte tokenizer: byte b is id b, EOS is 256 (HF tokenizers reads it)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    chars = _byte_to_unicode()
    tok = Tokenizer(models.BPE(vocab={chars[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS])
    return tok.to_str()


def tokenizer_text(spec: str) -> str:
    """The tokenizer.json text of a tokenizer name (``TOKENIZER_NAMES``) or a path/URL to a
    tokenizer.json (or a directory holding one)."""
    return _as_text(_tokenizer_bytes(spec))


def _tokenizer_bytes(spec: str) -> bytes:
    """The bytes of ``spec``'s tokenizer.json (the byte tokenizer's: as byte_tokenizer_json writes it)."""
    import fsspec

    if spec == BYTES:
        return byte_tokenizer_json().encode("utf-8")
    path = _pretrained_path(spec) if spec in PRETRAINED else spec
    if not path.endswith(".json"):
        path = join(path, "tokenizer.json")
    fs, fs_path = fsspec.core.url_to_fs(path)
    try:
        return fs.cat_file(fs_path)
    except FileNotFoundError:
        raise FileNotFoundError(f"tokenizer {spec!r}: {path} does not exist") from None


def _as_text(raw: bytes) -> str:
    """The text a text-mode read of ``raw`` gives (UTF-8, universal newlines: what fsspec.open(mode="r") does)."""
    import io

    return io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8").read()


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class Encoder:
    """What tokenize and the evals need of a tokenizer: ids per text, EOS, vocabulary, identity.

    ``load_encoder`` shares one Encoder per tokenizer.json within a process: treat it (and its
    ``tokenizer``) as read-only."""

    def __init__(self, text: str, where: str = "tokenizer.json"):
        from tokenizers import Tokenizer

        try:
            self.tokenizer = Tokenizer.from_str(text)
        except Exception as e:  # noqa: BLE001 - tokenizers raises its own exception types for bad JSON
            raise ValueError(f"{where} is not a tokenizer.json HF tokenizers can load: {e}") from None
        self.sha256 = _sha256(text)
        self.vocab_size = self.tokenizer.get_vocab_size()
        self.eos_id = self.tokenizer.token_to_id(EOS)
        # Parsing OLMo's JSON again cost ~0.1 s (profiled); only a model of 256 symbols can be ours.
        self.is_bytes = self.tokenizer.get_vocab_size(with_added_tokens=False) == 256 and _is_byte_tokenizer(json.loads(text))
        # Text is data: "<|endoftext|>" inside a document is encoded as its characters, so
        # only the EOS tokenize appends separates documents.
        self.tokenizer.encode_special_tokens = True

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` without EOS (text is data: an EOS string inside it is not the EOS id)."""
        if self.is_bytes:
            return list(text.encode("utf-8"))
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list:
        """int32 id arrays of ``texts``, without EOS."""
        import numpy as np

        if self.is_bytes:
            return [np.frombuffer(t.encode("utf-8"), np.uint8).astype(np.int32) for t in texts]
        return [np.asarray(e.ids, np.int32) for e in self.tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)]


def _is_byte_tokenizer(spec: dict) -> bool:
    """A BPE with no merges over exactly the 256 byte symbols, ids = byte values (ours)."""
    model = spec.get("model") or {}
    chars = _byte_to_unicode()
    return model.get("type") == "BPE" and not model.get("merges") and model.get("vocab") == {chars[b]: b for b in range(256)}


@dataclass(frozen=True)
class TokenizerChoice:
    tokenizer: str = knob("olmo", help=f"tokenizer: a name ({', '.join(TOKENIZER_NAMES)}) or a tokenizer.json path")

    def __post_init__(self) -> None:
        if not isinstance(self.tokenizer, str) or not self.tokenizer or "\n" in self.tokenizer or "\x00" in self.tokenizer:
            raise ValueError(f"tokenizer must be a name ({', '.join(TOKENIZER_NAMES)}) or a path, got {self.tokenizer!r}")


# sha256 of a tokenizer.json's bytes -> its Encoder. Building one from OLMo's tokenizer.json took
# 0.15-0.45 s here (benchmarks/datakit.py encoder_load_s), against 0.5-1 s to tokenize a 1 MB shard
# with it: a worker that tokenizes many shards builds it once (and a forked one inherits it).
_ENCODERS: dict[str, Encoder] = {}
_ENCODERS_KEPT = 4


# A tokenizer name's sha256: its tokenizer.json comes from an installed package (or is ours),
# fixed for the life of the process. A worker calls load_encoder once a shard, and reading and
# hashing OLMo's 2 MB file again took 1.4 ms a call. Paths a user gives are read every time.
_NAMED_DIGESTS: dict[str, str] = {}


def load_encoder(spec: str) -> Encoder:
    """An Encoder for a tokenizer name or a tokenizer.json path/URL (or a directory holding one);
    the same object for the same tokenizer.json bytes within a process."""
    if _NAMED_DIGESTS.get(spec) in _ENCODERS:
        return _ENCODERS[_NAMED_DIGESTS[spec]]
    raw = _tokenizer_bytes(spec)
    digest = hashlib.sha256(raw).hexdigest()
    if spec in TOKENIZER_NAMES:
        _NAMED_DIGESTS[spec] = digest
    encoder = _ENCODERS.get(digest)
    if encoder is None:
        encoder = Encoder(_as_text(raw), where=spec)
        if len(_ENCODERS) >= _ENCODERS_KEPT:
            _ENCODERS.pop(next(iter(_ENCODERS)))
        _ENCODERS[digest] = encoder
    return encoder


@dataclass(frozen=True)
class TokenizeConfig:
    validation_fraction: float = knob(0.02, help="share of documents held out for validation, by id hash")
    min_validation_docs: int = knob(1, help="a shard with fewer held-out documents tops up from the ids nearest the slice")
    batch_docs: int = knob(2048, versioned=False, help="documents per encode batch and per cache write")

    def __post_init__(self):
        check_float("TokenizeConfig.validation_fraction", self.validation_fraction, 0.0, 1.0, hi_open=True)
        check_int("TokenizeConfig.min_validation_docs", self.min_validation_docs, 0)
        check_int("TokenizeConfig.batch_docs", self.batch_docs, 1)


def is_validation(doc_id: str, fraction: float) -> bool:
    # The id is a uniform hash already: its first 8 hex digits are a uniform 32-bit number.
    return int(doc_id[:8], 16) < fraction * 0x100000000


def _iter_batches(shard_paths: Sequence[str], columns: list[str], batch_docs: int) -> Iterator:
    return (batch for _, batch in _iter_shard_batches(shard_paths, columns, batch_docs))


def _iter_shard_batches(shard_paths: Sequence[str], columns: list[str], batch_docs: int) -> Iterator:
    """(shard path, record batch) of every batch of the shards, in order."""
    import fsspec
    import pyarrow.parquet as pq

    for path in shard_paths:
        with fsspec.open(path, "rb") as f:
            for batch in pq.ParquetFile(f).iter_batches(batch_size=batch_docs, columns=columns):
                yield path, batch


def _encoded_batches(encoder: Encoder, shard_paths: Sequence[str], batch_docs: int) -> Iterator:
    """(shard path, ids, texts, UTF-8 byte lengths, token arrays) of every batch of the shards, in
    order. The next batch is encoded on a thread while the caller writes this one: the tokenizer
    releases the GIL, so the writes (Python, tensorstore's compression) overlap the encoding."""
    from concurrent.futures import ThreadPoolExecutor

    def encode(path: str, batch) -> tuple:
        column = batch.column(1)
        if column.null_count:
            raise ValueError(f"{path}: {column.null_count} documents have no text (null)")
        texts = column.to_pylist()
        return path, batch.column(0).to_pylist(), texts, _utf8_sizes(column, texts), encoder.encode_batch(texts)

    with ThreadPoolExecutor(1, thread_name_prefix="tokenize-encode") as pool:
        ahead = None
        for path, batch in _iter_shard_batches(shard_paths, ["id", "text"], batch_docs):
            following = pool.submit(encode, path, batch)
            if ahead is not None:
                yield ahead.result()
            ahead = following
        if ahead is not None:
            yield ahead.result()


def _utf8_sizes(column, texts: list[str]):
    """Each text's UTF-8 bytes: the differences of an Arrow string column's offsets (it stores UTF-8), without
    encoding a text again; any other column type by encoding."""
    import numpy as np

    width = {"string": np.int32, "large_string": np.int64}.get(str(column.type))
    if width is None:
        return np.array([len(t.encode("utf-8")) for t in texts], np.int64)
    offsets = np.frombuffer(column.buffers()[1], width)[column.offset : column.offset + len(column) + 1]
    return np.diff(offsets)


def _validation_top_up(shard_paths: Sequence[str], config: TokenizeConfig) -> frozenset[str]:
    """Ids moved into validation when the hash slice picks fewer than ``min_validation_docs``:
    the smallest ids it did not pick, never so many that train is left empty. A fraction of 0
    asks for no validation at all and gets none."""
    import heapq

    wanted = config.min_validation_docs
    if wanted == 0 or config.validation_fraction == 0:
        return frozenset()
    total = picked = 0
    smallest: list[str] = []  # the `wanted` smallest ids the slice did not pick, so far (sorted)
    for batch in _iter_batches(shard_paths, ["id"], config.batch_docs):
        ids = batch.column(0).to_pylist()
        unpicked = [i for i in ids if not is_validation(i, config.validation_fraction)]
        total, picked = total + len(ids), picked + len(ids) - len(unpicked)
        smallest = heapq.nsmallest(wanted, [*smallest, *unpicked])
    missing = min(wanted, total - 1) - picked
    return frozenset(smallest[:missing]) if missing > 0 else frozenset()


def _write_validation_docs(ids: list[str], texts: list[str], out_dir: str) -> None:
    import pyarrow as pa

    write_table(
        pa.table({"id": pa.array(ids, pa.string()), "text": pa.array(texts, pa.large_string())}), join(out_dir, VALIDATION_DOCS)
    )


def _append_rows(writer: CacheWriter, stats: dict, arrays: list, sizes, rows, eos) -> None:
    """Documents ``rows`` of a batch into one split's cache, each its ids then EOS (written back to
    back in one piece); their documents, tokens and UTF-8 bytes added to ``stats``."""
    import numpy as np

    if not len(rows):
        return
    data = np.concatenate([piece for r in rows for piece in (arrays[r], eos)])
    writer.write_rows(data, np.cumsum([arrays[r].size + 1 for r in rows], dtype=np.int64))
    stats["documents"] += len(rows)
    stats["tokens"] += len(data)
    stats["bytes"] += int(sizes[rows].sum())


def tokenize(
    shard_paths: Sequence[str], tokenizer: str, out_dir: str, config: TokenizeConfig = TokenizeConfig(), progress=None
) -> dict:
    """Tokenize the `text` of shards into Levanter caches out_dir/{train,validation}; return stats.

    ``tokenizer``: a name (``TOKENIZER_NAMES``) or a tokenizer.json path/URL. ``progress``, if
    given, is called with the number of documents done after each batch.
    """
    from concurrent.futures import ThreadPoolExecutor

    import fsspec
    import numpy as np

    encoder = load_encoder(tokenizer)
    if encoder.eos_id is None:
        raise ValueError(f"tokenizer {tokenizer} has no {EOS!r} token (documents are separated by it)")
    eos = np.array([encoder.eos_id], np.int32)
    stats: dict[str, Any] = {s: {"documents": 0, "tokens": 0, "bytes": 0} for s in SPLITS}  # stats.json: per split, then overall
    # Start from empty split dirs and no stats.json: nothing of an earlier cache survives a rerun.
    for s in SPLITS:
        reset_dir(join(out_dir, s))
    fs, root = fsspec.core.url_to_fs(join(out_dir, "stats.json"))
    if fs.exists(root):
        fs.rm(root)
    top_up = _validation_top_up(shard_paths, config)
    held_ids: list[str] = []
    held_texts: list[str] = []
    writers = {s: CacheWriter(join(out_dir, s)) for s in SPLITS}
    failure: BaseException | None = None
    try:
        # The two splits' writes at once (tensorstore waits without the GIL): one round of
        # file writes a batch, not two.
        with ThreadPoolExecutor(1, thread_name_prefix="tokenize-validation") as side:
            for _, ids, texts, sizes, arrays in _encoded_batches(encoder, shard_paths, config.batch_docs):
                held = np.fromiter((i in top_up or is_validation(i, config.validation_fraction) for i in ids), bool, len(ids))
                validation = side.submit(
                    _append_rows, writers["validation"], stats["validation"], arrays, sizes, np.flatnonzero(held), eos
                )
                _append_rows(writers["train"], stats["train"], arrays, sizes, np.flatnonzero(~held), eos)
                validation.result()
                held_ids.extend(i for i, h in zip(ids, held, strict=True) if h)
                held_texts.extend(t for t, h in zip(texts, held, strict=True) if h)
                if progress is not None:
                    progress(len(texts))
    except BaseException as e:
        failure = e
        raise
    finally:
        # The ledger (is_finished=True) is written only when every document made it in; a
        # failed run leaves a cache that Levanter (and our loader) refuse as unfinished.
        for w in writers.values():
            w.__exit__(type(failure) if failure else None, failure, None)
    _write_validation_docs(held_ids, held_texts, out_dir)
    for s in SPLITS:
        stats[s]["bytes_per_token"] = stats[s]["bytes"] / stats[s]["tokens"] if stats[s]["tokens"] else None
    stats["tokenizer"] = {"sha256": encoder.sha256, "vocab_size": encoder.vocab_size, "eos_id": encoder.eos_id}
    stats["vocab_size"] = encoder.vocab_size
    write_json(stats, join(out_dir, "stats.json"))
    return stats
