"""Users' files through the DataKit under Dagster: the new_user_shards sensor
(sensors/user_shards.py), the watched source it feeds (sources/user), and a training phase
whose mixture names `user` picking the new file up.

Real files in tmp_path, a real ephemeral instance; the runs the sensor requests are
materialised with the stand-ins of test_shard_assets for the graph's fixed inputs.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import dagster as dg
import pytest

from assets.datakit import make_datakit_graph
from assets.datakit.datasets import mixture_asset
from assets.datakit.sources import input_names, input_source, watched_source
from assets.partitions import EXACT_BUCKETS, FUZZY_BANDS, datakit_shards
from marin_assets.datakit.watched_dir import WATCH_ENV, directory_digest
from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource
from marin_assets.orchestration.waves import materialize_waves
from marin_assets.store.fsutil import sha256_file
from sensors.user_shards import DIGEST_TAG, REQUEST_TAG, user_shards_sensor
from tests.assets.shard_corpus import base_records, prose
from tests.assets.test_shard_assets import eval_ngrams, quality_model, raw_blobs, raw_source, tokenizer

SOURCE, INDEX = dg.AssetKey(["sources", "user"]), dg.AssetKey(["shards", "index"])
MIX = {"ops": {"mixture": {"config": {"schedule": [{"step": 0, "weights": {"user": 1.0}}]}}}}  # the mixture over sources/user


class Graph:
    """sources/user + the sharded graph over it + the sensor, on one instance and store."""

    def __init__(self, tmp_path, train=None, backend=None):
        self.source = watched_source("user")
        self.index, *self.steps = [*make_datakit_graph({"user": "sources/user"}), mixture_asset(["user"])]
        self.assets = [self.source, quality_model, eval_ngrams, tokenizer, self.index, *self.steps, *([train] if train else [])]
        self.sensor = user_shards_sensor(self.source, self.index, self.steps)
        self.instance = dg.DagsterInstance.ephemeral()
        store = ArtifactStoreResource(prefix=str(tmp_path / "prefix"))
        self.store = store.store
        self.resources = {
            "artifact_store": store,
            "artifact_io": ArtifactIOManager(artifact_store=store),
            **({"training_backend": backend} if backend else {}),
        }
        self.defs = dg.Definitions(assets=self.assets, sensors=[self.sensor], resources=self.resources)

    def tick(self, cursor: str | None):
        """The sensor's evaluation as the daemon does it (run requests resolved and validated)."""
        context = dg.build_sensor_context(instance=self.instance, cursor=cursor, definitions=self.defs)
        return self.sensor.evaluate_tick(context)

    def run(self, request: dg.RunRequest) -> dg.ExecuteInProcessResult:
        return dg.materialize(
            self.assets,
            selection=request.asset_selection,
            run_config=request.run_config,
            tags=request.tags,
            instance=self.instance,
            resources=self.resources,
            raise_on_error=False,
        )

    def shards(self) -> list[str]:
        return self.instance.get_dynamic_partitions(datakit_shards.name)


def write(directory, name: str, records: list) -> None:
    (directory / name).write_text(raw_blobs({name: records})[name])


@pytest.fixture
def watched(tmp_path, monkeypatch):
    directory = tmp_path / "watched"
    directory.mkdir()
    monkeypatch.setenv(WATCH_ENV, str(directory))
    return directory


