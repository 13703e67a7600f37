"""PII masking throughput: mask_shard on one normalized shard, vs copying the same shard.

Prints one JSON line (ratio > 1: we are better): docs/s of ``mask_shard`` (read, mask, rehash
the changed texts, write) against the same read + write with no masking, so the ratio is the
share of the step that is I/O. Extra: MB/s of text, the documents and PII masked.

Input: --docs documents (default 5,000) of ~2 KB of generated prose that carries what web text
does near PII (years, prices, percentages, dates, times, version numbers, URLs), an "@handle"
in one document in ten, and an e-mail address, a phone number or an IP address in about one
document in five. Each
side is timed --repeats times, interleaved, best kept (the machine is shared).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
from typing import cast

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # run as a script: the repository root and this folder
sys.path.insert(0, HERE)
from _common import emit, timed  # noqa: E402

WORDS = (
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at", "from", "this", "have",
    "are", "it", "an", "be", "not", "or", "which", "their", "market", "report", "council", "school", "river", "project",
    "season", "data", "energy", "water", "policy", "system", "team", "study", "city",
)  # fmt: skip
NUMBERS = (
    "in {year}", "${n}.{d:02d}", "{n}%", "{year}-{m:02d}-{day:02d}", "{h}:{mi:02d} pm", "version {a}.{b}.{c}",
    "Python 3.{b}.{c}", "page {n}", "{n},{d:03d} people", "https://example.com/news/{year}/{n}",
)  # fmt: skip
PII = ("mail {name}@example.org", "call ({n:03d}) 555-{d:04d}", "host 192.168.{a}.{b}", "{name}.{name}@mail.example.com")


def document(rng: random.Random, target_bytes: int = 2000) -> str:
    parts: list[str] = []
    size = 0
    while size < target_bytes:
        sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 20)))
        if rng.random() < 0.5:
            sentence += " " + rng.choice(NUMBERS).format(**fields(rng))
        parts.append(sentence.capitalize() + ".")
        size += len(parts[-1]) + 1
    if rng.random() < 0.1:  # "@" without an address
        parts.insert(rng.randrange(len(parts)), "Follow @team{n} for more.".format(**fields(rng)))
    if rng.random() < 0.2:
        parts.insert(rng.randrange(len(parts)), rng.choice(PII).format(**fields(rng)) + ".")
    return " ".join(parts)


def fields(rng: random.Random) -> dict:
    return {
        "year": rng.randint(1900, 2025), "n": rng.randint(200, 999), "d": rng.randint(0, 999), "m": rng.randint(1, 12),
        "day": rng.randint(1, 28), "h": rng.randint(1, 12), "mi": rng.randint(0, 59), "a": rng.randint(0, 20),
        "b": rng.randint(0, 20), "c": rng.randint(0, 20), "name": rng.choice(WORDS),
    }  # fmt: skip


def write_shard(path: str, docs: int) -> int:
    import pyarrow as pa

    from marin_assets.datakit.normalize import doc_id, schema
    from marin_assets.datakit.shards import write_table

    rng = random.Random(0)
    texts = [document(rng) for _ in range(docs)]
    rows = {"id": [doc_id(t) for t in texts], "text": texts, "source": ["bench"] * docs,
            "source_id": [str(i) for i in range(docs)], "metadata": ["{}"] * docs}  # fmt: skip
    write_table(pa.table(rows, schema=schema()), path)
    return sum(len(t.encode("utf-8")) for t in texts)


def copy_shard(in_path: str, out_path: str) -> None:
    from marin_assets.datakit.shards import read_table, write_table

    write_table(read_table(in_path), out_path)


def main() -> None:
    from marin_assets.datakit.pii import mask_shard

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--docs", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        shard = f"{tmp}/in.parquet"
        text_bytes = write_shard(shard, args.docs)
        ours, reference = float("inf"), float("inf")
        result: dict = {}
        for _ in range(args.repeats):
            seconds, counts = timed(lambda: mask_shard(shard, f"{tmp}/masked.parquet"))
            result = cast(dict, counts)
            ours = min(ours, seconds)
            reference = min(reference, timed(lambda: copy_shard(shard, f"{tmp}/copy.parquet"))[0])
    emit("pii_mask_shard", "docs/s", args.docs / ours, args.docs / reference, higher_is_better=True,
         text_mb_s=round(text_bytes / ours / 1e6, 3), mask_s=round(ours, 4), copy_s=round(reference, 4), **result)  # fmt: skip


if __name__ == "__main__":
    main()
