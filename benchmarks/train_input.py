"""train_input: tokens/s the trainer's loader delivers from 64 shard caches vs from one cache.

The same token rows (random ids of OLMo's vocabulary, documents of 50-2000 tokens ending in
EOS) are written twice with the real CacheWriter: once as --shards shard caches (a dataset
index, dataset.json, over them: what `marin datakit run` leaves for `marin train`) and once
as a single cache under a one-shard index. Each side is read the way the trainer reads it:
``open_source`` -> ``MixedLoader`` (Feistel shuffle over the source's global window index)
-> ``iterate`` with the trainer's default prefetch, from a fresh loader (so the lazy opening
of the shard caches is inside the timing), for --batches batches.

One JSON line (ratio > 1: we are better; target >= 0.9):
  train_input  tokens/s from the shard caches (ours) vs from the one cache (reference),
               best of --repeats, the sides alternating; ``identical`` says every batch of
               the two sides was equal (the run fails otherwise).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from _common import emit  # noqa: E402

VOCAB, EOS = 50280, 50279  # OLMo's tokenizer (marin_assets/datakit/tokenize.py PRETRAINED["olmo"])


def documents(tokens: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(every document's ids back to back, each ending in EOS; each document's end) of about `tokens` tokens."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(50, 2001, size=tokens // 1000 + 16)
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), tokens)) + 1]
    ends = np.cumsum(lengths, dtype=np.int64)
    data = rng.integers(0, EOS, size=int(ends[-1]), dtype=np.int32)
    data[ends - 1] = EOS
    return data, ends


def write_split(split_dir: str, data: np.ndarray, ends: np.ndarray) -> None:
    """One Levanter cache of these rows, through the CacheWriter shards/tokenized uses, in its batches."""
    from marin_assets.datakit.levanter_cache import CacheWriter
    from marin_assets.datakit.tokenize import TokenizeConfig

    per_write = TokenizeConfig().batch_docs
    with CacheWriter(split_dir) as writer:
        for lo in range(0, len(ends), per_write):
            first = int(ends[lo - 1]) if lo else 0
            chunk = ends[lo : lo + per_write]
            writer.write_rows(data[first : int(chunk[-1])], chunk - first)


def write_dataset_of(root: str, name: str, data: np.ndarray, ends: np.ndarray, shards: int) -> str:
    """A dataset index over `shards` caches that split the documents in order; returns its folder."""
    from marin_assets.datakit.datasets import Dataset, ShardCache, write_dataset

    cuts = np.linspace(0, len(ends), shards + 1).astype(int)
    entries = []
    for s in range(shards):
        lo, hi = int(cuts[s]), int(cuts[s + 1])
        first = int(ends[lo - 1]) if lo else 0
        path = os.path.join(root, name, f"shard-{s:05d}")
        write_split(os.path.join(path, "train"), data[first : int(ends[hi - 1])], ends[lo:hi] - first)
        entries.append(ShardCache(f"bench-{s:05d}", "bench", path, int(ends[hi - 1]) - first, 0, hi - lo, 0))
    index_dir = os.path.join(root, name, "index")
    write_dataset(Dataset(name, tuple(entries), {"vocab_size": VOCAB, "eos_id": EOS}), index_dir)
    return index_dir


def read_batches(index_dir: str, seq_len: int, batch_size: int, batches: int) -> tuple[float, float, list[np.ndarray]]:
    """(seconds, CPU seconds of the process, the batches) of `batches` batches through a fresh
    loader, read as the trainer reads them."""
    from marin_assets.train.config import TrainConfig
    from marin_assets.train.data.batches import DataPosition, MixedLoader
    from marin_assets.train.data.token_caches import open_source

    start, cpu = time.perf_counter(), time.process_time()
    loader = MixedLoader({"bench": open_source(index_dir).train}, seq_len, batch_size, seed=0, vocab_size=VOCAB)
    out = []
    stream = loader.iterate(DataPosition(), prefetch=TrainConfig.prefetch)
    for _ in range(batches):
        tokens, ok, _ = next(stream)
        assert ok, "a batch flagged out of vocabulary"
        out.append(tokens)
    seconds, cpu_s = time.perf_counter() - start, time.process_time() - cpu
    stream.close()
    # iterate() does not join its prefetch thread; one still inside a tensorstore read when the
    # interpreter exits aborts the process ("terminate called without an active exception").
    for thread in threading.enumerate():
        if thread.name == "marin-data-prefetch":
            thread.join()
    return seconds, cpu_s, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32_000_000, help="tokens in the dataset (both sides)")
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one repeat: checks the script runs (numbers are noise)")
    args = parser.parse_args(argv)
    if args.quick:
        args.tokens, args.batches, args.repeats, args.seq_len = 300_000, 10, 1, 256

    work = tempfile.mkdtemp(prefix="train_input_")
    try:
        data, ends = documents(args.tokens)
        sides = {
            "one_cache": write_dataset_of(work, "one", data, ends, 1),
            "shards": write_dataset_of(work, "sharded", data, ends, args.shards),
        }
        best = {side: float("inf") for side in sides}
        best_cpu = dict(best)
        seen: dict[str, list[np.ndarray]] = {}
        for _ in range(args.repeats):
            for side, index_dir in sides.items():
                seconds, cpu_s, got = read_batches(index_dir, args.seq_len, args.batch_size, args.batches)
                best[side], best_cpu[side] = min(best[side], seconds), min(best_cpu[side], cpu_s)
                seen[side] = got
        identical = all(np.array_equal(a, b) for a, b in zip(seen["shards"], seen["one_cache"], strict=True))
        if not identical:
            raise SystemExit("train_input: the shard caches and the one cache gave different batches")
        tokens = args.batches * args.batch_size * args.seq_len
        emit(
            "train_input",
            "tokens/s",
            tokens / best["shards"],
            tokens / best["one_cache"],
            higher_is_better=True,
            shards=args.shards,
            dataset_tokens=int(ends[-1]),
            seq_len=args.seq_len,
            batch_size=args.batch_size,
            batches=args.batches,
            identical=identical,
            ours_s=round(best["shards"], 3),
            reference_s=round(best["one_cache"], 3),
            cpu_ratio=round(best_cpu["one_cache"] / best_cpu["shards"], 4),
            reader="open_source -> MixedLoader.iterate (Feistel shuffle over the global window index)",
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
