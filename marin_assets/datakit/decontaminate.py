"""Decontamination: a 13-gram Bloom filter over eval sets, per-paragraph overlap scoring.

Marin's published rule (github.com/marin-community/marin, DataKit docs): whitespace tokens (lowercased), 13-grams, n-grams
without any letter dropped; for each paragraph (a line) overlap = n-grams found in the eval
filter / n-grams of the paragraph; a document is contaminated when its maximum paragraph
overlap is >= 0.5. False positives are acceptable, false negatives are not, so the Bloom
filter is sized for a tiny false-positive rate (default 1e-9).

Short text: a paragraph (or eval item) with fewer than ``ngram`` tokens has no 13-gram and
could never match. Following Dolma's decontamination, one with at least
``short_min_tokens`` tokens uses its whole token sequence as a single n-gram, so a short
eval item (an ARC question with its answer, say) copied as its own paragraph is still found.

The sidecar maps each inserted n-gram hash back to the eval items that contain it; it is
two sorted numpy arrays (hash, item number) rather than a Python dict, so it is compact and
saves as ``.npy`` next to the filter bits.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import fsspec
import numpy as np
import pyarrow as pa
import xxhash

from marin_assets.datakit.attribute_files import (
    attribute_path,
    check_unique_basenames,
    read_id_text,
    write_table,
)
from marin_assets.datakit.bloom import BloomFilter
from marin_assets.datakit.eval_sets import eval_task
from marin_assets.datakit.hashing import distinct_words, mix64
from marin_assets.datakit.shards import read_table, reset_dir
from marin_assets.knobs import knob
from marin_assets.numeric_checks import check_float, check_int

_LETTER = re.compile(r"[^\W\d_]")  # a Unicode letter


@dataclass(frozen=True)
class DecontamConfig:
    ngram: int = 13
    false_positive_rate: float = knob(1e-9, help="false-positive rate of the eval 13-gram Bloom filter")
    threshold: float = knob(0.5, help="a document is contaminated when its largest paragraph overlap reaches this")
    short_min_tokens: int = 8
    capacity: int | None = None  # Bloom capacity; None: the number of distinct eval n-grams

    def __post_init__(self) -> None:
        check_int("DecontamConfig.ngram", self.ngram, 1)
        check_float("DecontamConfig.false_positive_rate", self.false_positive_rate, 0.0, 1.0, lo_open=True, hi_open=True)
        check_float("DecontamConfig.threshold", self.threshold, 0.0, 1.0, lo_open=True)
        check_int("DecontamConfig.short_min_tokens", self.short_min_tokens, 1)
        if self.capacity is not None:
            check_int("DecontamConfig.capacity", self.capacity, 1)


def _token_code(token: str) -> tuple[int, bool]:
    return xxhash.xxh3_64_intdigest(token.encode("utf-8", "surrogatepass")), _LETTER.search(token) is not None


def _token_arrays(tokens: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(uint64 hash, has a letter) per token."""
    codes = [_token_code(t) for t in tokens]
    token_hash = np.fromiter((c[0] for c in codes), dtype=np.uint64, count=len(codes))
    has_letter = np.fromiter((c[1] for c in codes), dtype=np.int64, count=len(codes))
    return token_hash, has_letter