def test_new_file_becomes_shard_partitions_then_one_backfill_of_every_step(tmp_path, watched):
    graph = Graph(tmp_path)
    write(watched, "a.jsonl", base_records())
    files = {"a.jsonl": sha256_file(str(watched / "a.jsonl"))}
    digest = directory_digest(files)

    first = graph.tick(None)
    (request,) = first.run_requests
    assert request.run_key == f"user-files-1@{digest[:16]}"
    assert set(request.asset_selection) == {SOURCE, INDEX}
    assert (request.tags[DIGEST_TAG], request.tags[REQUEST_TAG], request.tags["dagster/sensor_name"]) == (
        digest,
        request.run_key,
        "new_user_shards",
    )
    assert request.run_config == {"ops": {graph.source.op.name: {"config": {"directory": str(watched), "expected": digest}}}}
    assert json.loads(first.cursor)["files"] == files
    # A replayed tick (same cursor) asks for the same run_key, which Dagster runs once ...
    assert [r.run_key for r in graph.tick(None).run_requests] == [request.run_key]
    # ... and the next tick waits for that run instead of backfilling an index about to change.
    waiting = graph.tick(first.cursor)
    assert waiting.run_requests == [] and waiting.skip_message == f"waiting for sources/user + shards/index of {request.run_key}"

    assert graph.shards() == []
    assert graph.run(request).success
    assert graph.shards() == ["user-a-00000"]  # registered by the index's on_ref

    second = graph.tick(first.cursor)
    (backfill,) = second.run_requests
    subset = backfill.asset_graph_subset
    assert subset.asset_keys == {a.key for a in graph.steps}
    partitions = {k.to_user_string(): set(s.get_partition_keys()) for k, s in subset.partitions_subsets_by_asset_key.items()}
    assert partitions["shards/normalized"] == partitions["shards/tokenized"] == {"user-a-00000"}
    assert len(partitions["shards/exact_reduce"]) == EXACT_BUCKETS and len(partitions["shards/fuzzy_candidates"]) == FUZZY_BANDS
    assert subset.non_partitioned_asset_keys == {
        dg.AssetKey(["shards", "fuzzy_removals"]),
        dg.AssetKey(["datasets", "user"]),
        dg.AssetKey("mixture"),
    }
    assert backfill.tags[DIGEST_TAG] == digest and backfill.tags[REQUEST_TAG] == request.run_key
    # What the sensor daemon does with it (dagster/_daemon/sensor.py): one stored asset backfill.
    from dagster._core.execution.backfill import PartitionBackfill

    graph.instance.add_backfill(
        PartitionBackfill.from_asset_graph_subset(
            backfill_id="b1",
            backfill_timestamp=0.0,
            tags=backfill.tags,
            dynamic_partitions_store=graph.instance,
            asset_graph_subset=subset,
            title=None,
            description=None,
            run_config=None,
        )
    )
    (stored,) = graph.instance.get_backfills()
    assert stored.asset_backfill_data.target_subset == subset and set(stored.asset_selection) == subset.asset_keys

    third = graph.tick(second.cursor)  # replayed after the backfill: nothing twice
    assert third.run_requests == [] and "no new files" in third.skip_message

    # A changed file re-requests the source + index; reverting it re-requests again (a new run_key).
    write(watched, "a.jsonl", base_records()[:5])
    changed = graph.tick(second.cursor)
    (again,) = changed.run_requests
    assert again.run_key.startswith("user-files-2@") and again.tags[DIGEST_TAG] != digest
    write(watched, "a.jsonl", base_records())
    (reverted,) = graph.tick(changed.cursor).run_requests
    assert reverted.run_key == f"user-files-3@{digest[:16]}"


def test_empty_unset_and_escaping_entries_skip_with_the_reason(tmp_path, watched, monkeypatch):
    graph = Graph(tmp_path)
    empty = graph.tick(None)
    assert empty.run_requests == [] and empty.skip_message == f"no usable files in {watched} (want .jsonl/.parquet/.txt)"

    outside = tmp_path / "outside"
    outside.mkdir()
    write(outside, "secret.jsonl", [{"text": "not yours"}])
    (watched / "leak.jsonl").symlink_to(outside / "secret.jsonl")
    only_leak = graph.tick(None)
    assert only_leak.run_requests == []
    assert "skipped leak.jsonl: " in only_leak.skip_message and "outside the input" in only_leak.skip_message

    write(watched, "mine.jsonl", [{"text": "yours"}])
    (request,) = graph.tick(None).run_requests
    assert graph.run(request).success
    ref = graph.store.read_pointer("sources/user", None)
    assert [os.path.basename(f) for f in ref.files()] == ["mine.jsonl"]
    assert (
        ref.counts["files"] == 1
        and ref.counts["skipped"] == 1
        and "outside the input" in ref.counts["skip_reasons"]["leak.jsonl"]
    )
    assert graph.shards() == ["user-mine-00000"]

    monkeypatch.delenv(WATCH_ENV)
    unset = graph.tick(None)
    assert unset.run_requests == [] and unset.skip_message.startswith(f"set {WATCH_ENV} to a directory")


