"""DataKit at shard scale (issue 12), library level: the fuzzy band reduce's memory.

One JSON line per figure (ratio > 1: we are better):
- fuzzy_band_reduce_peak_heap: peak heap (numpy via tracemalloc + Arrow pool) of the
  largest band reduce over G generated shards, key ranges sized for --docs-per-reduce keys
  (ours) vs the same band reduced in one unsliced range (reference). Reported at 16 and 64
  shards: ours should stay flat while the reference grows with the shard count.
- fuzzy_band_reduce_peak_rss: the same reduces, each in a fresh process: its peak RSS
  (ru_maxrss, imports included: ~100+ MB of numpy/pyarrow/scipy that every step pays, so
  at these sizes it shows the per-process floor more than the reduce itself).

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


def make_shards(root: str, shards: int, docs_per_shard: int, config) -> list[str]:
    """Generate shards of short random documents and run fuzzy_map on each; the map roots."""
    import pyarrow as pa

    from marin_assets.datakit.fuzzy_dedup import fuzzy_map
    from marin_assets.datakit.normalize import doc_id
    from marin_assets.datakit.shards import write_table

    rng = random.Random(shards)
    vocab = [f"w{i}" for i in range(20000)]
    roots = []
    for s in range(shards):
        texts = [" ".join(rng.choice(vocab) for _ in range(16)) for _ in range(docs_per_shard)]
        path = os.path.join(root, "in", f"s{s:04d}.parquet")
        write_table(pa.table({"id": [doc_id(t) for t in texts], "text": texts}), path)
        roots.append(os.path.join(root, "map", f"s{s:04d}"))
        fuzzy_map(f"s{s:04d}", path, roots[-1], config)
    return roots


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
    parser.add_argument("--rss-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--roots", help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rss_child:
        rss_child(args)
        return 0

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
    return 0


if __name__ == "__main__":
    sys.exit(main())
