"""Waves run only the partitions that are not up to date in the artifact store (uptodate.py)."""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from marin_assets.orchestration import (
    ArtifactIOManager,
    ArtifactStoreResource,
    StageConfig,
    StageContext,
    versioned,
    versioned_asset,
)
from marin_assets.orchestration.fanout import WORKERS_ENV
from marin_assets.orchestration.uptodate import stale_partitions
from marin_assets.orchestration.waves import RANGE_END_TAG, RANGE_START_TAG, materialize_waves, plan_waves, spans

SHARDS = dg.DynamicPartitionsDefinition(name="uptodate_shards")
BUCKETS = dg.StaticPartitionsDefinition(["b0", "b1"])
ALL = dg.AllPartitionMapping()
SINGLE_RUN = dg.BackfillPolicy.single_run()


class ScaleConfig(StageConfig):
    scale: int = versioned(1)


def build(content: dict[str, str], ran: list[tuple[str, str | None]]):
    """raw (per shard, versioned by content[shard]) -> scaled (config) -> total (per bucket,
    reads every shard) -> applied (per shard, reads every bucket) -> summary."""

    @versioned_asset(
        key="u/raw",
        code_version="1",
        partitions_def=SHARDS,
        backfill_policy=SINGLE_RUN,
        version_inputs=lambda config, partition, inputs: {"content": content[partition]},
    )
    def raw(ctx: StageContext):
        ran.append(("raw", ctx.partition_key))
        Path(ctx.out_dir, "text").write_text(content[ctx.partition_key])
        return {"chars": len(content[ctx.partition_key])}

    @versioned_asset(
        key="u/scaled",
        code_version="1",
        config_cls=ScaleConfig,
        partitions_def=SHARDS,
        backfill_policy=SINGLE_RUN,
        ins={"raw": "u/raw"},
    )
    def scaled(ctx: StageContext, config: ScaleConfig, raw):
        ran.append(("scaled", ctx.partition_key))
        return {"chars": raw.counts["chars"] * config.scale}

    @versioned_asset(
        key="u/total",
        code_version="1",
        partitions_def=BUCKETS,
        backfill_policy=SINGLE_RUN,
        ins={"scaled": dg.AssetIn(key=dg.AssetKey(["u", "scaled"]), partition_mapping=ALL)},
    )
    def total(ctx: StageContext, scaled):
        ran.append(("total", ctx.partition_key))
        return {"chars": sum(ref.counts["chars"] for ref in scaled.values())}

    @versioned_asset(
        key="u/applied",
        code_version="1",
        partitions_def=SHARDS,
        backfill_policy=SINGLE_RUN,
        ins={"total": dg.AssetIn(key=dg.AssetKey(["u", "total"]), partition_mapping=ALL)},
    )
    def applied(ctx: StageContext, total):
        ran.append(("applied", ctx.partition_key))
        return {"buckets": len(total)}

    @versioned_asset(
        key="u/summary", code_version="1", ins={"applied": dg.AssetIn(key=dg.AssetKey(["u", "applied"]), partition_mapping=ALL)}
    )
    def summary(ctx: StageContext, applied):
        ran.append(("summary", None))
        return {"shards": len(applied)}

    return [raw, scaled, total, applied, summary]