def _materialize_source(graph: Graph, config: dict | None = None) -> dg.ExecuteInProcessResult:
    run_config = {"ops": {graph.source.op.name: {"config": config}}} if config else None
    return dg.materialize(
        [graph.source], instance=graph.instance, resources=graph.resources, run_config=run_config, raise_on_error=False
    )


def _version(result: dg.ExecuteInProcessResult) -> tuple[str, bool]:
    metadata = result.get_asset_materialization_events()[0].materialization.metadata
    return metadata["version"].value, metadata["cache_hit"].value


def test_the_watched_source_is_versioned_by_file_content_not_paths_or_times(tmp_path, watched, monkeypatch):
    graph = Graph(tmp_path)
    write(watched, "a.jsonl", [{"text": prose(1)}])
    version, hit = _version(_materialize_source(graph))
    assert not hit
    os.utime(watched / "a.jsonl", (1, 1))  # only the time changes: a cache hit
    assert _version(_materialize_source(graph)) == (version, True)
    elsewhere = tmp_path / "elsewhere"  # the same files under another path: the same version
    elsewhere.mkdir()
    write(elsewhere, "a.jsonl", [{"text": prose(1)}])
    assert _version(_materialize_source(graph, {"directory": str(elsewhere)})) == (version, True)
    write(watched, "a.jsonl", [{"text": prose(2)}])
    changed, hit = _version(_materialize_source(graph))
    assert changed != version and not hit

    # A run whose files differ from what the sensor saw fails, naming both digests.
    stale = _materialize_source(graph, {"expected": "0" * 32})
    assert not stale.success
    (failure,) = [e for e in stale.all_events if e.event_type_value == "STEP_FAILURE"]
    message = failure.event_specific_data.error.cause.message
    assert "changed" in message and "0" * 32 in message and "the sensor saw" in message

    monkeypatch.delenv(WATCH_ENV)  # unset: an empty source (the demo's sources still shard)
    result = _materialize_source(graph)
    assert result.success and graph.store.read_pointer("sources/user", None).counts["files"] == 0


def _computed(results: list[dg.ExecuteInProcessResult], key: str) -> set[str]:
    return {
        e.partition or ""
        for r in results
        for e in r.get_asset_materialization_events()
        if e.asset_key.to_user_string() == key and not e.materialization.metadata["cache_hit"].value
    }


