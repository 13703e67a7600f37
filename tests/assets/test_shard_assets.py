"""The sharded DataKit graph (assets/shards/) run partition by partition in real Dagster runs.

One small corpus (two sources' worth of behaviour in one: exact and near duplicates across
shards, low-quality spam, an eval-contaminated document, quarantined records) is indexed
into shards and materialised one partition per run on an ephemeral instance, then one raw
file (one new shard) is added and the graph materialised again. The module fixture does
both passes once; the tests read what each pass computed and wrote.

Stand-ins with the real keys replace the three fixed inputs of the graph that the demo
builds from registry downloads: quality_model, eval_ngrams and tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import dagster as dg
import pytest

from assets.partitions import (
    SHARDS_PER_RUN_ENV,
    datakit_shards,
    exact_buckets,
    fuzzy_bands,
    shard_backfill_policy,
)
from assets.shards import make_shard_assets
from marin_assets.datakit.decontaminate import EvalNgramIndex
from marin_assets.datakit.normalize import doc_id
from marin_assets.datakit.removals import read_removal_list
from marin_assets.datakit.shards import read_table, write_table
from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource, StageContext, versioned_asset
from shard_corpus import EVAL_TEXT, COPIED, NEAR_TARGET, NEW_COPIED, NEW_NEAR_TARGET, SOURCE, base_records, new_records, prose, spam, unsharded_final

QUALITY_THRESHOLD = 0.5
SHARD_BYTES = 2500


# ---------------------------------------------------------------- stand-ins for the fixed inputs
def raw_source(files: dict[str, list]) -> dg.AssetsDefinition:
    """sources/<SOURCE> holding `files` ({name: records or raw lines}), versioned by their bytes."""
    blobs = {name: "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records) for name, records in files.items()}
    digest = hashlib.sha256(json.dumps(blobs, sort_keys=True).encode()).hexdigest()[:16]

    @versioned_asset(key=f"sources/{SOURCE}", code_version=digest)
    def _raw(ctx: StageContext):
        for name, blob in blobs.items():
            Path(ctx.out_dir, name).write_text(blob)
        return {"files": len(blobs)}

    return _raw


def _parquet(out_dir: str, texts: list[str]) -> str:
    import pyarrow as pa

    path = f"{out_dir}/part-00000-of-00001.parquet"
    write_table(pa.table({"id": [doc_id(t) for t in texts], "text": texts}), path)
    return path


@versioned_asset(key="quality_model", code_version="test")
def quality_model(ctx: StageContext):
    from marin_assets.datakit.quality import QualityModelConfig, train_quality_model
    high = _parquet(f"{ctx.scratch_dir}/high", [prose(1000 + i, 60) for i in range(40)])
    low = _parquet(f"{ctx.scratch_dir}/low", [spam(1000 + i) for i in range(40)])
    return train_quality_model([high], [low], ctx.out_dir, QualityModelConfig(num_features=1 << 12, holdout_fraction=0.0))


@versioned_asset(key="eval_ngrams", code_version="test")
def eval_ngrams(ctx: StageContext):
    index = EvalNgramIndex.build([("evalset/1", EVAL_TEXT)])
    index.save(ctx.out_dir)
    return {"ngrams": int(index.num_ngrams)}


@versioned_asset(key="tokenizer", code_version="test")
def tokenizer(ctx: StageContext):
    from marin_assets.datakit.tokenize import TokenizerTrainConfig, train_tokenizer
    train = _parquet(f"{ctx.scratch_dir}/docs", [prose(2000 + i, 60) for i in range(20)])
    return train_tokenizer([train], ctx.out_dir, TokenizerTrainConfig(vocab_size=300))


# ---------------------------------------------------------------- one partition per run
STAGES = [  # (asset keys, partitions of the run: "shards", a static partitions def, or None)
    (["shards/normalized", "shards/quality", "shards/exact_map"], "shards"),
    (["shards/exact_reduce"], exact_buckets),
    (["shards/exact_removals", "shards/filtered_exact", "shards/fuzzy_map", "shards/decontam"], "shards"),
    (["shards/fuzzy_candidates"], fuzzy_bands),
    (["shards/fuzzy_edges"], "shards"),
    (["shards/fuzzy_removals"], None),
    (["shards/final", "shards/tokenized"], "shards"),
]


def materialize_graph(raw: dg.AssetsDefinition, instance, resources) -> dict:
    """Every asset, one partition per run, in dependency order: {(key, partition): metadata}."""
    assets = [raw, quality_model, eval_ngrams, tokenizer, *make_shard_assets({SOURCE: f"sources/{SOURCE}"})]
    by_key = {a.key.to_user_string(): a for a in assets}
    config = {"ops": {by_key["shards/quality"].op.name: {"config": {"threshold": QUALITY_THRESHOLD}},
                      by_key["shards/index"].op.name: {"config": {"shard_bytes": SHARD_BYTES}}}}
    seen: dict = {}

    def run(keys: list[str], partition: str | None) -> None:
        selected = [by_key[k] for k in keys]
        ops = {a.op.name for a in selected}
        result = dg.materialize(assets, selection=selected, partition_key=partition, instance=instance, resources=resources,
                                run_config={"ops": {op: c for op, c in config["ops"].items() if op in ops}})
        assert result.success
        for event in result.get_asset_materialization_events():
            metadata = event.materialization.metadata
            seen[(event.asset_key.to_user_string(), event.partition)] = {k: v.value for k, v in metadata.items()}

    run([f"sources/{SOURCE}", "quality_model", "eval_ngrams", "tokenizer", "shards/index"], None)
    shards = sorted(instance.get_dynamic_partitions(datakit_shards.name))
    for keys, partitions in STAGES:
        for p in shards if partitions == "shards" else partitions.get_partition_keys() if partitions else [None]:
            run(keys, p)
    return seen


def computed(seen: dict, key: str) -> set:
    return {p for (k, p), meta in seen.items() if k == key and not meta["cache_hit"]}


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    """The graph over the base corpus, then again with one more raw file (one new shard)."""
    tmp = tmp_path_factory.mktemp("shards")
    store = ArtifactStoreResource(prefix=str(tmp / "prefix"))
    resources = {"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)}
    instance = dg.DagsterInstance.ephemeral()
    base = {"raw-00000.jsonl": base_records()}
    before = materialize_graph(raw_source(base), instance, resources)
    shards_before = sorted(instance.get_dynamic_partitions(datakit_shards.name))
    final_before = final_documents(store.store, shards_before)
    after = materialize_graph(raw_source({**base, "raw-00001.jsonl": new_records()}), instance, resources)
    shards_after = sorted(instance.get_dynamic_partitions(datakit_shards.name))
    return {"store": store.store, "tmp": tmp, "before": before, "after": after, "shards_before": shards_before,
            "shards_after": shards_after, "final_before": final_before, "base": base}


def final_documents(store, shards: list[str]) -> list[dict]:
    docs = []
    for shard in shards:
        ref = store.read_pointer("shards/final", shard)
        docs += read_table(ref.files(".parquet")[0], columns=["id", "text", "source", "source_id"]).to_pylist()
    return sorted(docs, key=lambda d: (d["id"], d["source"], d["source_id"]))


def shard_of(store, shards: list[str], source_id: str) -> str:
    """The shard whose normalized rows hold `source_id`."""
    [hit] = [s for s in shards if source_id in read_table(store.read_pointer("shards/normalized", s).files(".parquet")[0],
                                                          columns=["source_id"]).column("source_id").to_pylist()]
    return hit


def removal_list(store, key: str, shard: str, sub: str = "") -> list:
    ref = store.read_pointer(key, shard if key != "shards/fuzzy_removals" else None)
    return read_removal_list(f"{ref.data_path}/{sub}{shard}.jsonl")


def test_probe(graph):
    print(sorted(graph["shards_before"]), sorted(graph["shards_after"]))
    for key in sorted({k for k, _ in graph["after"]}):
        print(key, sorted(map(str, computed(graph["after"], key))))
