"""materialize_waves: a graph over several partitions definitions, one run per wave."""

from __future__ import annotations

import json
import os

import dagster as dg
import pytest

from marin_assets.orchestration.waves import materialize_waves, plan_waves

SHARDS = dg.DynamicPartitionsDefinition(name="toy_shards")
BUCKETS = dg.StaticPartitionsDefinition(["b0", "b1"])
ALL = dg.AllPartitionMapping()
SINGLE_RUN = dg.BackfillPolicy.single_run()


def _graph(log_dir, fail_bucket: str | None = None):
    def record(context, name):
        keys = list(context.partition_keys) if context.has_partition_key_range or context.has_partition_key else []
        (log_dir / f"{name}-{context.run.run_id[:8]}.json").write_text(json.dumps(keys))

    @dg.asset
    def index(context) -> None:
        context.instance.add_dynamic_partitions("toy_shards", ["s0", "s1", "s2"])
        record(context, "index")

    @dg.asset(partitions_def=SHARDS, deps=[index], backfill_policy=SINGLE_RUN)
    def mapped(context) -> None:
        record(context, "mapped")

    @dg.asset(partitions_def=SHARDS, deps=[mapped], backfill_policy=SINGLE_RUN)
    def mapped_again(context) -> None:
        record(context, "mapped_again")

    @dg.asset(partitions_def=BUCKETS, deps=[dg.AssetDep(mapped_again, partition_mapping=ALL)], backfill_policy=SINGLE_RUN)
    def reduced(context) -> None:
        if fail_bucket in context.partition_keys:
            raise RuntimeError(f"bucket {fail_bucket} failed")
        record(context, "reduced")

    @dg.asset(partitions_def=SHARDS, deps=[dg.AssetDep(reduced, partition_mapping=ALL)], backfill_policy=SINGLE_RUN)
    def applied(context) -> None:
        record(context, "applied")

    @dg.asset(deps=[dg.AssetDep(applied, partition_mapping=ALL)])
    def summary(context) -> None:
        record(context, "summary")

    return [summary, applied, reduced, mapped_again, mapped, index]  # order must not matter


def _ran(log_dir) -> dict[str, list[list[str]]]:
    out: dict[str, list] = {}
    for path in sorted(log_dir.iterdir()):
        out.setdefault(path.name.split("-")[0], []).append(json.loads(path.read_text()))
    return out


def test_waves_follow_dependencies_and_group_same_partition_chains(tmp_path):
    waves = plan_waves(_graph(tmp_path))
    assert [[k.to_user_string() for k in w.keys] for w in waves] == [
        ["index"],
        ["mapped", "mapped_again"],
        ["reduced"],
        ["applied"],
        ["summary"],
    ]


def test_every_wave_runs_once_over_all_its_keys(tmp_path):
    with dg.instance_for_test() as instance:
        results = materialize_waves(_graph(tmp_path), instance, {}, log=lambda _: None)
    assert len(results) == 5 and all(r.success for r in results)
    assert _ran(tmp_path) == {
        "index": [[]],
        "mapped": [["s0", "s1", "s2"]],
        "mapped_again": [["s0", "s1", "s2"]],
        "reduced": [["b0", "b1"]],
        "applied": [["s0", "s1", "s2"]],
        "summary": [[]],
    }


def test_a_failed_wave_stops_the_later_ones(tmp_path):
    lines: list[str] = []
    with dg.instance_for_test() as instance:
        results = materialize_waves(_graph(tmp_path, fail_bucket="b1"), instance, {}, log=lines.append)
    assert [r.success for r in results] == [True, True, False]
    assert set(_ran(tmp_path)) == {"index", "mapped", "mapped_again"}
    assert lines[-1].startswith("wave 3/5 failed")


def test_a_partitioned_wave_with_no_keys_is_refused(tmp_path):
    assets = _graph(tmp_path)
    with dg.instance_for_test() as instance, pytest.raises(ValueError, match="has no partitions yet"):
        materialize_waves(assets, instance, {}, selection=[dg.AssetKey("mapped")], log=lambda _: None)


def test_selection_must_name_assets_of_the_graph(tmp_path):
    with pytest.raises(ValueError, match=r"not in the graph: \['nope'\]"):
        plan_waves(_graph(tmp_path), [dg.AssetKey("nope")])


def _planned(instance: dg.DagsterInstance, key: str) -> list:
    records = instance.get_event_records(
        dg.EventRecordsFilter(dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED, asset_key=dg.AssetKey(key))
    )
    return [r.event_log_entry.dagster_event.event_specific_data.partition for r in records]


@pytest.mark.parametrize("ephemeral", [True, False])
def test_an_ephemeral_instance_gets_one_planned_event_per_asset_and_run(tmp_path, ephemeral, monkeypatch):
    from marin_assets.orchestration.waves import PLANNED_SUBSET_ENV

    monkeypatch.delenv(PLANNED_SUBSET_ENV, raising=False)
    with dg.DagsterInstance.ephemeral() if ephemeral else dg.instance_for_test() as instance:
        results = materialize_waves(_graph(tmp_path, fail_bucket="b1"), instance, {}, log=lambda _: None)
        # One run per wave; mapped (3 partitions) is planned once on an ephemeral instance,
        # once per partition on a persistent one (its UI marks failed partitions from them).
        assert sorted(_planned(instance, "mapped"), key=str) == ([None] if ephemeral else ["s0", "s1", "s2"])
        assert [r.success for r in results] == [True, True, False]  # the failure is still reported
    assert PLANNED_SUBSET_ENV not in os.environ  # set only around the runs
