"""The DataKit graph (assets/datakit/) run partition by partition in real Dagster runs.

One small corpus (two sources' worth of behaviour in one: exact and near duplicates across
shards, low-quality spam, an eval-contaminated document, quarantined records) is indexed
into shards and materialised one partition per run on an ephemeral instance, then one raw
file (one new shard) is added and the graph materialised again. The module fixture does
both passes once; the tests read what each pass computed and wrote.

Stand-ins with the real keys replace two fixed inputs of the graph that the demo builds from
registry downloads (quality_model, eval_ngrams); the tokenizer is the real pinned byte one.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import dagster as dg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from assets.datakit import make_datakit_graph
from assets.datakit.index import index_keys, register_shards
from assets.datakit.inputs import tokenizer_asset
from assets.partitions import (
    SHARDS_PER_RUN_ENV,
    datakit_shards,
    exact_buckets,
    fuzzy_bands,
    partition_index,
    shard_backfill_policy,
)
from marin_assets.datakit.decontaminate import EvalNgramIndex
from marin_assets.datakit.normalize import doc_id
from marin_assets.datakit.removals import read_removal_list
from marin_assets.datakit.shard_index import LABEL_CHARS, file_labels, split_source
from marin_assets.datakit.shards import SHARD_KEY_RE, read_table, write_table
from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource, StageContext, versioned_asset
from marin_assets.store.fsutil import filesystem, join
from tests.assets.shard_corpus import (
    COPIED,
    EVAL_TEXT,
    NEAR_TARGET,
    NEW_COPIED,
    NEW_NEAR_TARGET,
    SOURCE,
    base_records,
    expected_final,
    near,
    new_records,
    prose,
    spam,
)

QUALITY_THRESHOLD = 0.5
SHARD_BYTES = 2500


# ---------------------------------------------------------------- stand-ins for the fixed inputs
def raw_blobs(files: dict[str, list]) -> dict[str, str]:
    """{file name: JSONL text} of {file name: records or raw lines}."""
    return {
        name: "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records) for name, records in files.items()
    }


def raw_source(files: dict[str, list]) -> dg.AssetsDefinition:
    """sources/<SOURCE> holding `files` ({name: records or raw lines}), versioned by their bytes."""
    blobs = raw_blobs(files)
    digest = hashlib.sha256(json.dumps(blobs, sort_keys=True).encode()).hexdigest()[:16]

    @versioned_asset(key=f"sources/{SOURCE}", code_version=digest)
    def _raw(ctx: StageContext):
        fs, _ = filesystem(ctx.out_dir)
        for name, blob in blobs.items():
            fs.pipe_file(join(ctx.out_dir, name), blob.encode())
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


tokenizer = tokenizer_asset("bytes")


# ---------------------------------------------------------------- one partition per run
STAGES = [  # (asset keys, partitions of the run: "shards", a static partitions def, or None)
    (["shards/normalized", "shards/pii", "shards/language", "shards/quality", "shards/exact_map"], "shards"),
    (["shards/exact_reduce"], exact_buckets),
    (["shards/exact_removals", "shards/filtered_exact", "shards/fuzzy_map", "shards/decontam"], "shards"),
    (["shards/fuzzy_candidates"], fuzzy_bands),
    (["shards/fuzzy_edges"], "shards"),
    (["shards/fuzzy_removals"], None),
    (["shards/final", "shards/tokenized"], "shards"),
    ([f"datasets/{SOURCE}"], None),
]


def graph_runner(raw: dg.AssetsDefinition, instance, resources):
    """(assets, {key: asset}, run): run(keys, partition, tags) materialises `keys` in one run
    and records {(key, partition): metadata} in run.seen."""
    assets = [raw, quality_model, eval_ngrams, tokenizer, *make_datakit_graph({SOURCE: f"sources/{SOURCE}"})]
    by_key = {a.key.to_user_string(): a for a in assets}
    config = {
        by_key["shards/quality"].op.name: {"config": {"threshold": QUALITY_THRESHOLD}},
        by_key["shards/index"].op.name: {"config": {"shard_bytes": SHARD_BYTES}},
    }

    def run(keys: list[str], partition: str | None, tags: dict | None = None) -> None:
        selected = [by_key[k] for k in keys]
        ops = {a.op.name for a in selected}
        result = dg.materialize(
            assets,
            selection=selected,
            partition_key=partition,
            instance=instance,
            resources=resources,
            run_config={"ops": {op: c for op, c in config.items() if op in ops}},
            tags=tags,
        )
        assert result.success
        for event in result.get_asset_materialization_events():
            metadata = event.materialization.metadata
            run.seen[(event.asset_key.to_user_string(), event.partition)] = {k: v.value for k, v in metadata.items()}

    run.seen = {}
    return assets, by_key, run


def materialize_graph(raw: dg.AssetsDefinition, instance, resources) -> dict:
    """Every asset, one partition per run, in dependency order: {(key, partition): metadata}."""
    _, _, run = graph_runner(raw, instance, resources)
    run([f"sources/{SOURCE}", "quality_model", "eval_ngrams", "tokenizer", "shards/index"], None)
    shards = sorted(instance.get_dynamic_partitions(datakit_shards.name))
    for keys, partitions in STAGES:
        for p in shards if partitions == "shards" else partitions.get_partition_keys() if partitions else [None]:
            run(keys, p)
    return run.seen


def computed(seen: dict, key: str) -> set:
    return {p for (k, p), meta in seen.items() if k == key and not meta["cache_hit"]}


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    """The graph over the base corpus, then again with one more raw file (one new shard)."""
    tmp = tmp_path_factory.mktemp("shards")
    store = ArtifactStoreResource(prefix=str(tmp / "prefix"))
    resources = {"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)}
    instance = dg.DagsterInstance.ephemeral()
    passes = {"before": {"raw-00000.jsonl": base_records()}}
    passes["after"] = {**passes["before"], "raw-00001.jsonl": new_records()}
    out = {"store": store.store, "tmp": tmp}
    for name, files in passes.items():
        seen = materialize_graph(raw_source(files), instance, resources)
        shards = sorted(instance.get_dynamic_partitions(datakit_shards.name))
        out[name] = {
            "seen": seen,
            "shards": shards,
            "files": files,
            "final": final_documents(store.store, shards),
            "digests": {s: (exact_list(store.store, s), fuzzy_list(store.store, s)) for s in shards},
        }
    return out


def final_documents(store, shards: list[str]) -> list[dict]:
    docs = []
    for shard in shards:
        ref = store.read_pointer("shards/final", shard)
        docs += read_table(ref.files(".parquet")[0], columns=["id", "text", "source", "source_id"]).to_pylist()
    return sorted(docs, key=lambda d: (d["id"], d["source"], d["source_id"]))


def shard_of(store, shards: list[str], source_id: str) -> str:
    """The shard whose normalized rows hold `source_id`."""
    [hit] = [
        s
        for s in shards
        if source_id
        in read_table(store.read_pointer("shards/normalized", s).files(".parquet")[0], columns=["source_id"])
        .column("source_id")
        .to_pylist()
    ]
    return hit


def exact_list(store, shard: str) -> list:
    return read_removal_list(f"{store.read_pointer('shards/exact_removals', shard).data_path}/{shard}.jsonl")


def fuzzy_list(store, shard: str) -> list:
    return read_removal_list(f"{store.read_pointer('shards/fuzzy_removals', None).data_path}/{shard}.jsonl")


def tokens(store, shard: str, state: dict) -> list[list[int]]:
    """The token rows of a shard's train cache, of the version `state` (a pass) made."""
    from marin_assets.datakit.levanter_cache import open_cache

    version = state["seen"][("shards/tokenized", shard)]["version"]
    cache = open_cache(store.load("shards/tokenized", shard, version).data_path + "/train")
    return [r["input_ids"].tolist() for r in cache.get_batch_sync(list(range(len(cache))))] if len(cache) else []


