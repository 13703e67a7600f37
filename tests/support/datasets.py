"""Stand-in ``datasets/<source>`` assets: real byte-level shard caches and a real dataset
index, made from small texts, for tests of what reads the DataKit's datasets (the mixture,
training phases, evals, the ladder) without running the sharded graph.

Tokens are what the code location's byte tokenizer writes (tests/support/byte_tokens.py: one
id per UTF-8 byte, EOS 256), written by tests/support/caches.py, so a ``vocab_size`` 257 model
trains on them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence

import dagster as dg

from marin_assets.datakit.datasets import Dataset, ShardCache, write_dataset
from marin_assets.orchestration import StageContext, versioned_asset
from tests.support.byte_tokens import EOS, VOCAB_SIZE, token_count
from tests.support.caches import write_cache


def write_shard(out_dir: str, key: str, train: Sequence[str], validation: Sequence[str]) -> ShardCache:
    """One shard's caches (train/, validation/, validation_docs.parquet) under out_dir/key, and its final
    documents (documents.parquet: the held-out ones first, ids as in validation_docs.parquet)."""
    import pyarrow as pa

    from marin_assets.datakit.shards import join, write_table
    from marin_assets.datakit.tokenize import VALIDATION_DOCS

    root = join(out_dir, key)
    train_tokens, validation_tokens = write_cache(join(root, "train"), train), write_cache(join(root, "validation"), validation)
    ids = [f"{i:032x}" for i in range(len(validation) + len(train))]
    write_table(pa.table({"id": ids[: len(validation)], "text": list(validation)}), join(root, VALIDATION_DOCS))
    write_table(pa.table({"id": ids, "text": [*validation, *train]}), join(root, "documents.parquet"))
    return ShardCache(
        key,
        hashlib.sha256(json.dumps([train, validation]).encode()).hexdigest(),
        root,
        train_tokens,
        validation_tokens,
        len(train),
        len(validation),
        documents=join(root, "documents.parquet"),
    )


def counted_shard(out_dir: str, key: str, train: Sequence[str], validation: Sequence[str]) -> ShardCache:
    """A shard entry with the counts the texts would give, and no caches (for readers of the
    index alone, on filesystems tensorstore cannot write: memory://)."""
    return ShardCache(
        key, "counted", f"{out_dir.rstrip('/')}/{key}", token_count(train), token_count(validation), len(train), len(validation)
    )


def byte_tokenizer_identity() -> dict:
    """The tokenizer record of a dataset the code location's byte tokenizer wrote (what the tokenizer asset
    and the chat dataset record), so a stand-in and a real byte-level dataset can be trained on together."""
    from marin_assets.datakit.tokenize import load_encoder

    encoder = load_encoder("bytes")
    assert (encoder.vocab_size, encoder.eos_id) == (VOCAB_SIZE, EOS)
    return {"sha256": encoder.sha256, "vocab_size": VOCAB_SIZE, "eos_id": EOS}


def byte_dataset_asset(
    source: str, shards: Sequence[tuple[Sequence[str], Sequence[str]]], caches: bool = True
) -> dg.AssetsDefinition:
    """datasets/<source> over ``shards`` ([(train texts, validation texts)] per shard), versioned by
    the texts; ``caches=False`` writes the index and counts only."""
    digest = hashlib.sha256(json.dumps([source, [list(map(list, s)) for s in shards], caches]).encode()).hexdigest()[:16]
    make = write_shard if caches else counted_shard

    @versioned_asset(key=f"datasets/{source}", code_version=f"test.{digest}")
    def _dataset(ctx: StageContext):
        caches = [make(ctx.out_dir, f"{source}-test-{i:05d}", train, held) for i, (train, held) in enumerate(shards)]
        dataset = Dataset(source, tuple(caches), byte_tokenizer_identity())
        write_dataset(dataset, ctx.out_dir)
        return {
            "shards": len(caches),
            "train_tokens": dataset.train_tokens,
            "validation_tokens": dataset.validation_tokens,
            "train_docs": sum(c.train_docs for c in caches),
            "validation_docs": sum(c.validation_docs for c in caches),
            "vocab_size": VOCAB_SIZE,
        }

    return _dataset


def byte_datasets(
    texts: Mapping[str, tuple[Sequence[str], Sequence[str]]], shards_per_source: int = 1, caches: bool = True
) -> list[dg.AssetsDefinition]:
    """One stand-in dataset per source ({source: (train texts, validation texts)}), each split
    over ``shards_per_source`` shards (round-robin), so readers cross shard boundaries."""
    out = []
    for source, (train, held) in texts.items():
        parts = [(list(train[i::shards_per_source]), list(held[i::shards_per_source])) for i in range(shards_per_source)]
        out.append(byte_dataset_asset(source, parts, caches))
    return out


def mixture_run_config(weights: Mapping[str, float]) -> dict:
    """Run config of the real ``mixture`` asset for one stage of ``weights``."""
    return {"ops": {"mixture": {"config": {"schedule": [{"step": 0, "weights": dict(weights)}]}}}}