@pytest.mark.slow
def test_a_new_file_adds_its_shard_and_only_it_and_the_reduces_recompute(tmp_path, watched):
    """Both sensor steps, each requested run materialised (the backfill's waves as a local
    run plans them); the second file brings new documents only, so the first shard's
    removal lists keep their digests and everything after them stays cached. Its name sorts
    before the first's: shard keys follow their own file, so no shard is renamed."""
    graph = Graph(tmp_path)
    graph.run(dg.RunRequest(asset_selection=[dg.AssetKey("quality_model"), dg.AssetKey("eval_ngrams"), dg.AssetKey("tokenizer")]))

    def sync(cursor: str | None, expect_shards: list[str]) -> tuple[str, list[dg.ExecuteInProcessResult]]:
        files = graph.tick(cursor)
        (request,) = files.run_requests
        assert graph.run(request).success and graph.shards() == expect_shards
        shards = graph.tick(files.cursor)
        (backfill,) = shards.run_requests
        results = materialize_waves(
            graph.assets,
            graph.instance,
            graph.resources,
            selection=backfill.asset_graph_subset.asset_keys,
            log=lambda line: None,
            run_config=MIX,
        )
        assert results and all(r.success for r in results)
        return shards.cursor, results

    write(watched, "m.jsonl", base_records())
    cursor, first = sync(None, ["user-m-00000"])
    assert _computed(first, "shards/tokenized") == {"user-m-00000"}

    write(watched, "b.jsonl", [{"text": prose(500), "id": "b0"}, {"text": prose(501), "id": "b1"}])
    cursor, second = sync(cursor, ["user-m-00000", "user-b-00000"])  # registration order: the new key last
    for key in (
        "shards/normalized",
        "shards/exact_map",
        "shards/filtered_exact",
        "shards/fuzzy_map",
        "shards/final",
        "shards/tokenized",
    ):
        assert _computed(second, key) == {"user-b-00000"}, key
    assert len(_computed(second, "shards/exact_reduce")) == EXACT_BUCKETS
    assert _computed(second, "shards/fuzzy_removals") == {""}
    final = graph.store.read_pointer("shards/final", "user-b-00000").counts
    assert (final["docs_in"], final["docs_out"]) == (2, 2)

    # A removed file: its partitions go with it (the index deletes them), so the backfill over
    # every partition succeeds and the reduces read only the files that are there.
    (watched / "m.jsonl").unlink()
    cursor, third = sync(cursor, ["user-b-00000"])
    assert graph.store.read_pointer("shards/fuzzy_removals", None).counts["shards"] == 1
    assert {tuple(read["maps"]) for read in _reduce_reads(graph, "shards/exact_reduce")} == {("user-b-00000",)}


def _reduce_reads(graph: Graph, key: str) -> list[dict]:
    from assets.datakit.common import REDUCE_READ
    from marin_assets.datakit.shards import read_committed_json

    defn = next(a for a in graph.steps if a.key.to_user_string() == key).partitions_def
    return [read_committed_json(f"{graph.store.read_pointer(key, p).data_path}/{REDUCE_READ}") for p in defn.get_partition_keys()]


def test_an_empty_user_source_leaves_the_other_sources_shards(tmp_path, monkeypatch):
    """What `make demo` runs with $MARIN_USER_DATA_DIR unset: sources/user is empty, and the
    index over it and another source holds that source's shards only."""
    monkeypatch.delenv(WATCH_ENV, raising=False)
    source = watched_source("user")
    index = make_datakit_graph({"tiny": "sources/tiny", "user": "sources/user"})[0]
    graph = Graph(tmp_path)
    result = dg.materialize(
        [raw_source({"raw.jsonl": base_records()}), source, index], instance=graph.instance, resources=graph.resources
    )
    assert result.success
    counts = graph.store.read_pointer("shards/index", None).counts
    assert counts["per_source"] == {"tiny": 1, "user": 0} and graph.shards() == ["tiny-raw-00000"]


def test_input_files_are_named_by_their_path_inside_the_input(tmp_path):
    from marin_assets.datakit.readers import list_input_files

    (tmp_path / "in" / "x").mkdir(parents=True)
    for name in ("m.jsonl", "x/m.jsonl", "_counts.json"):
        (tmp_path / "in" / name).write_text('{"text": "a"}\n')
    names = input_names(str(tmp_path / "in"), list_input_files(str(tmp_path / "in")))
    assert [n for n, _ in names] == ["m.jsonl", "x/m.jsonl"]  # sidecars are not listed
    assert input_names(str(tmp_path / "in" / "m.jsonl"), [str(tmp_path / "in" / "m.jsonl")]) == [
        ("m.jsonl", str(tmp_path / "in" / "m.jsonl"))
    ]