def texts(docs: list[dict]) -> list[str]:
    return [d["text"] for d in docs]


# ---------------------------------------------------------------- the tests
@pytest.mark.slow
def test_cross_shard_exact_and_near_duplicates_are_removed_once(graph):
    store, state = graph["store"], graph["before"]
    shards = state["shards"]
    assert len(shards) == 4  # 31 lines of ~300 bytes at shard_bytes=2500
    exact = {s: lists[0] for s, lists in state["digests"].items() if lists[0]}
    fuzzy = {s: lists[1] for s, lists in state["digests"].items() if lists[1]}
    original, copy = shard_of(store, shards, f"d{COPIED:03d}"), shard_of(store, shards, "d900")
    assert original != copy
    # One exact removal in the whole corpus: the copy with the higher source_id, pointing at the other shard.
    [(shard, [removal])] = exact.items()
    assert (shard, removal.reason, removal.kept_shard) == (copy, "exact_duplicate", original)
    # One fuzzy removal: the later member of the near pair (the copy, in its later shard).
    near_text = near(prose(NEAR_TARGET), 7)
    target, near_copy = shard_of(store, shards, f"d{NEAR_TARGET:03d}"), shard_of(store, shards, "d901")
    assert target < near_copy
    [(shard, [removal])] = fuzzy.items()
    assert (removal.reason, removal.id, shard, removal.kept_id, removal.kept_shard) == (
        "fuzzy_duplicate",
        doc_id(near_text),
        near_copy,
        doc_id(prose(NEAR_TARGET)),
        target,
    )
    final_texts = texts(state["final"])
    assert final_texts.count(prose(COPIED)) == 1
    assert final_texts.count(prose(NEAR_TARGET)) + final_texts.count(near_text) == 1


