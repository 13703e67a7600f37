import math

import pytest

from marin_assets.store import ArtifactStore, compute_version, short_version, validate_asset_key


def test_version_is_deterministic_and_sensitive_to_each_input():
    base = dict(
        asset_key="datakit/normalized",
        code_version="1",
        config={"shard_docs": 100},
        partition_key="sotu",
        upstream={"sources/sotu[sotu]": "ab"},
    )
    v = compute_version(**base)
    assert v == compute_version(**base)
    assert len(v) == 64
    changed = [
        {**base, "asset_key": "datakit/other"},
        {**base, "code_version": "2"},
        {**base, "config": {"shard_docs": 101}},
        {**base, "partition_key": "spam"},
        {**base, "upstream": {"sources/sotu[sotu]": "ac"}},
    ]
    assert len({compute_version(**c) for c in changed} | {v}) == 6


def test_version_ignores_dict_ordering():
    a = compute_version("x", "1", {"a": 1, "b": {"c": 2, "d": 3}}, None, {"u1": "1", "u2": "2"})
    b = compute_version("x", "1", {"b": {"d": 3, "c": 2}, "a": 1}, None, {"u2": "2", "u1": "1"})
    assert a == b


def test_same_inputs_under_two_prefixes_give_identical_versions_and_relative_layout(tmp_path):
    version = compute_version("train/kestrel", "3", {"lr": 0.01})
    s1, s2 = ArtifactStore(str(tmp_path / "us-central")), ArtifactStore("memory://eu-west/bucket")
    d1 = s1.version_dir("train/kestrel", None, version)
    d2 = s2.version_dir("train/kestrel", None, version)
    assert d1.endswith(f"train/kestrel/__all__/{short_version(version)}")
    assert d1.split("us-central")[1] == d2.split("bucket")[1]


@pytest.mark.parametrize("bad", ["../x", "a/../b", "/abs", "a//b", "", "x y", "a;rm -rf", ".hidden"])
def test_path_traversal_and_odd_asset_names_are_rejected(bad, tmp_path):
    with pytest.raises(ValueError, match="invalid|empty"):
        ArtifactStore(str(tmp_path)).version_dir(bad, None, "0" * 64)


def test_bad_partition_key_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="partition key"):
        ArtifactStore(str(tmp_path)).version_dir("ok", "../../etc", "0" * 64)


@pytest.mark.parametrize("value", [object(), {1, 2}, math.nan, math.inf, b"bytes"])
def test_non_json_config_values_are_rejected_with_the_field_name(value):
    with pytest.raises(ValueError, match="field 'weird'"):
        compute_version("x", "1", {"weird": value})


def test_validate_asset_key_splits_segments():
    assert validate_asset_key("train/run-1/kestrel") == ("train", "run-1", "kestrel")


@pytest.mark.parametrize("bad", ["ok\n", "ok\r", "a/ok\n", "\nok"])
def test_names_with_a_trailing_newline_are_rejected(bad, tmp_path):
    """`re.match` with `$` accepts "ok\\n"; the check must be a full match."""
    store = ArtifactStore(str(tmp_path))
    with pytest.raises(ValueError, match="invalid asset key segment"):
        store.version_dir(bad, None, "0" * 64)
    with pytest.raises(ValueError, match="invalid partition key"):
        store.version_dir("ok", bad.split("/")[-1], "0" * 64)