def _token_arrays_many(tokens: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``_token_arrays`` for a long list of words, each distinct word hashed once."""
    words, index = distinct_words(tokens)
    words_hash, words_letter = _token_arrays(words)
    return words_hash[index], words_letter[index]


def _windows(token_hash: np.ndarray, has_letter: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(hash of every n-token window, whether the window holds a letter), window i = tokens i..i+n-1."""
    count = token_hash.size - n + 1
    h = np.zeros(count, dtype=np.uint64)
    for k in range(n):
        h = (h ^ token_hash[k : k + count]) * np.uint64(0x9E3779B97F4A7C15)
    letters = np.concatenate([[0], np.cumsum(has_letter)])
    return mix64(h ^ np.uint64(n)), (letters[n:] - letters[:-n]) > 0


def ngram_hashes(text: str, config: DecontamConfig = DecontamConfig()) -> np.ndarray:
    """uint64 hashes of the lowercase whitespace-token n-grams of ``text`` that contain a
    letter, in order (a short text yields at most one, see the module docstring)."""
    tokens = text.lower().split()
    if not tokens:
        return np.zeros(0, dtype=np.uint64)
    token_hash, has_letter = _token_arrays(tokens)
    n = config.ngram
    if len(tokens) < n:
        if len(tokens) < config.short_min_tokens or not has_letter.any():
            return np.zeros(0, dtype=np.uint64)
        n = len(tokens)
    h, lettered = _windows(token_hash, has_letter, n)
    return h[lettered]


def _whole_text_hashes(texts: list[list[str]]) -> tuple[np.ndarray, np.ndarray]:
    """The one n-gram of each short text (n = its own length, see ``ngram_hashes``), for the
    texts with a letter: (hashes, positions in ``texts``). Texts of one length fold as a matrix."""
    lengths = np.array([len(t) for t in texts], dtype=np.int64)
    token_hash, has_letter = _token_arrays_many([tok for t in texts for tok in t])
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    parts_h, parts_i = [], []
    for length in np.unique(lengths):
        which = np.flatnonzero(lengths == length)
        columns = starts[which][:, None] + np.arange(length)[None, :]
        h = np.zeros(which.size, dtype=np.uint64)
        for k in range(length):
            h = (h ^ token_hash[columns[:, k]]) * np.uint64(0x9E3779B97F4A7C15)
        lettered = has_letter[columns].any(axis=1)
        parts_h.append(mix64(h ^ np.uint64(length))[lettered])
        parts_i.append(which[lettered])
    return np.concatenate(parts_h), np.concatenate(parts_i)


def ngram_hashes_many(texts: Sequence[str], config: DecontamConfig = DecontamConfig()) -> tuple[np.ndarray, np.ndarray]:
    """``ngram_hashes`` of many texts at once: (hashes, index of the text each came from),
    texts in order. One pass of array work over every text's tokens, each distinct word hashed
    once: what building an index over tens of thousands of short eval items needs."""
    n = config.ngram
    split = [t.lower().split() for t in texts]
    long_ones = [i for i, tokens in enumerate(split) if len(tokens) >= n]
    parts_h, parts_i = [], []
    if long_ones:
        tokens = [tok for i in long_ones for tok in split[i]]
        text_of = np.repeat(np.asarray(long_ones, dtype=np.int64), [len(split[i]) for i in long_ones])
        h, lettered = _windows(*_token_arrays_many(tokens), n)
        keep = lettered & (text_of[: h.size] == text_of[n - 1 :])  # windows inside one text
        parts_h.append(h[keep])
        parts_i.append(text_of[: h.size][keep])
    short_ones = [i for i, tokens in enumerate(split) if config.short_min_tokens <= len(tokens) < n]
    if short_ones:
        hashes, index = _whole_text_hashes([split[i] for i in short_ones])
        parts_h.append(hashes)
        parts_i.append(np.asarray(short_ones, dtype=np.int64)[index])
    if not parts_h:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    hashes, text_index = np.concatenate(parts_h), np.concatenate(parts_i)
    order = np.argsort(text_index, kind="stable")  # texts in order, each text's n-grams in order
    return hashes[order], text_index[order]


def _run_starts(sorted_hashes: np.ndarray) -> np.ndarray:
    """True where a run of equal values starts in a sorted array."""
    starts = np.ones(sorted_hashes.size, dtype=bool)
    starts[1:] = sorted_hashes[1:] != sorted_hashes[:-1]
    return starts


def _paragraphs(text: str) -> list[str]:
    return [p for p in text.split("\n") if p.strip()]


class EvalNgramIndex:
    """Bloom filter of eval n-grams plus the sidecar from n-gram hash to eval ids."""

    def __init__(
        self,
        config: DecontamConfig,
        bloom: BloomFilter,
        sidecar_hashes: np.ndarray,
        sidecar_items: np.ndarray,
        eval_ids: list[str],
        skipped_items: int = 0,
    ):
        self.config = config
        self.bloom = bloom
        self.sidecar_hashes = sidecar_hashes
        self.sidecar_items = sidecar_items
        self.eval_ids = eval_ids
        self.skipped_items = skipped_items  # items too short to yield any n-gram

    @classmethod
    def build(cls, items: Iterable[tuple[str, str]], config: DecontamConfig = DecontamConfig()) -> EvalNgramIndex:
        items = list(items)
        for eval_id, text in items:
            if not isinstance(text, str):
                raise ValueError(f"eval item {eval_id!r}: text must be a string, got {type(text).__name__}")
        hashes, text_index = ngram_hashes_many([text for _, text in items], config)
        # Items without any n-gram are skipped; the others are numbered in order.
        has_grams = np.zeros(len(items), dtype=bool)
        has_grams[text_index] = True
        number = np.cumsum(has_grams) - 1
        eval_ids = [str(eval_id) for (eval_id, _), kept in zip(items, has_grams, strict=True) if kept]
        skipped = len(items) - len(eval_ids)
        item_of = number[text_index].astype(np.int32)
        # One sort for every item: by hash, then item; each (hash, item) pair kept once.
        order = np.lexsort((item_of, hashes))
        hashes, item_of = hashes[order], item_of[order]
        keep = np.ones(hashes.size, dtype=bool)
        keep[1:] = (hashes[1:] != hashes[:-1]) | (item_of[1:] != item_of[:-1])
        hashes, item_of = hashes[keep], item_of[keep]
        distinct = hashes[_run_starts(hashes)]
        bloom = BloomFilter.for_capacity(config.capacity or max(1, distinct.size), config.false_positive_rate)
        bloom.add(distinct)
        return cls(config, bloom, hashes, item_of, eval_ids, skipped)

    @property
    def num_ngrams(self) -> int:
        return int(np.count_nonzero(_run_starts(self.sidecar_hashes)))

    def eval_ids_for(self, hashes: np.ndarray) -> list[str]:
        """Sorted eval ids whose n-grams include any of ``hashes`` (Bloom false positives,
        which are not in the sidecar, map to nothing)."""
        hashes = np.unique(np.asarray(hashes, dtype=np.uint64))
        lo = np.searchsorted(self.sidecar_hashes, hashes, side="left")
        hi = np.searchsorted(self.sidecar_hashes, hashes, side="right")
        items: set[int] = set()
        for a, b in zip(lo, hi, strict=True):
            items.update(self.sidecar_items[a:b].tolist())
        return sorted(self.eval_ids[i] for i in items)

    def merge(self, other: EvalNgramIndex) -> EvalNgramIndex:
        """Union of two indexes (bit-OR of the filters; both need the same shape, so build
        them with the same ``capacity`` and false-positive rate)."""
        if (self.config.ngram, self.config.short_min_tokens) != (other.config.ngram, other.config.short_min_tokens):
            raise ValueError("cannot merge indexes built with different n-gram settings")
        bloom = self.bloom.union(other.bloom)
        hashes = np.concatenate([self.sidecar_hashes, other.sidecar_hashes])
        items = np.concatenate([self.sidecar_items, other.sidecar_items + np.int32(len(self.eval_ids))])
        order = np.argsort(hashes, kind="stable")
        return EvalNgramIndex(
            self.config,
            bloom,
            hashes[order],
            items[order],
            self.eval_ids + other.eval_ids,
            self.skipped_items + other.skipped_items,
        )

    def save(self, directory: str) -> None:
        fs, root = fsspec.core.url_to_fs(directory)
        fs.makedirs(root, exist_ok=True)
        for name, array in [
            ("bloom.npy", self.bloom.bits),
            ("sidecar_hashes.npy", self.sidecar_hashes),
            ("sidecar_items.npy", self.sidecar_items),
        ]:
            with fs.open(posixpath.join(root, name), "wb") as f:
                np.save(f, array)
        meta = {
            "config": asdict(self.config),
            "num_bits": self.bloom.num_bits,
            "num_probes": self.bloom.num_probes,
            "skipped_items": self.skipped_items,
            "eval_ids": self.eval_ids,
        }
        with fs.open(posixpath.join(root, "index.json"), "w") as f:
            json.dump(meta, f)

    @classmethod
    def load(cls, directory: str) -> EvalNgramIndex:
        fs, root = fsspec.core.url_to_fs(directory)
        try:
            with fs.open(posixpath.join(root, "index.json"), "r") as f:
                meta = json.load(f)
            arrays = {}
            for name in ["bloom", "sidecar_hashes", "sidecar_items"]:
                with fs.open(posixpath.join(root, f"{name}.npy"), "rb") as f:
                    arrays[name] = np.load(f)
        except FileNotFoundError as e:
            raise FileNotFoundError(f"no eval n-gram index in {directory}: {e}") from None
        bloom = BloomFilter(meta["num_bits"], meta["num_probes"], arrays["bloom"])
        return cls(
            DecontamConfig(**meta["config"]),
            bloom,
            arrays["sidecar_hashes"],
            arrays["sidecar_items"],
            meta["eval_ids"],
            meta["skipped_items"],
        )


OTHER_EVALS = "other"  # the task name of an eval item that is not one of the packaged tasks (a user's jsonl)


def leaked_tasks(eval_ids: Iterable[str]) -> list[str]:
    """The eval tasks the ids belong to (packaged ids read ``<task>/...``), sorted; items of a
    user's own eval files count as ``OTHER_EVALS``."""
    return sorted({eval_task(eval_id) or OTHER_EVALS for eval_id in eval_ids})


SCORE_BATCH_DOCS = 1024  # documents scored per array pass: bounds memory by the batch, not the shard


def score_text(index: EvalNgramIndex, text: str) -> tuple[float, list[str]]:
    """(max paragraph overlap, eval ids whose n-grams appear in the document)."""
    (overlap,), (eval_ids,) = score_texts(index, [text])
    return overlap, eval_ids


def score_texts(index: EvalNgramIndex, texts: Sequence[str]) -> tuple[list[float], list[list[str]]]:
    """``score_text`` of every text, computed over all their paragraphs at once: one n-gram
    pass, one Bloom lookup, per-paragraph hit rates by bincount, per-document maxima by reduceat."""
    paragraphs = [_paragraphs(t) for t in texts]
    counts = np.array([len(p) for p in paragraphs], dtype=np.int64)
    flat = [p for ps in paragraphs for p in ps]
    hashes, paragraph_of = ngram_hashes_many(flat, index.config)
    hits = index.bloom.contains(hashes)
    sizes = np.bincount(paragraph_of, minlength=len(flat))
    hit_counts = np.bincount(paragraph_of, weights=hits, minlength=len(flat))
    overlap = np.divide(hit_counts, sizes, out=np.zeros(len(flat)), where=sizes > 0)
    overlaps = np.zeros(len(texts))
    has_any = counts > 0
    if flat:
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])[has_any]
        overlaps[has_any] = np.maximum.reduceat(overlap, starts)
    doc_of_paragraph = np.repeat(np.arange(len(texts)), counts)
    matched: list[list[str]] = [[] for _ in texts]
    hit_hashes, hit_docs = hashes[hits], doc_of_paragraph[paragraph_of[hits]]
    for doc in np.unique(hit_docs):
        matched[doc] = index.eval_ids_for(hit_hashes[hit_docs == doc])
    return overlaps.tolist(), matched


