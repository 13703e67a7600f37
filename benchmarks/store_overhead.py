"""cache_hit: wall time to materialise 200 partitions whose versions are cached (ours)
vs computing the same 200 (reference), through the real store protocol (version hash,
lease, status check, atomic commit). Each partition's work is real: hash and sort ~1,000
documents of stdlib text into a Parquet shard.

    python benchmarks/store_overhead.py [--partitions 200]
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import sysconfig
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

sys.path.insert(0, os.path.dirname(__file__))
from _common import emit, timed  # noqa: E402

from marin_assets.store import ArtifactStore, compute_version  # noqa: E402


def corpus() -> list[str]:
    """Paragraphs of real text that ship with Python (the stdlib's docstrings and sources)."""
    paragraphs = []
    for path in sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:120]:
        with open(path, encoding="utf-8", errors="replace") as f:
            paragraphs += [p for p in f.read().split("\n\n") if len(p) > 80]
    return paragraphs


def shard_writer(docs: list[str], partition: int):
    def compute(out_dir: str) -> dict:
        chunk = docs[(partition * 997) % len(docs) :][:1000] or docs[:1000]
        ids = [xxhash.xxh3_128_hexdigest(t.encode()) for t in chunk]
        order = sorted(range(len(chunk)), key=ids.__getitem__)
        table = pa.table({"id": [ids[i] for i in order], "text": [chunk[i] for i in order]})
        pq.write_table(table, os.path.join(out_dir, "part-00000-of-00001.parquet"), compression="zstd")
        return {"docs": len(chunk)}

    return compute


def materialise_all(store: ArtifactStore, docs: list[str], n: int) -> int:
    computed = 0
    for p in range(n):
        version = compute_version("bench/shards", "1", {"docs": 1000}, f"p{p}")
        result = store.materialize("bench/shards", f"p{p}", version, shard_writer(docs, p), {"bench": True})
        computed += not result.cache_hit
    return computed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--partitions", type=int, default=200)
    args = parser.parse_args()
    docs = corpus()
    with tempfile.TemporaryDirectory() as tmp:
        store = ArtifactStore(tmp)
        compute_s, computed = timed(lambda: materialise_all(store, docs, args.partitions))
        cached_s, recomputed = timed(lambda: materialise_all(store, docs, args.partitions))
    assert computed == args.partitions and recomputed == 0, (computed, recomputed)
    emit("cache_hit", "seconds", cached_s, compute_s, higher_is_better=False, partitions=args.partitions)


if __name__ == "__main__":
    main()
