"""Exact dedup through the shard steps (exact_map per shard -> exact_reduce per bucket ->
exact_removals per shard), checked against the oracle: every copy of an id but the one with
the lowest (source, source_id, shard key, row) goes, across sources and shards."""

import pytest

from marin_assets.datakit.dedup_exact import ExactDedupConfig
from marin_assets.datakit.removals import read_removal_list
from tests.datakit.oracle import exact_duplicates
from tests.datakit.test_sharded_dedup import corpus_docs, normalize_records, removal_places, run_exact


def test_planted_exact_duplicates_all_removed_across_sources(tmp_path, prose):
    uniques = [prose(i) for i in range(12)]
    # source b repeats a's docs 0..4 (doc 4 twice) and has its own; a repeats its doc 3.
    a = [{"text": t, "id": f"a{i}"} for i, t in enumerate(uniques[:8])] + [{"text": uniques[3], "id": "a9-copy"}]
    b = [{"text": uniques[i], "id": f"b{i}"} for i in (0, 1, 2, 4, 4)]
    b += [{"text": t, "id": f"b{i}"} for i, t in enumerate(uniques[8:], 8)]
    shards = {**normalize_records(tmp_path, "a", a, 4), **normalize_records(tmp_path, "b", b, 4)}
    assert len(shards) == 6
    out = run_exact(shards, str(tmp_path / "work"), ExactDedupConfig(num_buckets=3))
    lists = {k: read_removal_list(v["list"]) for k, v in out.items()}
    docs = corpus_docs(shards)
    removed = removal_places(lists)
    assert removed == exact_duplicates(docs) and sum(v["removed"] for v in out.values()) == 6
    kept = [d for d in docs if (d["key"], d["row"]) not in removed]
    assert sorted(d["text"] for d in kept) == sorted(uniques)  # every text survives exactly once
    # the survivor of each group is the copy with the lowest (source, source_id)
    kept_ids = {(d["source"], d["source_id"]) for d in kept}
    assert ("a", "a3") in kept_ids and ("a", "a9-copy") not in kept_ids
    assert ("a", "a0") in kept_ids and ("b", "b0") not in kept_ids and ("b", "b8") in kept_ids
    # each removal names its row's id and the kept copy's shard and row, which hold that id
    at = {(d["key"], d["row"]): d for d in docs}
    for key, entries in lists.items():
        for r in entries:
            assert at[(key, r.row)]["id"] == r.id == r.kept_id == at[(r.kept_shard, r.kept_row)]["id"]
            assert r.reason == "exact_duplicate"


def test_a_shard_without_copies_gets_an_empty_list(tmp_path, prose):
    shards = normalize_records(tmp_path, "s", [{"text": prose(i)} for i in range(6)] + [{"text": prose(0)}], 3)
    out = run_exact(shards, str(tmp_path / "work"))
    assert [v["removed"] for _, v in sorted(out.items())] == [0, 0, 1]  # the copy is the last row
    assert len({v["digest"] for v in out.values()}) == 2  # the two empty lists share a digest


def test_config_validation():
    with pytest.raises(ValueError, match="num_buckets"):
        ExactDedupConfig(num_buckets=0)
    with pytest.raises(ValueError, match="num_buckets"):
        ExactDedupConfig(num_buckets=65537)
