"""The versioned-asset factory inside real Dagster runs (materialize on an ephemeral instance)."""

from pathlib import Path

import dagster as dg
import pytest

from marin_assets.orchestration import (
    ArtifactIOManager,
    ArtifactStoreResource,
    StageConfig,
    StageContext,
    versioned,
    versioned_asset,
)
from marin_assets.orchestration.automation import rerun_on_change
from marin_assets.store import ArtifactRef

PARTS = dg.StaticPartitionsDefinition(["a", "b"])


def build_graph(calls: list, src_code="1", scale=2, down_code="1"):
    class SrcConfig(StageConfig):
        repeat: int = versioned(3)
        verbose: bool = False  # not versioned: must not change the version

    class ScaleConfig(StageConfig):
        factor: int = versioned(scale)

    @versioned_asset(
        key="t/src", code_version=src_code, config_cls=SrcConfig, partitions_def=PARTS, automation_condition=rerun_on_change()
    )
    def src(ctx: StageContext, config: SrcConfig):
        calls.append(("src", ctx.partition_key))
        Path(ctx.out_dir, "x.txt").write_text(ctx.partition_key * config.repeat)
        return {"rows": config.repeat}

    @versioned_asset(
        key="t/scaled",
        code_version=down_code,
        config_cls=ScaleConfig,
        ins={"src": "t/src"},
        partitions_def=PARTS,
        automation_condition=rerun_on_change(),
    )
    def scaled(ctx: StageContext, config: ScaleConfig, src: ArtifactRef):
        calls.append(("scaled", ctx.partition_key))
        text = Path(src.files(".txt")[0]).read_text()
        Path(ctx.out_dir, "y.txt").write_text(text * config.factor)
        return {"chars": len(text) * config.factor}

    @versioned_asset(key="t/summary", code_version="1", ins={"scaled": "t/scaled"}, automation_condition=rerun_on_change())
    def summary(ctx: StageContext, scaled: dict):
        calls.append(("summary", None))
        total = sum(ref.counts["chars"] for ref in scaled.values())
        Path(ctx.out_dir, "total.txt").write_text(str(total))
        return {"total_chars": total, "partitions": len(scaled)}

    return [src, scaled, summary]