@pytest.mark.slow  # the module's graph: the sharded DataKit materialised twice through Dagster
@pytest.mark.parametrize("state", ["before", "after"])
def test_sharded_final_documents_equal_the_in_memory_reference(graph, state):
    store, run = graph["store"], graph[state]
    expected = expected_final(
        store,
        run["shards"],
        store.read_pointer("quality_model", None).data_path,
        store.read_pointer("eval_ngrams", None).data_path,
        QUALITY_THRESHOLD,
    )
    # 24 good documents survive the base file (3 spam, 1 exact copy, 1 near copy, 1 contaminated
    # removed; 2 records quarantined); the added file brings 2 new ones and 2 copies.
    assert len(expected) == {"before": 24, "after": 26}[state]
    assert run["final"] == expected
    assert EVAL_TEXT not in "".join(texts(run["final"])) and not any("FREE" in t or "cash" in t for t in texts(run["final"]))


PER_SHARD_CACHED_UNLESS_CHANGED = ("shards/normalized", "shards/pii", "shards/language", "shards/quality", "shards/exact_map")


@pytest.mark.slow  # the module's graph: the sharded DataKit materialised twice through Dagster
def test_adding_a_shard_recomputes_exactly_the_expected_partitions(graph):
    store, before, after = graph["store"], graph["before"], graph["after"]
    [new] = sorted(set(after["shards"]) - set(before["shards"]))
    old = before["shards"]
    assert new == "tiny-raw-00001-00000" and after["shards"] == [*old, new]
    lost_exact = shard_of(store, old, f"d{NEW_COPIED:03d}")  # its copy of doc 10 loses to the new canonical one
    near_target = shard_of(store, old, f"d{NEW_NEAR_TARGET:03d}")  # keeps doc 20: the new near copy goes
    assert lost_exact != near_target
    changed_exact = {s for s in old if before["digests"][s][0] != after["digests"][s][0]}
    changed_fuzzy = {s for s in old if before["digests"][s][1] != after["digests"][s][1]}
    # The new near copy has the lower id, yet the earliest copy survives: no old fuzzy list changes.
    assert changed_exact == {lost_exact} and changed_fuzzy == set()
    [removal] = after["digests"][new][1]
    assert (removal.id, removal.kept_id, removal.kept_shard) == (
        doc_id(new_records()[1]["text"]),
        doc_id(prose(NEW_NEAR_TARGET)),
        near_target,
    )
    assert removal.id < removal.kept_id
    seen = after["seen"]
    expected = {
        "shards/normalized": {new},
        "shards/pii": {new},
        "shards/language": {new},
        "shards/quality": {new},
        "shards/exact_map": {new},
        "shards/exact_reduce": set(exact_buckets.get_partition_keys()),
        # only the lists whose duplicate rows changed (their bucket marks digest), not every list
        "shards/exact_removals": {new, lost_exact},
        "shards/filtered_exact": {new, lost_exact},
        "shards/fuzzy_map": {new, lost_exact},
        "shards/decontam": {new, lost_exact},
        "shards/fuzzy_candidates": set(fuzzy_bands.get_partition_keys()),
        # The verifies whose pairs or texts changed: lost_exact's rows moved, and the new shard
        # owns every pair it brings (a pair belongs to the shard of its later document), so
        # near_target's verify keeps its inputs.
        "shards/fuzzy_edges": {new, lost_exact},
        "shards/fuzzy_removals": {None},
        "shards/index": {None},
        f"sources/{SOURCE}": {None},
        "shards/final": {new, lost_exact},
        "shards/tokenized": {new, lost_exact},
        f"datasets/{SOURCE}": {None},
        "quality_model": set(),
        "eval_ngrams": set(),
        "tokenizer": set(),
    }
    assert {key: computed(seen, key) for key in expected} == expected
    # The bucket reduces read their earlier marks plus the new shard's map (no old map
    # changed); the band reduces could not reuse theirs: lost_exact's band keys changed.
    reused = {
        key: {store.read_pointer(key, p).counts["shards_reused"] for p in defn.get_partition_keys()}
        for key, defn in (("shards/exact_reduce", exact_buckets), ("shards/fuzzy_candidates", fuzzy_bands))
    }
    assert reused == {"shards/exact_reduce": {len(old)}, "shards/fuzzy_candidates": {0}}
    # The cached partitions report the very artifact versions of the first pass: a new file never
    # re-tokenizes another shard (the tokenizer is pinned, not fitted on the corpus).
    for key in ("shards/filtered_exact", "shards/final", "shards/tokenized"):
        for shard in set(old) - expected[key]:
            assert seen[(key, shard)]["cache_hit"] and seen[(key, shard)]["version"] == before["seen"][(key, shard)]["version"]
    untouched = set(old) - {lost_exact}
    assert {s: tokens(store, s, before) for s in untouched} == {s: tokens(store, s, after) for s in untouched}
    # The dataset indexes every shard's cache in key order, the new one included, read in place.
    from marin_assets.datakit.datasets import read_dataset

    dataset = read_dataset(store.read_pointer(f"datasets/{SOURCE}", None).data_path)
    assert [sh.key for sh in dataset.shards] == after["shards"]
    assert {sh.key: sh.version for sh in dataset.shards} == {
        s: after["seen"][("shards/tokenized", s)]["version"] for s in after["shards"]
    }
    # And the first pass computed everything (nothing was cached before it).
    assert all(not meta["cache_hit"] for (key, _), meta in before["seen"].items())


