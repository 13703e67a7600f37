"""versioned_asset's resources and versioned_ins options, and StageContext.dagster_context."""

import dagster as dg
import pytest

from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource, StageContext, versioned_asset


class Greeting(dg.ConfigurableResource):
    word: str = "hello"


@versioned_asset(key="upstream", code_version="1")
def upstream(ctx: StageContext):
    return {"n": 1}


def _asset(versioned_ins):
    @versioned_asset(
        key="downstream", code_version="1", ins={"up": "upstream"}, resources={"greeting": Greeting}, versioned_ins=versioned_ins
    )
    def downstream(ctx: StageContext, up, greeting: Greeting):
        return {"word": greeting.word, "run_tag": ctx.dagster_context.run.tags.get("who", "")}

    return downstream


def _materialize(tmp_path, asset, **kw):
    store = ArtifactStoreResource(prefix=str(tmp_path))
    resources = {"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store), "greeting": Greeting(word="hi")}
    return dg.materialize([upstream, asset], resources=resources, **kw)


def _meta(result, key="downstream"):
    [event] = [e for e in result.get_asset_materialization_events() if e.asset_key.to_user_string() == key]
    return {k: v.value for k, v in event.materialization.metadata.items()}


def test_resources_and_the_dagster_context_reach_the_body(tmp_path):
    meta = _meta(_materialize(tmp_path, _asset(None), tags={"who": "me"}))
    assert meta["count/word"] == "hi" and meta["count/run_tag"] == "me"


def test_versioned_ins_choose_which_upstream_versions_count(tmp_path):
    with_up = _meta(_materialize(tmp_path / "a", _asset(None)))["version"]
    without_up = _meta(_materialize(tmp_path / "b", _asset(lambda config: ())))["version"]
    assert with_up != without_up  # the same asset and config: only the upstream version differs


def test_versioned_ins_must_name_inputs(tmp_path):
    with pytest.raises(Exception, match=r"versioned_ins names \['upp'\], not inputs of the asset"):
        _materialize(tmp_path, _asset(lambda config: {"upp"}))


def _asset_with_version_inputs(version_inputs):
    @versioned_asset(key="downstream", code_version="1", ins={"up": "upstream"}, version_inputs=version_inputs)
    def downstream(ctx: StageContext, up):
        return {"up_version": up.version}

    return downstream


def test_version_inputs_replace_the_upstream_versions(tmp_path):
    """Early cutoff's hook: the version follows what the hook names, not the upstream's version."""
    default = _meta(_materialize(tmp_path / "a", _asset(None)))
    run_a = _materialize(tmp_path / "b", _asset_with_version_inputs(lambda c, p, ins: {"list": "digest-a"}))
    digest_a, upstream_meta = _meta(run_a), _meta(run_a, "upstream")
    digest_a_again = _meta(_materialize(tmp_path / "c", _asset_with_version_inputs(lambda c, p, ins: {"list": "digest-a"})))
    digest_b = _meta(_materialize(tmp_path / "d", _asset_with_version_inputs(lambda c, p, ins: {"list": "digest-b"})))
    assert digest_a["version"] == digest_a_again["version"]
    assert len({default["version"], digest_a["version"], digest_b["version"]}) == 3
    assert digest_a["count/up_version"] == upstream_meta["version"]  # the body still gets the input


def test_version_inputs_must_be_strings(tmp_path):
    with pytest.raises(Exception, match=r"version_inputs must map non-empty labels to non-empty version strings"):
        _materialize(tmp_path, _asset_with_version_inputs(lambda c, p, ins: {"list": ""}))


def test_on_ref_runs_on_a_computed_artifact_and_on_a_cache_hit(tmp_path):
    seen: list[tuple[str, str]] = []

    @versioned_asset(key="upstream", code_version="1", on_ref=lambda ref, context: seen.append((ref.version, context.run.run_id)))
    def hooked(ctx: StageContext):
        return {"n": 1}

    first = _materialize_one(tmp_path, hooked)
    second = _materialize_one(tmp_path, hooked)
    assert [v for v, _ in seen] == [first["version"]] * 2 and second["cache_hit"] and not first["cache_hit"]
    assert len({run for _, run in seen}) == 2


def test_on_ref_is_refused_on_partitioned_assets():
    with pytest.raises(ValueError, match="on_ref is for unpartitioned assets"):
        versioned_asset(key="p", code_version="1", partitions_def=dg.StaticPartitionsDefinition(["a"]), on_ref=lambda r, c: None)


def _materialize_one(tmp_path, asset):
    store = ArtifactStoreResource(prefix=str(tmp_path))
    result = dg.materialize([asset], resources={"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)})
    return _meta(result, "upstream")
