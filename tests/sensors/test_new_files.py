import json

import dagster as dg

from sensors.new_files import WATCH_ENV, new_user_files


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
    from assets.user_data import normalized_user, user_files
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