@pytest.mark.slow  # the module's graph: the sharded DataKit materialised twice through Dagster
@pytest.mark.parametrize("state", ["before", "after"])
def test_every_shard_accounts_for_every_record(graph, state):
    run = graph[state]
    totals = {"docs_in": 0, "docs_out": 0, "quarantined": 0, "removed": {}}
    for shard in run["shards"]:
        meta = run["seen"][("shards/final", shard)]
        counts = {k: meta[f"count/{k}"] for k in ("docs_in", "docs_out", "quarantined", "removed")}
        assert counts["docs_in"] == counts["docs_out"] + sum(counts["removed"].values()) + counts["quarantined"], (shard, counts)
        assert counts["docs_in"] == graph["store"].read_pointer("shards/normalized", shard).counts["docs_in"]
        for k in ("docs_in", "docs_out", "quarantined"):
            totals[k] += counts[k]
        for reason, n in counts["removed"].items():
            totals["removed"][reason] = totals["removed"].get(reason, 0) + n
    lines = sum(len(records) for records in run["files"].values())
    new_copies = {"before": 0, "after": 1}[state]
    assert totals == {
        "docs_in": lines,
        "docs_out": len(run["final"]),
        "quarantined": 2,
        "removed": {"contaminated": 1, "exact_duplicate": 1 + new_copies, "fuzzy_duplicate": 1 + new_copies, "low_quality": 3},
    }