def test_a_file_added_to_an_input_renames_no_shard_wherever_it_sorts(tmp_path):
    """`marin datakit run --input DIR` (sources/<name> of user_inputs): the shards of the
    files already there keep their keys and bytes when a file whose name sorts first comes."""
    from assets.datakit.index import index_keys

    directory = tmp_path / "in"
    (directory / "x").mkdir(parents=True)
    write(directory, "m.jsonl", base_records())
    write(directory / "x", "m.jsonl", [{"text": prose(600), "id": "x0"}])  # same name, another folder
    graph = Graph(tmp_path)
    index = make_datakit_graph({"docs": "sources/docs"})[0]

    def shards() -> dict[str, str]:
        result = dg.materialize(
            [input_source("docs", str(directory), 1 << 20), index],
            instance=graph.instance,
            resources=graph.resources,
            run_config={"ops": {index.op.name: {"config": {"shard_bytes": 2500}}}},
        )
        assert result.success
        ref = graph.store.read_pointer("shards/index", None)
        entries = json.loads(Path(ref.data_path, "index.json").read_text())
        assert sorted(entries) == index_keys(ref)
        return {k: e["sha256"] for k, e in entries.items()}

    before = shards()
    # m.jsonl is "m"; x/m.jsonl is "x_m_" + the hash of its path inside the input.
    assert len(before) == 5 and Counter(k.rsplit("-", 1)[0] for k in before)["docs-m"] == 4
    assert sum(k.startswith("docs-x_m_") for k in before) == 1
    write(directory, "a.jsonl", [{"text": prose(601), "id": "a0"}])
    after = shards()
    assert {k: after[k] for k in before} == before and set(after) - set(before) == {"docs-a-00000"}


@pytest.mark.slow
def test_a_file_dropped_into_the_watched_directory_reaches_the_next_phase(tmp_path, watched):
    """A mixture that names `user`: the phase after the sensors brought a new file in trains on
    a dataset whose shards include the file's, read in place by the trainer's loader."""
    import dataclasses

    from assets.partitions import demo_phases
    from assets.training import train_phase
    from marin_assets.datakit.datasets import read_dataset
    from marin_assets.train.data.token_caches import open_source
    from tests.orchestration.phase_job import phase_run_config, phase_spec
    from tests.orchestration.test_train_phase_asset import SEEN, RecordingBackend

    graph = Graph(tmp_path, train=train_phase, backend=RecordingBackend())
    graph.instance.add_dynamic_partitions(demo_phases.name, ["kestrel", "ocelot"])
    mix = MIX
    graph.run(dg.RunRequest(asset_selection=[dg.AssetKey("quality_model"), dg.AssetKey("eval_ngrams"), dg.AssetKey("tokenizer")]))

    def sync(cursor: str | None) -> str:
        files = graph.tick(cursor)
        (request,) = files.run_requests
        assert graph.run(request).success
        shards = graph.tick(files.cursor)
        (backfill,) = shards.run_requests
        results = materialize_waves(
            graph.assets,
            graph.instance,
            graph.resources,
            run_config=mix,
            selection=backfill.asset_graph_subset.asset_keys,
            log=lambda line: None,
        )
        assert results and all(r.success for r in results)
        return shards.cursor

    def phase(name: str) -> dict:
        SEEN.clear()
        spec = {**dataclasses.asdict(phase_spec(name, 8)), "mixture": None}  # trains on the mixture asset's schedule
        assert dg.materialize(
            graph.assets,
            selection=[train_phase],
            partition_key=name,
            instance=graph.instance,
            resources=graph.resources,
            run_config=phase_run_config(spec),
        ).success
        [(train_spec, _)] = SEEN
        dataset = read_dataset(train_spec.caches["user"])
        return {
            "shards": [s.key for s in dataset.shards],
            "tokens": open_source(train_spec.caches["user"]).train.num_tokens,
            "expected": dataset.train_tokens,
        }

    write(watched, "m.jsonl", base_records())
    cursor = sync(None)
    before = phase("kestrel")
    assert before["shards"] == ["user-m-00000"] and before["tokens"] == before["expected"] > 0

    write(watched, "b.jsonl", [{"text": prose(500), "id": "b0"}, {"text": prose(501), "id": "b1"}])
    sync(cursor)
    after = phase("ocelot")
    assert after["shards"] == ["user-b-00000", "user-m-00000"]  # the new file's shard, read in place
    assert (
        after["tokens"]
        == after["expected"]
        == before["tokens"] + graph.store.read_pointer("shards/tokenized", "user-b-00000").counts["train_tokens"]
    )
