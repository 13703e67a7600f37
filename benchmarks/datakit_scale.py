"""DataKit at shard scale (issue 12), library level: the fuzzy band reduce's memory.

One JSON line per figure (ratio > 1: we are better):
- fuzzy_band_reduce_peak_heap: peak heap (numpy via tracemalloc + Arrow pool) of the
  largest band reduce over G generated shards, key ranges sized for --docs-per-reduce keys
  (ours) vs the same band reduced in one unsliced range (reference). Reported at 16 and 64
  shards: ours should stay flat while the reference grows with the shard count.
- fuzzy_band_reduce_peak_rss: the same reduces, each in a fresh process: its peak RSS
  (ru_maxrss, imports included: ~100+ MB of numpy/pyarrow/scipy that every step pays, so
  at these sizes it shows the per-process floor more than the reduce itself).
- stage_throughput/<stage>: MB of input text per CPU-second (MB/s/core) of each DataKit stage
  run single-process on one generated corpus (--stage-mb of text, with planted exact and
  near duplicates): normalize (JSONL -> shards), quality (score_quality), exact_dedup
  (exact_map + exact_reduce + exact_removals), fuzzy_dedup (fuzzy_map + fuzzy_band_reduce +
  fuzzy_verify + fuzzy_resolve), decontaminate, tokenize (the pinned "olmo" tokenizer, the
  CLI's default). CPU time of the process (all its threads), so a busy shared machine does
  not bend it; wall MB/s rides along. Setup (models, the tokenizer's load, the eval index,
  imports) is not timed. Reference: for tokenize, the same tokenizer's encode_batch_fast on
  the same texts in memory, in this run; for the other stages, the issue-12 figures measured
  single-process on a 22 MB demo corpus (STAGE_REFERENCE_MB_S: a fixed number, not this run;
  each line says which in reference_is).

Run niced on this shared machine: `nice -n 10 .venv/bin/python benchmarks/datakit_scale.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import emit  # noqa: E402

# Issue 12, "today, single process, 22 MB" (MB/s): what stage_throughput compares the stages
# against (tokenize's 8.1 was measured with a 4096-id BPE trained on the corpus, a tokenizer
# DataKit no longer has: tokenize is compared with its tokenizer's own encoder in the run).
STAGE_REFERENCE_MB_S = {"normalize": 66.0, "quality": 34.0, "exact_dedup": 115.0, "fuzzy_dedup": 4.4, "decontaminate": 6.1}
TOKENIZER = "olmo"
VOCAB = [f"w{i}" for i in range(20000)]


def random_text(rng: random.Random, words: int) -> str:
    """`words` words drawn from VOCAB (the generator every figure here uses)."""
    return " ".join(rng.choice(VOCAB) for _ in range(words))


def make_shards(root: str, shards: int, docs_per_shard: int, config) -> list[str]:
    """Generate shards of short random documents and run fuzzy_map on each; the map roots."""
    import pyarrow as pa

    from marin_assets.datakit.fuzzy_dedup import fuzzy_map
    from marin_assets.datakit.normalize import doc_id
    from marin_assets.datakit.shards import write_table

    rng = random.Random(shards)
    roots = []
    for s in range(shards):
        texts = [random_text(rng, 16) for _ in range(docs_per_shard)]
        path = os.path.join(root, "in", f"s{s:04d}.parquet")
        write_table(pa.table({"id": [doc_id(t) for t in texts], "text": texts}), path)
        roots.append(os.path.join(root, "map", f"s{s:04d}"))
        fuzzy_map(f"s{s:04d}", path, roots[-1], config)
    return roots


def stage_corpus(path: str, mb: float, seed: int = 0) -> tuple[int, list[str]]:
    """Write a JSONL corpus of about `mb` MB of text: documents of 20-1500 words, every 20th
    an exact copy of an earlier one and every 20th an earlier one with a few words changed.
    Returns (text bytes, a few texts to use as eval items, planted in the corpus)."""
    rng = random.Random(seed)
    texts: list[str] = []
    size = 0
    with open(path, "w") as f:
        while size < mb * 1e6:
            i = len(texts)
            if i % 20 == 19:
                text = texts[rng.randrange(i)]
            elif i % 20 == 9:
                words = texts[rng.randrange(i)].split()
                for _ in range(max(1, len(words) // 50)):
                    words[rng.randrange(len(words))] = rng.choice(VOCAB)
                text = " ".join(words)
            else:
                text = random_text(rng, rng.randint(20, 1500))
            texts.append(text)
            size += len(text.encode("utf-8"))
            f.write(json.dumps({"text": text, "id": f"doc-{i}"}) + "\n")
    return size, texts[:: max(1, len(texts) // 20)][:20]


def _cpu_timed(fn) -> tuple[float, float]:
    """(CPU seconds of this process, all threads; wall seconds) of fn()."""
    import time

    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - cpu, time.perf_counter() - wall


def stage_throughput(work: str, mb: float, shard_docs: int) -> None:
    """One JSON line per DataKit stage: MB of input text per CPU-second, single process.

    A warm-up pass through every stage (half the size) comes first, so the timed pass pays
    no first-call imports (the issue counts imports apart from throughput) and finds the
    process's memory pools grown (a cold first normalize measured ~5x slower here).
    """
    warm = os.path.join(work, "warm")
    os.makedirs(warm)
    _run_stages(warm, os.path.join(warm, "corpus.jsonl"), mb / 2, shard_docs)
    timed = os.path.join(work, "timed")
    os.makedirs(timed)
    text_mb, shards, results = _run_stages(timed, os.path.join(timed, "corpus.jsonl"), mb, shard_docs)
    references = {
        stage: (text_mb_s, "issue-12 measurement (a fixed number, not this run)")
        for stage, text_mb_s in STAGE_REFERENCE_MB_S.items()
    }
    encode_cpu, _ = results.pop("tokenize_reference")
    references["tokenize"] = (text_mb / encode_cpu, f"{TOKENIZER} encode_batch_fast on the same texts in memory, this run")
    for stage, (cpu, wall) in results.items():
        ours = text_mb / cpu
        reference, reference_is = references[stage]
        emit(
            f"stage_throughput/{stage}",
            "MB/s/core",
            ours,
            reference,
            higher_is_better=True,
            text_mb=round(text_mb, 2),
            shards=shards,
            cpu_s=round(cpu, 3),
            wall_mb_s=round(text_mb / wall, 2),
            reference_is=reference_is,
        )


def _run_stages(work: str, raw: str, mb: float, shard_docs: int) -> tuple[float, int, dict[str, tuple[float, float]]]:
    """Every stage once over a fresh corpus of `mb` MB: (text MB, shards, {stage: (cpu s, wall s)})."""
    from marin_assets.datakit.decontaminate import DecontamConfig, EvalNgramIndex, decontaminate
    from marin_assets.datakit.dedup_exact import ExactDedupConfig, exact_map, exact_reduce, exact_removals
    from marin_assets.datakit.fuzzy_dedup import (
        FuzzyDedupConfig,
        band_reduce_ranges,
        fuzzy_band_reduce,
        fuzzy_map,
        fuzzy_resolve,
        fuzzy_verify,
    )
    from marin_assets.datakit.normalize import NormalizeConfig, normalize
    from marin_assets.datakit.quality import QualityScoreConfig, score_quality, train_quality_model
    from marin_assets.datakit.shards import basename, list_shards, read_table
    from marin_assets.datakit.tokenize import TokenizeConfig, load_encoder, tokenize

    text_bytes, eval_texts = stage_corpus(raw, mb)
    text_mb = text_bytes / 1e6
    norm = os.path.join(work, "normalized")
    results: dict[str, tuple[float, float]] = {}
    results["normalize"] = _cpu_timed(lambda: normalize(raw, norm, NormalizeConfig(source="bench", shard_docs=shard_docs)))
    shards = list_shards(norm)
    by_key = {basename(p): p for p in shards}

    half = max(1, len(shards) // 2)  # a model to score with (its training is setup, not timed)
    train_quality_model(shards[:half], shards[half:] or shards[:half], os.path.join(work, "quality_model"))
    results["quality"] = _cpu_timed(
        lambda: score_quality(shards, os.path.join(work, "quality_model"), os.path.join(work, "quality"), QualityScoreConfig())
    )

    exact = ExactDedupConfig()
    ex_map, ex_reduce, ex_lists = (os.path.join(work, "exact", d) for d in ("map", "reduce", "lists"))

    def exact_dedup_steps():
        for key, path in by_key.items():
            exact_map(key, path, ex_map, exact)
        for bucket in range(exact.num_buckets):
            exact_reduce(bucket, [ex_map], ex_reduce, exact)
        for key in by_key:
            exact_removals(key, [ex_reduce], os.path.join(ex_lists, f"{key}.jsonl"))

    results["exact_dedup"] = _cpu_timed(exact_dedup_steps)

    fuzzy = FuzzyDedupConfig()
    fz = os.path.join(work, "fuzzy")

    def fuzzy_dedup_steps():
        docs = sum(fuzzy_map(key, path, os.path.join(fz, "map"), fuzzy)["docs"] for key, path in by_key.items())
        ranges = band_reduce_ranges(docs, fuzzy.docs_per_reduce)
        for band in range(fuzzy.bands):
            for r in range(ranges):
                fuzzy_band_reduce(band, (r, ranges), [os.path.join(fz, "map")], os.path.join(fz, "cand"), fuzzy)
        edges = {key: os.path.join(fz, "edges", f"{key}.parquet") for key in by_key}
        for key in by_key:
            fuzzy_verify(
                key, [os.path.join(fz, "cand")], by_key, dict.fromkeys(by_key, os.path.join(fz, "map")), edges[key], fuzzy
            )
        fuzzy_resolve(edges, os.path.join(fz, "removals"))

    results["fuzzy_dedup"] = _cpu_timed(fuzzy_dedup_steps)

    index = EvalNgramIndex.build(((f"eval-{i}", t) for i, t in enumerate(eval_texts)), DecontamConfig())
    results["decontaminate"] = _cpu_timed(lambda: decontaminate(shards, index, os.path.join(work, "decontam")))

    encoder = load_encoder(TOKENIZER)  # its load is setup; tokenize's calls share this Encoder
    texts = [t for path in shards for t in read_table(path, columns=["text"]).column("text").to_pylist()]
    results["tokenize_reference"] = _cpu_timed(lambda: encoder.tokenizer.encode_batch_fast(texts, add_special_tokens=False))
    results["tokenize"] = _cpu_timed(
        lambda: [tokenize([path], TOKENIZER, os.path.join(work, "tokens", basename(path)), TokenizeConfig()) for path in shards]
    )

    return text_mb, len(shards), results


def rss_child(args) -> None:
    """In a fresh process: run one band reduce and print the process's peak RSS in bytes."""
    import resource

    from marin_assets.datakit.fuzzy_dedup import FuzzyDedupConfig, fuzzy_band_reduce

    fuzzy_band_reduce(0, (args.index, args.count), json.loads(args.roots), args.out, FuzzyDedupConfig())
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def peak_rss(roots: list[str], index: int, count: int, out: str) -> int:
    cmd = [sys.executable, os.path.abspath(__file__), "--rss-child", "--roots", json.dumps(roots),
           "--index", str(index), "--count", str(count), "--out", out]  # fmt: skip
    return int(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs-per-shard", type=int, default=1000)
    parser.add_argument("--docs-per-reduce", type=int, default=16000)
    parser.add_argument("--sizes", default="16,64", help="shard counts to measure")
    parser.add_argument("--figures", default="fuzzy_band_reduce,stage_throughput", help="comma list of figure groups to run")
    parser.add_argument("--stage-mb", type=float, default=8.0, help="MB of text in the stage_throughput corpus")
    parser.add_argument("--stage-shard-docs", type=int, default=1000, help="normalize's shard_docs for stage_throughput")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the script runs (numbers are noise)")
    parser.add_argument("--rss-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--roots", help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rss_child:
        rss_child(args)
        return 0
    if args.quick:
        args.stage_mb, args.stage_shard_docs, args.sizes, args.docs_per_shard, args.docs_per_reduce = 0.3, 100, "4", 100, 200

    figures = set(args.figures.split(","))
    unknown = figures - {"fuzzy_band_reduce", "stage_throughput"}
    if unknown:
        parser.error(f"unknown figure groups: {sorted(unknown)}")
    if "stage_throughput" in figures:
        with tempfile.TemporaryDirectory(prefix="datakit_stages_") as work:
            stage_throughput(work, args.stage_mb, args.stage_shard_docs)
    if "fuzzy_band_reduce" in figures:
        fuzzy_band_reduce_figures(args)
    return 0


def fuzzy_band_reduce_figures(args) -> None:
    from marin_assets.datakit.fuzzy_dedup import FuzzyDedupConfig, band_reduce_ranges, fuzzy_band_reduce
    from marin_assets.datakit.memory import peak_heap_bytes

    config = FuzzyDedupConfig()
    with tempfile.TemporaryDirectory(prefix="datakit_scale_") as work:
        for shards in (int(s) for s in args.sizes.split(",")):
            root = os.path.join(work, str(shards))
            roots = make_shards(root, shards, args.docs_per_shard, config)
            ranges = band_reduce_ranges(shards * args.docs_per_shard, args.docs_per_reduce)
            sliced = []
            for r in range(ranges):
                counts, peak = peak_heap_bytes(lambda: fuzzy_band_reduce(0, (r, ranges), roots, os.path.join(root, "c"), config))
                sliced.append((peak, counts["keys"]))
            _, unsliced = peak_heap_bytes(lambda: fuzzy_band_reduce(0, (0, 1), roots, os.path.join(root, "u"), config))
            worst = max(sliced)
            extra = {"shards": shards, "docs": shards * args.docs_per_shard, "ranges": ranges, "keys_in_worst_range": worst[1]}
            print(json.dumps({"name": "fuzzy_band_reduce_peak_heap", "unit": "bytes", "ours": worst[0], "reference": unsliced,
                              "ratio": round(unsliced / worst[0], 3), **extra}), flush=True)  # fmt: skip
            rss_ours = max(peak_rss(roots, r, ranges, os.path.join(root, f"rs{r}")) for r in range(ranges))
            rss_ref = peak_rss(roots, 0, 1, os.path.join(root, "ru"))
            print(json.dumps({"name": "fuzzy_band_reduce_peak_rss", "unit": "bytes", "ours": rss_ours, "reference": rss_ref,
                              "ratio": round(rss_ref / max(rss_ours, 1), 3), **extra}), flush=True)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