@pytest.mark.slow  # the module's graph: the sharded DataKit materialised twice through Dagster
def test_a_fresh_instance_over_the_same_store_gets_the_shards_registered(graph):
    """The index is a cache hit there (its body does not run): its on_ref hook registers the keys."""
    store = graph["store"]
    resources = {"artifact_store": ArtifactStoreResource(prefix=store.prefix)}
    resources["artifact_io"] = ArtifactIOManager(artifact_store=resources["artifact_store"])
    instance = dg.DagsterInstance.ephemeral()
    raw, index = raw_source(graph["after"]["files"]), make_datakit_graph({SOURCE: f"sources/{SOURCE}"})[0]
    result = dg.materialize(
        [raw, index],
        instance=instance,
        resources=resources,
        run_config={"ops": {index.op.name: {"config": {"shard_bytes": SHARD_BYTES}}}},
    )
    assert all(e.materialization.metadata["cache_hit"].value for e in result.get_asset_materialization_events())
    assert sorted(instance.get_dynamic_partitions(datakit_shards.name)) == graph["after"]["shards"]
    ref = store.read_pointer("shards/index", None)
    assert register_shards(instance, index_keys(ref), datakit_shards) == (0, 0)  # idempotent
    # The index is the keys' one authority: a key it no longer lists is deleted (a removed file).
    first, *rest = index_keys(ref)
    assert (
        register_shards(instance, rest, datakit_shards) == (0, 1) and instance.get_dynamic_partitions(datakit_shards.name) == rest
    )
    assert register_shards(instance, index_keys(ref), datakit_shards) == (1, 0)
    with pytest.raises(ValueError, match="invalid shard key"):
        register_shards(instance, ["bad/key"], datakit_shards)
    assert sorted(instance.get_dynamic_partitions(datakit_shards.name)) == index_keys(ref)  # checked before any change


@pytest.mark.slow  # the module's graph: the sharded DataKit materialised twice through Dagster
def test_range_runs_give_every_partition_the_version_of_its_single_run(graph, tmp_path, monkeypatch):
    """The same graph, each stage one run over all its partitions on two local worker processes
    (backfill policy single_run, fanout.py), into a fresh store: every partition gets the very
    version the one-partition runs gave it, and the final documents are the same."""
    from marin_assets.orchestration.fanout import WORKERS_ENV
    from marin_assets.orchestration.waves import RANGE_END_TAG, RANGE_START_TAG

    monkeypatch.setenv(WORKERS_ENV, "2")
    store = ArtifactStoreResource(prefix=str(tmp_path / "prefix"))
    resources = {"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)}
    instance = dg.DagsterInstance.ephemeral()
    assets, by_key, run = graph_runner(raw_source(graph["after"]["files"]), instance, resources)
    run([f"sources/{SOURCE}", "quality_model", "eval_ngrams", "tokenizer", "shards/index"], None)
    shards = sorted(instance.get_dynamic_partitions(datakit_shards.name))
    for keys, partitions in STAGES:
        span = shards if partitions == "shards" else partitions.get_partition_keys() if partitions else None
        tags = {RANGE_START_TAG: span[0], RANGE_END_TAG: span[-1]} if span else None
        if "shards/tokenized" in keys:
            # tensorstore (under Levanter's cache writer) aborts a child forked from a process
            # that has used it, as this test process has (the fixture tokenized in process):
            # the caches are written in this process here. A run worker that has not written
            # a cache yet forks safely; see the report of issue 12.
            run([k for k in keys if k != "shards/tokenized"], None, tags)
            monkeypatch.setenv(WORKERS_ENV, "1")
            keys = ["shards/tokenized"]
        run(keys, None, tags)
    ranged, single = run.seen, graph["after"]["seen"]
    assert set(ranged) == set(single) and len(ranged) == 4 + 1 + 5 * 12 + 16 + 26 + 1 + 1
    assert {k: m["version"] for k, m in ranged.items()} == {k: m["version"] for k, m in single.items()}
    assert all(not m["cache_hit"] for m in ranged.values())
    assert final_documents(store.store, shards) == graph["after"]["final"]


# ---------------------------------------------------------------- partitions, policies, tags
def test_shard_backfill_policy_reads_and_checks_the_variable():
    assert shard_backfill_policy({}) == dg.BackfillPolicy.single_run()
    assert shard_backfill_policy({SHARDS_PER_RUN_ENV: ""}) == dg.BackfillPolicy.single_run()
    assert shard_backfill_policy({SHARDS_PER_RUN_ENV: "8"}) == dg.BackfillPolicy.multi_run(max_partitions_per_run=8)
    assert shard_backfill_policy({SHARDS_PER_RUN_ENV: "1"}).max_partitions_per_run == 1
    for bad in ("0", "-1", "08", "1.5", "abc", "8\n", " 8", "1e3", "1000000"):
        with pytest.raises(ValueError, match=f"^{SHARDS_PER_RUN_ENV}="):
            shard_backfill_policy({SHARDS_PER_RUN_ENV: bad})


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=12))
def test_shard_backfill_policy_accepts_exactly_the_positive_integers(text):
    valid = text.isascii() and text.isdigit() and not text.startswith("0") and len(text) <= 6
    if valid:
        assert shard_backfill_policy({SHARDS_PER_RUN_ENV: text}).max_partitions_per_run == int(text)
    elif text:
        with pytest.raises(ValueError, match=SHARDS_PER_RUN_ENV):
            shard_backfill_policy({SHARDS_PER_RUN_ENV: text})