@pytest.fixture
def resources(tmp_path):
    store = ArtifactStoreResource(prefix=str(tmp_path / "prefix"))
    return {"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)}


def run_all(assets, resources, instance):
    events = []
    for p in PARTS.get_partition_keys():
        result = dg.materialize(assets[:2], partition_key=p, resources=resources, instance=instance)
        assert result.success
        events += result.get_asset_materialization_events()
    result = dg.materialize(assets, selection=[assets[2]], resources=resources, instance=instance)
    assert result.success
    events += result.get_asset_materialization_events()
    return {(e.asset_key.to_user_string(), e.partition): e.materialization.metadata for e in events}


def test_second_materialization_is_all_cache_hits_with_same_data_version(resources):
    calls: list = []
    instance = dg.DagsterInstance.ephemeral()
    assets = build_graph(calls)
    first = run_all(assets, resources, instance)
    n_calls = len(calls)
    assert n_calls == 5
    second = run_all(assets, resources, instance)
    assert len(calls) == n_calls  # no body ran
    for key, meta in second.items():
        assert meta["cache_hit"].value is True
        assert meta["version"].value == first[key]["version"].value
        assert first[key]["cache_hit"].value is False
    assert second[("t/summary", None)]["count/total_chars"].value == 2 * 3 * 2
    record = instance.get_latest_materialization_event(dg.AssetKey(["t", "summary"]))
    assert record.asset_materialization.tags["dagster/data_version"] == first[("t/summary", None)]["version"].value


def test_downstream_config_change_recomputes_only_it_and_descendants(resources):
    instance = dg.DagsterInstance.ephemeral()
    run_all(build_graph([]), resources, instance)
    calls: list = []
    run_all(build_graph(calls, scale=5), resources, instance)
    assert sorted({name for name, _ in calls}) == ["scaled", "summary"]


def test_upstream_code_version_change_recomputes_everything_below(resources):
    instance = dg.DagsterInstance.ephemeral()
    run_all(build_graph([]), resources, instance)
    calls: list = []
    run_all(build_graph(calls, src_code="2"), resources, instance)
    assert sorted({name for name, _ in calls}) == ["scaled", "src", "summary"]


def test_unversioned_config_field_does_not_change_the_version(resources):
    calls: list = []
    instance = dg.DagsterInstance.ephemeral()
    assets = build_graph(calls)
    dg.materialize(assets[:1], partition_key="a", resources=resources, instance=instance)
    result = dg.materialize(
        assets[:1],
        partition_key="a",
        resources=resources,
        instance=instance,
        run_config={"ops": {"t__src": {"config": {"verbose": True}}}},
    )
    assert result.get_asset_materialization_events()[0].materialization.metadata["cache_hit"].value is True
    result = dg.materialize(
        assets[:1],
        partition_key="a",
        resources=resources,
        instance=instance,
        run_config={"ops": {"t__src": {"config": {"repeat": 4}}}},
    )
    assert result.get_asset_materialization_events()[0].materialization.metadata["cache_hit"].value is False
    assert calls == [("src", "a"), ("src", "a")]


def test_missing_upstream_gives_a_clear_error(resources):
    assets = build_graph([])
    with pytest.raises(Exception, match="has not been materialised"):
        dg.materialize(
            assets, selection=[assets[1]], partition_key="a", resources=resources, instance=dg.DagsterInstance.ephemeral()
        )


def _requested(result) -> set[str]:
    return {r.key.to_user_string() for r in result.results if r.true_subset.size > 0}


def test_automation_requests_reruns_after_code_and_upstream_changes(resources):
    instance = dg.DagsterInstance.ephemeral()
    assets = build_graph([])
    defs_v1 = dg.Definitions(assets=assets, resources=resources)
    run_all(assets, resources, instance)
    settled = dg.evaluate_automation_conditions(defs=defs_v1, instance=instance)
    assert settled.total_requested == 0  # everything is up to date

    # code change in the middle of the graph: that asset is requested (all partitions)...
    defs_v2 = dg.Definitions(assets=build_graph([], down_code="2"), resources=resources)
    changed = dg.evaluate_automation_conditions(defs=defs_v2, instance=instance, cursor=settled.cursor)
    assert _requested(changed) == {"t/scaled"}
    assert changed.total_requested == 2

    # ...and once it has re-run, its new version makes the descendant eligible.
    v2 = build_graph([], down_code="2")
    for p in PARTS.get_partition_keys():
        assert dg.materialize(v2[:2], selection=[v2[1]], partition_key=p, resources=resources, instance=instance).success
    after = dg.evaluate_automation_conditions(defs=defs_v2, instance=instance, cursor=changed.cursor)
    assert _requested(after) == {"t/summary"}


def test_automation_follows_a_default_config_change(resources):
    instance = dg.DagsterInstance.ephemeral()
    assets = build_graph([])
    run_all(assets, resources, instance)
    settled = dg.evaluate_automation_conditions(defs=dg.Definitions(assets=assets, resources=resources), instance=instance)
    edited = dg.Definitions(assets=build_graph([], scale=7), resources=resources)
    changed = dg.evaluate_automation_conditions(defs=edited, instance=instance, cursor=settled.cursor)
    assert _requested(changed) == {"t/scaled"}


def test_version_as_hashes_a_nested_config_as_the_json_text_it_replaced(tmp_path):
    """A field that was a JSON string and became a nested config keeps its versions."""
    import json

    from marin_assets.orchestration.versioned import _config_fingerprint

    class Stage(dg.Config):
        step: int = 0
        weights: dict[str, float] = {"a": 0.5, "b": 0.5}

    class Old(StageConfig):
        stage: str = versioned('{"step": 0, "weights": {"a": 0.5, "b": 0.5}}')

    class New(StageConfig):
        stage: Stage = versioned(Stage())
        version_as = {"stage": lambda value: json.dumps(value, sort_keys=True)}

    assert New().versioned_fields() == Old().versioned_fields()
    assert _config_fingerprint(New) == _config_fingerprint(Old)
    # A different value is a different version; the nested type still validates.
    assert New(stage=Stage(step=5)).versioned_fields() != Old().versioned_fields()
    with pytest.raises(Exception, match="step"):
        New(stage={"step": "five"})

    def graph(config_cls):
        @versioned_asset(key="t/staged", code_version="1", config_cls=config_cls)
        def staged(ctx: StageContext, config):
            return {"ok": 1}

        return staged

    store = ArtifactStoreResource(prefix=str(tmp_path))
    resources = {"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)}
    with dg.instance_for_test() as instance:
        old = dg.materialize([graph(Old)], instance=instance, resources=resources).output_for_node("t__staged")
        new = dg.materialize([graph(New)], instance=instance, resources=resources)
    meta = new.get_asset_materialization_events()[0].materialization.metadata
    assert meta["version"].value == old.version and meta["cache_hit"].value is True
