import json
import os

import dagster as dg
import pytest

from assets.user_data import normalized_user
from sensors.new_files import WATCH_ENV, new_files_sensor, scan

new_user_files = new_files_sensor(normalized_user)  # as definitions.py builds it


def _tick(instance, cursor=None):
    return new_user_files(dg.build_sensor_context(instance=instance, cursor=cursor))


def test_new_files_become_partitions_once_and_changes_are_picked_up(tmp_path, monkeypatch):
    monkeypatch.setenv(WATCH_ENV, str(tmp_path))
    (tmp_path / "a.jsonl").write_text('{"text": "hello world"}\n')
    (tmp_path / "b.txt").write_text("some text\n")
    (tmp_path / "notes.docx").write_bytes(b"PK\x03\x04")
    (tmp_path / "bad name.jsonl").write_text('{"text": "x"}\n')
    instance = dg.DagsterInstance.ephemeral()

    first = _tick(instance)
    assert sorted(r.partition_key for r in first.run_requests) == ["a.jsonl", "b.txt"]
    assert first.dynamic_partitions_requests[0].partition_keys == ["a.jsonl", "b.txt"]
    config = first.run_requests[0].run_config["ops"]["normalized__user"]["config"]
    assert config["directory"] == str(tmp_path) and len(config["sha256"]) == 64

    replay = _tick(instance, first.cursor)  # same files: nothing requested again
    assert isinstance(replay, dg.SkipReason)

    (tmp_path / "a.jsonl").write_text('{"text": "hello again"}\n')
    changed = _tick(instance, first.cursor)
    assert [r.partition_key for r in changed.run_requests] == ["a.jsonl"]
    assert changed.run_requests[0].run_key != first.run_requests[0].run_key
    assert changed.dynamic_partitions_requests[0].partition_keys == []  # already a partition
    assert set(json.loads(changed.cursor)) == {"a.jsonl", "b.txt"}


def test_sensor_skips_with_a_reason_when_unconfigured(monkeypatch):
    monkeypatch.delenv(WATCH_ENV, raising=False)
    result = _tick(dg.DagsterInstance.ephemeral())
    assert isinstance(result, dg.SkipReason) and WATCH_ENV in result.skip_message


def test_sensor_requests_materialise_the_user_partition(tmp_path, monkeypatch):
    from assets.partitions import user_files
    from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource

    data = tmp_path / "data"
    data.mkdir()
    (data / "docs.jsonl").write_text('{"text": "first document"}\n{"text": "second document"}\nnot json\n')
    monkeypatch.setenv(WATCH_ENV, str(data))
    instance = dg.DagsterInstance.ephemeral()
    tick = _tick(instance)
    instance.add_dynamic_partitions(user_files.name, tick.dynamic_partitions_requests[0].partition_keys)
    store = ArtifactStoreResource(prefix=str(tmp_path / "prefix"))
    request = tick.run_requests[0]
    result = dg.materialize(
        [normalized_user], partition_key=request.partition_key, run_config=request.run_config, instance=instance,
        resources={"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)},
    )
    meta = result.get_asset_materialization_events()[0].materialization.metadata
    assert (meta["count/docs_in"].value, meta["count/docs_out"].value, meta["count/quarantined"].value) == (3, 2, 1)


def _materialize_user_file(tmp_path, directory, name, instance=None):
    from assets.partitions import user_files
    from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource

    instance = instance or dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(user_files.name, [name])
    store = ArtifactStoreResource(prefix=str(tmp_path / "prefix"))
    return dg.materialize(
        [normalized_user], partition_key=name, instance=instance, raise_on_error=False,
        run_config={"ops": {"normalized__user": {"config": {"directory": str(directory)}}}},
        resources={"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)},
    )


def test_links_out_of_the_watched_directory_are_refused_by_sensor_and_asset(tmp_path, monkeypatch):
    watched, outside = tmp_path / "watched", tmp_path / "outside"
    watched.mkdir(), outside.mkdir()
    (outside / "secret.jsonl").write_text('{"text": "not yours"}\n')
    (watched / "mine.jsonl").write_text('{"text": "yours"}\n')
    (watched / "inner.jsonl").symlink_to(watched / "mine.jsonl")  # a link that stays inside is fine
    (watched / "leak.jsonl").symlink_to(outside / "secret.jsonl")
    (watched / "up.jsonl").symlink_to(os.path.join("..", "outside", "secret.jsonl"))
    monkeypatch.setenv(WATCH_ENV, str(watched))

    tick = _tick(dg.DagsterInstance.ephemeral())
    assert sorted(r.partition_key for r in tick.run_requests) == ["inner.jsonl", "mine.jsonl"]
    usable, skipped = scan(str(watched))
    assert set(skipped) == {"leak.jsonl", "up.jsonl"}
    assert all("outside the directory" in why and str(outside) in why for why in skipped.values())
    assert usable["inner.jsonl"] == usable["mine.jsonl"]

    # The asset refuses the same entries when asked directly (a hand-made run request).
    refused = _materialize_user_file(tmp_path, watched, "leak.jsonl")
    assert not refused.success
    (failure,) = [e for e in refused.all_events if e.event_type_value == "STEP_FAILURE"]
    error = failure.event_specific_data.error
    assert "outside the directory" in error.cause.message and error.cause.cls_name == "ValueError"
    assert _materialize_user_file(tmp_path, watched, "inner.jsonl").success


def test_real_path_inside_keeps_paths_in_the_directory(tmp_path):
    from marin_assets.store.fsutil import real_path_inside

    (tmp_path / "a.txt").write_text("x")
    assert real_path_inside(str(tmp_path), "a.txt") == os.path.realpath(tmp_path / "a.txt")
    for escape in ("../a.txt", "/etc/passwd", ".", ""):
        with pytest.raises(ValueError, match="outside the directory"):
            real_path_inside(str(tmp_path), escape)
    # A sibling whose name starts with the directory's name is outside too (no prefix match).
    (tmp_path.parent / (tmp_path.name + "-evil")).mkdir(exist_ok=True)
    with pytest.raises(ValueError, match="outside the directory"):
        real_path_inside(str(tmp_path), f"../{tmp_path.name}-evil")