def test_every_partitioned_shard_asset_carries_pod_tags_and_the_policy(monkeypatch):
    shard_assets = make_datakit_graph({SOURCE: f"sources/{SOURCE}"})[:-1]  # the index and the steps after it

    assert [a.key.to_user_string() for a in shard_assets][:2] == ["shards/index", "shards/normalized"]
    for asset in shard_assets:
        tags = asset.tags_by_key[asset.key]
        assert tags["marin/pool"] == "cpu" and tags["marin/cpu"] == "1" and tags["marin/memory"] in ("2Gi", "4Gi")
        if asset.partitions_def is not None:
            assert asset.backfill_policy == dg.BackfillPolicy.single_run(), asset.key
        if asset.partitions_def == datakit_shards:
            assert tags["marin/memory"] == "2Gi"
    partitioned = {a.key.to_user_string() for a in shard_assets if a.partitions_def is not None}
    assert (
        len(partitioned) == 14 and {"shards/pii", "shards/language"} <= partitioned and "shards/fuzzy_removals" not in partitioned
    )


def test_partition_index_names_the_bad_key():
    assert partition_index("bucket-003", "bucket-", 16) == 3
    for bad in ("bucket-016", "bucket-x", "band-01", "bucket-", "bucket--1"):
        with pytest.raises(ValueError, match=f"partition key {bad!r}"):
            partition_index(bad, "bucket-", 16)