@pytest.fixture
def lab(tmp_path, monkeypatch):
    monkeypatch.setenv(WORKERS_ENV, "1")  # bodies append to `ran` in this process
    store = ArtifactStoreResource(prefix=str(tmp_path / "prefix"))
    content = {"s0": "a", "s1": "bb", "s2": "ccc"}
    ran: list = []
    return {
        "store": store,
        "resources": {"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)},
        "content": content,
        "ran": ran,
        "assets": build(content, ran),
    }


def _pass(lab, instance, **kwargs) -> tuple[list[dg.ExecuteInProcessResult], list[str]]:
    lines: list[str] = []
    lab["ran"].clear()
    results = materialize_waves(lab["assets"], instance, lab["resources"], log=lines.append, **kwargs)
    assert all(r.success for r in results), lines
    return results, lines


def _runs(results) -> list[tuple[tuple[str, ...], str | None, str | None]]:
    """(assets, range start, range end) of every run."""
    out = []
    for r in results:
        assets = tuple(sorted({e.asset_key.to_user_string() for e in r.get_asset_materialization_events()}))
        out.append((assets, r.dagster_run.tags.get(RANGE_START_TAG), r.dagster_run.tags.get(RANGE_END_TAG)))
    return out


def _hits(results) -> dict[tuple[str, str | None], bool]:
    return {
        (e.asset_key.to_user_string(), e.partition): e.materialization.metadata["cache_hit"].value
        for r in results
        for e in r.get_asset_materialization_events()
    }


def test_an_unchanged_store_starts_no_run_and_a_new_shard_runs_only_what_reads_it(lab):
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(SHARDS.name, ["s0", "s1", "s2"])
    first, _ = _pass(lab, instance)
    assert len(first) == 4 and sorted(lab["ran"]) == sorted(
        [(a, s) for a in ("raw", "scaled", "applied") for s in ("s0", "s1", "s2")]
        + [("total", "b0"), ("total", "b1"), ("summary", None)]
    )

    again, lines = _pass(lab, instance)
    assert again == [] and lab["ran"] == []
    assert len(lines) == 4 and all(line.endswith("up to date, no run") for line in lines)

    lab["content"]["s3"] = "dddd"
    instance.add_dynamic_partitions(SHARDS.name, ["s3"])
    increment, _ = _pass(lab, instance)
    assert _runs(increment) == [
        (("u/raw", "u/scaled"), "s3", "s3"),
        (("u/total",), "b0", "b1"),
        (("u/applied",), "s0", "s3"),  # every shard reads the totals, which changed
        (("u/summary",), None, None),
    ]
    assert sorted(lab["ran"]) == sorted(
        [("raw", "s3"), ("scaled", "s3"), ("total", "b0"), ("total", "b1"), ("summary", None)]
        + [("applied", s) for s in ("s0", "s1", "s2", "s3")]
    )


def test_changed_content_config_or_pointer_makes_exactly_those_partitions_stale(lab):
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(SHARDS.name, ["s0", "s1", "s2"])
    _pass(lab, instance)
    assets, store = lab["assets"], lab["store"].store
    shards = ["s0", "s1", "s2"]
    first_wave = plan_waves(assets)[0].keys  # raw, scaled: one run

    def stale(run_config=None):
        return stale_partitions(assets, first_wave, shards, instance, store, run_config)

    assert stale() == []
    lab["content"]["s1"] = "changed"
    assert stale() == ["s1"]
    lab["content"]["s1"] = "bb"
    assert stale() == []
    scaled_op = next(a for a in assets if a.key.to_user_string() == "u/scaled").op.name
    assert stale({"ops": {scaled_op: {"config": {"scale": 2}}}}) == shards  # a versioned field changed
    assert stale({"ops": {scaled_op: {"config": {"scale": "x"}}}}) is None  # the run reports invalid config
    os.remove(Path(store.prefix, "u", "scaled", "s2", "LATEST.json"))  # a pointer lost: the run re-points it
    assert stale() == ["s2"]
    results, _ = _pass(lab, instance)
    assert _runs(results)[0] == (("u/raw", "u/scaled"), "s2", "s2")
    assert _hits(results[:1]) == {("u/raw", "s2"): True, ("u/scaled", "s2"): True} and lab["ran"] == []


def test_stale_partitions_far_apart_get_one_run_each(lab, monkeypatch):
    from marin_assets.orchestration import waves

    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(SHARDS.name, ["s0", "s1", "s2"])
    _pass(lab, instance)
    lab["content"].update(s0="changed", s2="changed too")
    monkeypatch.setattr(waves, "MAX_GAP", 0)  # s1 between them is up to date: no merge
    results, _ = _pass(lab, instance)
    assert _runs(results)[:2] == [(("u/raw", "u/scaled"), "s0", "s0"), (("u/raw", "u/scaled"), "s2", "s2")]
    assert ("raw", "s1") not in lab["ran"] and {("raw", "s0"), ("raw", "s2")} <= set(lab["ran"])


def test_a_persistent_instance_records_every_partition_before_skipping_it(lab, tmp_path):
    """The store is full, the instance is new: the UI must not show those partitions as
    missing, so the first pass runs them (cache hits), the second starts no run."""
    ephemeral = dg.DagsterInstance.ephemeral()
    ephemeral.add_dynamic_partitions(SHARDS.name, ["s0", "s1"])
    _pass(lab, ephemeral)
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        instance.add_dynamic_partitions(SHARDS.name, ["s0", "s1"])
        recorded, _ = _pass(lab, instance)
        assert len(recorded) == 4 and lab["ran"] == [] and all(_hits(recorded).values())
        assert set(instance.get_materialized_partitions(dg.AssetKey(["u", "applied"]))) == {"s0", "s1"}
        again, _ = _pass(lab, instance)
        assert again == []


def test_without_skipping_or_for_plain_assets_every_partition_runs(lab):
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(SHARDS.name, ["s0", "s1"])
    _pass(lab, instance)
    results, _ = _pass(lab, instance, skip_up_to_date=False)
    assert len(results) == 4 and lab["ran"] == [] and len(_hits(results)) == 2 * 3 + 2 + 1

    @dg.asset(partitions_def=SHARDS)
    def plain(context) -> None:
        pass

    store = lab["store"].store
    assert stale_partitions([plain], [plain.key], ["s0", "s1"], instance, store) is None


def test_spans_cover_the_stale_keys_and_merge_short_gaps():
    keys = [f"k{i}" for i in range(10)]
    assert spans(keys, set(), max_gap=2) == []
    assert spans([None], {None}) == [None] and spans([None], set()) == []
    assert spans(keys, {"k1", "k2", "k4", "k9"}, max_gap=1) == [("k1", "k4"), ("k9", "k9")]
    assert spans(keys, {"k1", "k9"}, max_gap=0) == [("k1", "k1"), ("k9", "k9")]
    assert spans(keys, {"k1", "k9"}, max_gap=7) == [("k1", "k9")]


@given(st.lists(st.booleans(), min_size=1, max_size=40), st.integers(0, 5))
def test_spans_property(flags, gap):
    keys = [f"k{i:02d}" for i in range(len(flags))]
    todo = {k for k, f in zip(keys, flags) if f}
    runs = spans(keys, todo, max_gap=gap)
    covered = [set(keys[keys.index(a) : keys.index(b) + 1]) for a, b in runs]
    assert set().union(*covered) >= todo  # every stale key runs
    for (a, b), (c, _) in zip(runs, runs[1:]):  # ordered, disjoint, and kept apart only by a long gap
        assert keys.index(c) - keys.index(b) - 1 > gap
    assert all(a in todo and b in todo for a, b in runs)  # no run starts or ends on an up-to-date key