def _shard_scores(index: EvalNgramIndex, path: str) -> tuple[list[str], list[float], list[list[str]]]:
    """(ids, max overlaps, matched eval ids) of one shard's documents. An index without a single
    n-gram (no eval set given: `marin datakit run` without --eval) matches nothing, so the texts are
    neither read nor hashed (that cost ~2.3 s per run for a foregone answer)."""
    if not index.eval_ids:
        ids = read_table(path, columns=["id"]).column("id").to_pylist()
        return ids, [0.0] * len(ids), [[] for _ in ids]
    ids, texts = read_id_text(path)
    overlaps, matched = [], []
    for start in range(0, len(texts), SCORE_BATCH_DOCS):
        batch_overlaps, batch_matched = score_texts(index, texts[start : start + SCORE_BATCH_DOCS])
        overlaps += batch_overlaps
        matched += batch_matched
    return ids, overlaps, matched


def decontaminate(
    shard_paths: list[str],
    index: EvalNgramIndex,
    out_dir: str,
    config: DecontamConfig | None = None,
) -> dict[str, int]:
    """Score every document of every shard; write co-partitioned attribute files with
    ``id, max_overlap, contaminated, matched_eval_ids`` (same basename, same row order).

    ``config`` may change the threshold; its n-gram settings must match the index's.
    """
    config = config or index.config
    if (config.ngram, config.short_min_tokens) != (index.config.ngram, index.config.short_min_tokens):
        raise ValueError(
            f"config n-gram settings ({config.ngram}, {config.short_min_tokens}) differ from the "
            f"index's ({index.config.ngram}, {index.config.short_min_tokens})"
        )
    check_unique_basenames(shard_paths)
    reset_dir(out_dir)
    counts = {"docs": 0, "contaminated": 0, "shards": len(shard_paths)}
    for path in shard_paths:
        ids, overlaps, matched = _shard_scores(index, path)
        flags = [overlap >= config.threshold for overlap in overlaps]
        table = pa.table(
            {
                "id": pa.array(ids, type=pa.string()),
                "max_overlap": pa.array(overlaps, type=pa.float64()),
                "contaminated": pa.array(flags, type=pa.bool_()),
                "matched_eval_ids": pa.array(matched, type=pa.list_(pa.string())),
            }
        )
        write_table(table, attribute_path(out_dir, path))
        counts["docs"] += len(ids)
        counts["contaminated"] += int(sum(flags))
    return counts