# ---------------------------------------------------------------- the index's split
def test_split_source_cuts_at_line_boundaries_and_keeps_keys_when_files_are_added(tmp_path):
    import gzip

    lines = ["x" * n + "\n" for n in [10, 50, 5, 3000, 20, 20, 20]]  # what a split sees: lines of bytes
    with gzip.open(tmp_path / "raw-00000.jsonl.gz", "wt") as f:
        f.write("".join(lines))
    one = split_source("src", [str(tmp_path / "raw-00000.jsonl.gz")], str(tmp_path / "a"), shard_bytes=100)
    # 10+50+5 fit; the 3000-byte line is a shard of its own; the last three share one.
    assert [e["lines"] for e in one.values()] == [3, 1, 3]
    assert list(one) == ["src-raw-00000-00000", "src-raw-00000-00001", "src-raw-00000-00002"]
    joined = "".join((tmp_path / "a" / e["file"]).read_text() for e in one.values())
    assert joined == "".join(lines)
    for e in one.values():
        data = (tmp_path / "a" / e["file"]).read_bytes()
        assert e["sha256"] == hashlib.sha256(data).hexdigest() and e["bytes"] == len(data) and e["source"] == "src"
        assert e["bytes"] <= 100 or e["lines"] == 1
    # A file whose name sorts first, or after, adds its own shards and renames none.
    (tmp_path / "aaa.jsonl").write_text(lines[0])
    (tmp_path / "raw-00001.jsonl").write_text(lines[1])
    files = [str(tmp_path / n) for n in ("raw-00001.jsonl", "raw-00000.jsonl.gz", "aaa.jsonl")]
    two = split_source("src", files, str(tmp_path / "b"), 100)
    assert {k: two[k] for k in one} == one and set(two) - set(one) == {"src-aaa-00000", "src-raw-00001-00000"}
    (tmp_path / "poem.txt").write_text("one document\nof two lines\n")
    three = split_source("src", [str(tmp_path / "poem.txt"), str(tmp_path / "raw-00001.jsonl")], str(tmp_path / "t"), 5)
    assert [(k, e["file"], e["lines"]) for k, e in three.items()] == [
        ("src-poem-00000", "src-poem-00000.txt", 0),
        ("src-raw-00001-00000", "src-raw-00001-00000.jsonl", 1),
    ]
    assert (tmp_path / "t" / "src-poem-00000.txt").read_text() == "one document\nof two lines\n"  # whole, though > 5 bytes
    (tmp_path / "notes.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"notes.csv: cannot shard a 'csv' file"):
        split_source("src", [str(tmp_path / "notes.csv")], str(tmp_path / "c"), 100)
    with pytest.raises(ValueError, match="invalid shard key"):
        split_source("a/b", [str(tmp_path / "raw-00001.jsonl")], str(tmp_path / "d"), 100)


def test_file_labels_fit_a_key_and_never_share_one():
    long = "n" * 60 + ".jsonl"
    names = ["a b.jsonl", "a_b.jsonl", "x/data.jsonl", "y/data.jsonl", "data.jsonl", "doc.txt", "doc.JSONL.gz", long, ".jsonl"]
    labels = file_labels([f"/r/v1/{n}" for n in names], root="/r/v1")
    assert len(set(labels.values())) == len(labels)
    assert labels["/r/v1/a_b.jsonl"] == "a_b" and labels["/r/v1/data.jsonl"] == "data"  # fit as they are
    assert labels["/r/v1/a b.jsonl"].startswith("a_b_") and labels["/r/v1/x/data.jsonl"].startswith("x_data_")  # changed: hashed
    assert labels["/r/v1/doc.txt"].startswith("doc_") and labels["/r/v1/doc.JSONL.gz"].startswith("doc_")  # side by side
    assert all(len(v) <= LABEL_CHARS and SHARD_KEY_RE.fullmatch(f"src-{v}-00000") for v in labels.values())
    # A label follows the path under the root, not the root (the source artifact's version)
    # and not the other files.
    alone = file_labels([f"/r/v2/{n}" for n in ("y/data.jsonl", long)], root="/r/v2")
    assert alone == {"/r/v2/y/data.jsonl": labels["/r/v1/y/data.jsonl"], f"/r/v2/{long}": labels[f"/r/v1/{long}"]}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=80).filter(lambda n: "/" not in n), min_size=1, max_size=6, unique=True))
def test_any_file_names_get_distinct_valid_labels(names):
    labels = file_labels([f"/root/{n}" for n in names], root="/root")
    assert len(set(labels.values())) == len(names)
    assert all(SHARD_KEY_RE.fullmatch(f"s-{v}-00000") for v in labels.values())


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 300), max_size=30), st.integers(1, 400))
def test_split_source_loses_and_reorders_nothing(tmp_path_factory, sizes, shard_bytes):
    tmp = tmp_path_factory.mktemp("split")
    text = "".join("y" * n + "\n" for n in sizes)
    (tmp / "raw.jsonl").write_text(text)
    entries = split_source("s", [str(tmp / "raw.jsonl")], str(tmp / "out"), shard_bytes)
    assert "".join((tmp / "out" / e["file"]).read_text() for e in entries.values()) == text
    assert sum(e["lines"] for e in entries.values()) == len(sizes)
    assert all(e["bytes"] <= shard_bytes or e["lines"] == 1 for e in entries.values())
    # Greedy: no shard could have taken the next shard's first line.
    files = [(tmp / "out" / e["file"]).read_text().splitlines(keepends=True) for e in entries.values()]
    assert all(len("".join(a)) + len(b[0]) > shard_bytes for a, b in zip(files, files[1:]))


def _line_by_line(data: bytes, shard_bytes: int) -> list[bytes]:
    """The split as a loop over lines (what line_shards does in blocks)."""
    shards: list[bytes] = []
    for line in io.BytesIO(data):
        if shards and len(shards[-1]) + len(line) <= shard_bytes:
            shards[-1] += line
        else:
            shards.append(line)
    return shards


def _joined(pieces) -> list[bytes]:
    """line_shards' (piece, ends the shard) stream as whole shards; every shard ends once."""
    shards, open_shard = [], b""
    for piece, ends in pieces:
        open_shard += piece
        if ends:
            shards.append(open_shard)
            open_shard = b""
    assert open_shard == b""
    return shards


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=40), st.booleans(), st.integers(1, 60), st.integers(1, 50))
def test_line_shards_in_blocks_equal_the_line_by_line_split(sizes, last_newline, shard_bytes, read_bytes):
    from unittest import mock

    from marin_assets.datakit import shard_index

    data = b"\n".join(b"z" * n for n in sizes) + (b"\n" if last_newline and sizes else b"")
    with mock.patch.object(shard_index, "READ_BYTES", read_bytes):  # small blocks: every refill path runs
        assert _joined(shard_index.line_shards(io.BytesIO(data), shard_bytes)) == _line_by_line(data, shard_bytes)


def test_the_shard_pool_is_a_cpu_pool_of_the_shipped_fleet():
    """With fleet_file set (dagster.cluster.yaml) the launcher refuses a marin/pool the fleet lacks."""
    from assets.datakit.common import POOL
    from marin_assets.cluster.fleet import load_fleet

    root = Path(__file__).resolve().parents[2]
    pools = {p.name: p for p in load_fleet(str(root / "examples" / "fleet.yaml")).pools}
    assert POOL in pools and pools[POOL].accelerator == "cpu"


@pytest.mark.parametrize("newline", [True, False])
def test_split_source_streams_a_line_far_longer_than_a_shard(tmp_path, newline):
    """An 18 KB .jsonl.zst can hold a 384 MiB line; the split held all of it (and copies), 805 MB
    peak. Now a long line streams to its own shard: memory is about a shard and a read block,
    the shard's bytes, digest and line count are those of the line (here 48 MiB, 4 KiB shards)."""
    import hashlib
    from unittest import mock

    import zstandard

    from marin_assets.datakit import shard_index
    from marin_assets.datakit.memory import peak_heap_bytes

    raw, block = tmp_path / "bomb.jsonl.zst", b"a" * (1 << 20)
    with open(raw, "wb") as out, zstandard.ZstdCompressor().stream_writer(out) as w:  # written streaming, too
        w.write(b'{"text": "')
        for _ in range(48):
            w.write(block)
        w.write(b'"}\n{"text": "ok"}' + (b"\n" if newline else b""))
    with mock.patch.object(shard_index, "READ_BYTES", 1 << 18):
        entries, peak = peak_heap_bytes(lambda: split_source("src", [str(raw)], str(tmp_path / "out"), 4096))
    assert peak < 8 << 20, f"peak {peak} bytes for a 48 MiB line"
    long_line = (48 << 20) + len(b'{"text": ""}\n')
    big, small = entries["src-bomb-00000"], entries["src-bomb-00001"]
    assert (big["bytes"], big["lines"], small["lines"]) == (long_line, 1, 1)
    digest = hashlib.sha256(b'{"text": "')
    for _ in range(48):
        digest.update(block)
    assert big["sha256"] == hashlib.sha256((tmp_path / "out" / big["file"]).read_bytes()).hexdigest()
    digest.update(b'"}\n')
    assert big["sha256"] == digest.hexdigest()
    assert (tmp_path / "out" / small["file"]).read_bytes() == b'{"text": "ok"}' + (b"\n" if newline else b"")
