"""Range runs of versioned assets: one Dagster run over many partitions, each partition its
own version, artifact, cache hit and materialization, computed on local worker processes."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

import dagster as dg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource, StageContext, versioned_asset
from marin_assets.orchestration.fanout import WORKERS_ENV, fan_out, local_workers, run_forked
from marin_assets.orchestration.waves import RANGE_END_TAG, RANGE_START_TAG
from marin_assets.store import ArtifactRef

SHARDS = dg.DynamicPartitionsDefinition(name="range_test_shards")
KEYS = [f"s{i}" for i in range(6)]
RANGE = {RANGE_START_TAG: KEYS[0], RANGE_END_TAG: KEYS[-1]}
SINGLE_RUN = dg.BackfillPolicy.single_run()

# Range runs here must really fork their workers (tests/conftest.py reruns them in a fresh
# interpreter when an earlier test loaded tensorstore into this one).
pytestmark = [pytest.mark.forks, pytest.mark.slow]  # range runs fork worker processes


def _note(record_dir: Path, asset: str, partition: str) -> None:
    """Which body ran, for which partition, in which process."""
    (record_dir / f"{asset}.{partition}.{uuid.uuid4().hex[:8]}").write_text(str(os.getpid()))


def _ran(record_dir: Path) -> list[tuple[str, str, int]]:
    out = []
    for path in record_dir.iterdir():
        asset, partition, _ = path.name.split(".")
        out.append((asset, partition, int(path.read_text())))
    return sorted(out)


def build(record_dir: Path, kill: str | None = None, test_pid: int | None = None):
    @versioned_asset(key="r/src", code_version="1", partitions_def=SHARDS, backfill_policy=SINGLE_RUN)
    def src(ctx: StageContext):
        _note(record_dir, "src", ctx.partition_key)
        if ctx.partition_key == kill:
            if os.getpid() == test_pid:
                raise AssertionError("would SIGKILL the test process: the body is not running in a worker")
            os.kill(os.getpid(), signal.SIGKILL)
        ctx.log(f"writing {ctx.partition_key}")
        Path(ctx.out_dir, "x.txt").write_text(ctx.partition_key)
        return {"docs": int(ctx.partition_key[1:]) + 1}

    def by_src_version(config, partition, inputs):  # the per-partition hook sees that partition's ref
        assert inputs["src"].partition == partition, (inputs["src"], partition)
        return {"src": inputs["src"].version}

    @versioned_asset(
        key="r/copied",
        code_version="1",
        ins={"src": "r/src"},
        partitions_def=SHARDS,
        backfill_policy=SINGLE_RUN,
        version_inputs=by_src_version,
    )
    def copied(ctx: StageContext, src: ArtifactRef):
        _note(record_dir, "copied", ctx.partition_key)
        Path(ctx.out_dir, "y.txt").write_text(Path(src.files(".txt")[0]).read_text() * 2)
        return {"src_partition": src.partition, "docs": src.counts["docs"]}

    all_src = dg.AssetIn(key=dg.AssetKey(["r", "src"]), partition_mapping=dg.AllPartitionMapping())

    @versioned_asset(
        key="r/everything", code_version="1", ins={"src": all_src}, partitions_def=SHARDS, backfill_policy=SINGLE_RUN
    )
    def everything(ctx: StageContext, src: Mapping[str, ArtifactRef]):
        _note(record_dir, "everything", ctx.partition_key)
        return {"refs": len(src), "keys": ",".join(sorted(src)), "docs": sum(r.counts["docs"] for r in src.values())}

    return [src, copied, everything]


@pytest.fixture
def setup(tmp_path):
    records = tmp_path / "ran"
    records.mkdir()
    store = ArtifactStoreResource(prefix=str(tmp_path / "prefix"))
    resources = {"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)}
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(SHARDS.name, KEYS)
    return records, store, resources, instance


def _events(result) -> dict[tuple[str, str], dict]:
    return {
        (e.asset_key.to_user_string(), e.partition): {k: v.value for k, v in e.materialization.metadata.items()}
        for e in result.get_asset_materialization_events()
    }


def _failure(result) -> str:
    """The one failed step's error, with its cause (the wrapper's message)."""
    [failure] = result.get_step_failure_events()
    return failure.event_specific_data.error.to_string()


def _range_run(assets, resources, instance, **kw):
    return dg.materialize(assets, resources=resources, instance=instance, tags=RANGE, **kw)


def test_a_range_run_gives_each_partition_its_own_version_artifact_and_metadata(setup, monkeypatch):
    records, store, resources, instance = setup
    monkeypatch.setenv(WORKERS_ENV, "2")
    assets = build(records)
    events = _events(_range_run(assets, resources, instance))

    assert sorted(events) == sorted((a, p) for a in ("r/src", "r/copied", "r/everything") for p in KEYS)
    src_versions = {p: events[("r/src", p)]["version"] for p in KEYS}
    assert len(set(src_versions.values())) == 6  # the partition is part of the version
    for p in KEYS:
        meta = events[("r/src", p)]
        assert meta["cache_hit"] is False and meta["count/docs"] == int(p[1:]) + 1
        assert meta["range/partitions"] == 6 and meta["range/computed"] == 6
        ref = store.store.read_pointer("r/src", p)  # the IO manager wrote one pointer per partition
        assert ref.version == meta["version"] and Path(ref.path, "STATUS.json").exists()
        assert Path(ref.files(".txt")[0]).read_text() == p
        assert events[("r/copied", p)]["count/src_partition"] == p  # co-partitioned: its own ref
        # All-mapped over the same partitions: every partition sees all six refs, not its own
        assert events[("r/everything", p)]["count/refs"] == 6
        assert events[("r/everything", p)]["count/keys"] == ",".join(KEYS)
    assert len({events[("r/copied", p)]["version"] for p in KEYS}) == 6

    ran = _ran(records)
    assert sorted((f"r/{a}", p) for a, p, _ in ran) == sorted(events)  # every body ran exactly once
    src_pids = {pid for a, _, pid in ran if a == "src"}
    assert len(src_pids) == 2 and os.getpid() not in src_pids  # two worker processes, not this one

    # A single-partition run computes the same versions: it is all cache hits.
    single = _events(dg.materialize(assets[:2], partition_key="s3", resources=resources, instance=instance))
    assert single[("r/src", "s3")]["version"] == src_versions["s3"]
    assert single[("r/copied", "s3")]["version"] == events[("r/copied", "s3")]["version"]
    assert single[("r/src", "s3")]["cache_hit"] is True and single[("r/copied", "s3")]["cache_hit"] is True
    assert len(_ran(records)) == len(ran)


def test_a_second_range_run_is_all_cache_hits(setup, monkeypatch):
    records, store, resources, instance = setup
    monkeypatch.setenv(WORKERS_ENV, "2")
    first = _events(_range_run(build(records), resources, instance))
    n_ran = len(_ran(records))
    second = _events(_range_run(build(records), resources, instance))
    assert len(_ran(records)) == n_ran == 18  # no body ran the second time
    assert set(second) == set(first)
    for key, meta in second.items():
        assert meta["cache_hit"] is True and meta["version"] == first[key]["version"]
        assert meta["range/computed"] == 0 and meta["range/cache_hits"] == 6


def test_single_partition_runs_then_a_range_share_cache_hits(setup, monkeypatch):
    records, store, resources, instance = setup
    monkeypatch.setenv(WORKERS_ENV, "2")
    assets = build(records)
    single = _events(dg.materialize(assets[:1], partition_key="s1", resources=resources, instance=instance))
    events = _events(_range_run(assets[:1], resources, instance))
    assert events[("r/src", "s1")]["cache_hit"] is True
    assert events[("r/src", "s1")]["version"] == single[("r/src", "s1")]["version"]
    assert [m["cache_hit"] for (_, p), m in sorted(events.items())] == [False, True, False, False, False, False]
    assert events[("r/src", "s0")]["range/computed"] == 5
    assert sorted(p for a, p, _ in _ran(records)) == KEYS  # s1 once, by the single run


def test_one_worker_computes_in_this_process(setup, monkeypatch):
    records, store, resources, instance = setup
    monkeypatch.setenv(WORKERS_ENV, "1")
    assert _range_run(build(records)[:1], resources, instance).success
    assert {pid for _, _, pid in _ran(records)} == {os.getpid()}


def test_the_store_resource_s_worker_count_wins_over_the_environment(tmp_path, setup, monkeypatch):
    """A driver hands its count in the resource (`marin datakit run --workers`), not in os.environ."""
    records, _, _, instance = setup
    monkeypatch.setenv(WORKERS_ENV, "2")
    store = ArtifactStoreResource(prefix=str(tmp_path / "prefix"), local_workers=1)
    resources = {"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)}
    assert _range_run(build(records)[:1], resources, instance).success
    assert {pid for _, _, pid in _ran(records)} == {os.getpid()}


def test_a_killed_worker_fails_the_step_naming_its_partition_and_the_rerun_computes_only_it(setup, monkeypatch):
    records, store, resources, instance = setup
    monkeypatch.setenv(WORKERS_ENV, "2")
    result = _range_run(build(records, kill="s2", test_pid=os.getpid()), resources, instance, raise_on_error=False)
    assert not result.success
    message = _failure(result)
    assert "r/src: 1 of 6 partitions failed ('s2'); 5 committed" in message
    assert "killed by SIGKILL while computing partition 's2'" in message
    assert {p for a, p, _ in _ran(records)} == set(KEYS)  # s2's body started, then its worker died
    committed = {p for p in KEYS if store.store.read_pointer("r/src", p) is not None}
    assert committed == set(KEYS) - {"s2"}
    recorded = _events(result)  # the committed partitions are materialised in Dagster too
    assert sorted(recorded) == [("r/src", p) for p in KEYS if p != "s2"]
    assert not any(a != "src" for a, _, _ in _ran(records))  # the downstream steps did not run

    for path in records.iterdir():
        path.unlink()
    rerun = _events(_range_run(build(records), resources, instance))
    assert [(a, p) for a, p, _ in _ran(records) if a == "src"] == [("src", "s2")]
    assert [p for p in KEYS if not rerun[("r/src", p)]["cache_hit"]] == ["s2"]
    for p in KEYS:
        if p != "s2":
            assert rerun[("r/src", p)]["version"] == recorded[("r/src", p)]["version"]


def test_a_failing_body_fails_only_its_partition(setup, monkeypatch):
    records, store, resources, instance = setup
    monkeypatch.setenv(WORKERS_ENV, "1")  # in process: the original exception is the cause

    @versioned_asset(key="r/src", code_version="1", partitions_def=SHARDS, backfill_policy=SINGLE_RUN)
    def src(ctx: StageContext):
        if ctx.partition_key in ("s1", "s4"):
            raise ValueError(f"bad shard {ctx.partition_key}")
        return {"docs": 1}

    result = _range_run([src], resources, instance, raise_on_error=False)
    message = _failure(result)
    assert "r/src: 2 of 6 partitions failed ('s1', 's4'); 4 committed" in message
    assert "partition 's4': ValueError: bad shard s4" in message
    assert sorted(p for (_, p) in _events(result)) == ["s0", "s2", "s3", "s5"]


def test_a_single_partition_run_loads_only_its_partition(setup, monkeypatch):
    records, store, resources, instance = setup
    monkeypatch.setenv(WORKERS_ENV, "2")
    assets = build(records)
    assert _range_run(assets[:1], resources, instance).success
    os.remove(Path(store.store.partition_dir("r/src", "s0"), "LATEST.json"))  # s0's pointer is gone
    events = _events(
        dg.materialize(assets[:2], selection=[assets[1]], partition_key="s1", resources=resources, instance=instance)
    )
    assert events[("r/copied", "s1")]["count/src_partition"] == "s1"
    with pytest.raises(Exception, match="'r/src' partition 's0' has not been materialised"):
        dg.materialize(assets[:2], selection=[assets[1]], partition_key="s0", resources=resources, instance=instance)


def test_local_workers_reads_the_environment():
    assert local_workers({}) == local_workers({WORKERS_ENV: ""}) == (os.cpu_count() or 1)
    assert local_workers({WORKERS_ENV: "3"}) == 3 and local_workers({WORKERS_ENV: "1024"}) == 1024
    for bad in ("0", "-1", "two", "3\n", " 3", "03", "1025"):
        with pytest.raises(ValueError, match=f"{WORKERS_ENV}="):
            local_workers({WORKERS_ENV: bad})


@given(st.text(max_size=8))
def test_local_workers_takes_exactly_a_count_in_range(text):
    valid = re.fullmatch(r"[1-9][0-9]{0,3}", text) is not None and int(text) <= 1024
    if text == "":
        assert local_workers({WORKERS_ENV: text}) == (os.cpu_count() or 1)
    elif valid:
        assert local_workers({WORKERS_ENV: text}) == int(text)
    else:
        with pytest.raises(ValueError, match=f"{WORKERS_ENV}="):
            local_workers({WORKERS_ENV: text})


def test_fan_out_reports_each_failure_and_keeps_the_rest():
    done: dict[str, int] = {}
    logs: list[str] = []

    def task(key: str, log) -> int:
        log(f"start {key}")
        if key == "c":
            raise KeyError("no c")
        if key == "d":
            os._exit(3)  # a worker that exits without answering
        return os.getpid()

    failures = fan_out(task, ["a", "b", "c", "d", "e"], 2, logs.append, done.__setitem__)
    assert sorted(done) == ["a", "b", "e"] and os.getpid() not in done.values()
    messages = {f.key: f.message for f in failures}
    assert sorted(messages) == ["c", "d"] and messages["c"] == "KeyError: 'no c'"
    assert re.fullmatch(r"worker pid \d+ exit code 3 while computing partition 'd'", messages["d"])
    assert sorted(logs) == [f"start {k}" for k in "abcde"]


def test_partition_metadata_does_not_go_through_the_quadratic_public_call(setup, monkeypatch):
    """add_asset_metadata(partition_key=...) lists the partitions per call; the wrapper fills
    Dagster's accumulator in one update. If an upgrade moves it, this fails (not slows)."""
    records, store, resources, instance = setup
    monkeypatch.setenv(WORKERS_ENV, "1")

    def refuse(*args, **kwargs):
        raise AssertionError("the per-partition public call was used")

    monkeypatch.setattr(dg.AssetExecutionContext, "add_asset_metadata", refuse)
    events = _events(_range_run(build(records)[:1], resources, instance))
    assert [events[("r/src", p)]["count/docs"] for p in KEYS] == [1, 2, 3, 4, 5, 6]


def test_a_range_over_a_static_mapping_gives_each_partition_its_mapped_keys(tmp_path, monkeypatch):
    monkeypatch.setenv(WORKERS_ENV, "2")
    letters = dg.StaticPartitionsDefinition(["a", "b", "c", "d"])
    pairs = dg.StaticPartitionsDefinition(["x", "y"])
    mapping = dg.StaticPartitionMapping({"a": "x", "b": "x", "c": "y", "d": "y"})

    @versioned_asset(key="m/letter", code_version="1", partitions_def=letters, backfill_policy=SINGLE_RUN)
    def letter(ctx: StageContext):
        return {"letter": ctx.partition_key}

    @versioned_asset(
        key="m/pair",
        code_version="1",
        partitions_def=pairs,
        backfill_policy=SINGLE_RUN,
        ins={"letters": dg.AssetIn(key=dg.AssetKey(["m", "letter"]), partition_mapping=mapping)},
    )
    def pair(ctx: StageContext, letters: Mapping[str, ArtifactRef]):
        return {"letters": ",".join(sorted(letters))}

    store = ArtifactStoreResource(prefix=str(tmp_path))
    resources = {"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)}
    instance = dg.DagsterInstance.ephemeral()
    dg.materialize([letter], resources=resources, instance=instance, tags={RANGE_START_TAG: "a", RANGE_END_TAG: "d"})
    ranged = _events(
        dg.materialize(
            [letter, pair],
            selection=[pair],
            resources=resources,
            instance=instance,
            tags={RANGE_START_TAG: "x", RANGE_END_TAG: "y"},
        )
    )
    assert ranged[("m/pair", "x")]["count/letters"] == "a,b" and ranged[("m/pair", "y")]["count/letters"] == "c,d"
    single = _events(dg.materialize([letter, pair], selection=[pair], partition_key="y", resources=resources, instance=instance))
    assert single[("m/pair", "y")]["cache_hit"] is True
    assert single[("m/pair", "y")]["version"] == ranged[("m/pair", "y")]["version"]


def test_fan_out_replaces_a_worker_killed_while_idle(tmp_path):
    """A worker that dies between keys loses nothing: it is replaced, every key runs once."""
    done: dict[str, int] = {}
    killed = tmp_path / "killed"

    def task(key: str, log) -> int:
        # The other worker holds "b" until a's worker is dead, so it cannot take every
        # remaining key before the pool sees the death (a loaded machine did that).
        for _ in range(3000):
            if key == "a" or killed.exists():
                break
            time.sleep(0.01)
        return os.getpid()

    def on_done(key: str, pid: int) -> None:  # runs in this process, while a's worker is idle
        done[key] = pid
        if key == "a":
            os.kill(pid, signal.SIGKILL)
            _wait_until_dead(pid)
            killed.touch()

    failures = fan_out(task, list("abcdef"), 2, lambda _: None, on_done)
    assert failures == [] and sorted(done) == list("abcdef")
    assert done["a"] not in {done[k] for k in "bcdef"}  # nothing ran on the killed worker after a
    assert len(set(done.values())) == 3  # two workers and the replacement


def _wait_until_dead(pid: int) -> None:
    import time

    for _ in range(500):
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                return
        time.sleep(0.01)
    raise AssertionError(f"worker {pid} did not die")


def test_a_version_that_cannot_be_planned_names_its_partition(setup, monkeypatch):
    records, store, resources, instance = setup
    monkeypatch.setenv(WORKERS_ENV, "1")

    def shard_digest(config, partition, inputs):
        return {"raw": {"s0": "d0", "s1": "d1"}[partition]}  # s2 has no digest: an error naming s2

    @versioned_asset(
        key="r/src", code_version="1", partitions_def=SHARDS, backfill_policy=SINGLE_RUN, version_inputs=shard_digest
    )
    def src(ctx: StageContext):
        return {"docs": 1}

    result = dg.materialize(
        [src], resources=resources, instance=instance, raise_on_error=False, tags={RANGE_START_TAG: "s0", RANGE_END_TAG: "s2"}
    )
    assert "r/src partition 's2': its version could not be planned: KeyError: 's2'" in _failure(result)


def test_fan_out_keeps_even_one_key_out_of_this_process():
    """A body's imports (levanter, tensorstore) must not land in the run process: the next range would fork from it."""
    done: dict[str, int] = {}
    assert fan_out(lambda key, log: os.getpid(), ["only"], 2, lambda _: None, done.__setitem__) == []
    assert done["only"] != os.getpid()


def test_fan_out_computes_in_process_when_forking_is_unsafe(monkeypatch):
    """tensorstore aborts a forked child ("fork() use detected"): with it loaded, no fork, and a note says why."""
    import types

    monkeypatch.setitem(sys.modules, "tensorstore", types.ModuleType("tensorstore"))
    done: dict[str, int] = {}
    logs: list[str] = []
    assert fan_out(lambda key, log: os.getpid(), ["a", "b"], 2, logs.append, done.__setitem__) == []
    assert done == {"a": os.getpid(), "b": os.getpid()}
    assert logs == [
        "note: this process has tensorstore loaded (levanter's cache writer), whose threads do not survive "
        "fork(); computing the 2 partition(s) in this process instead of on 2 workers"
    ]


def test_run_forked_returns_the_childs_result_and_the_child_may_fan_out_its_own_workers():
    """The demo runs its DataKit so: tensorstore then loads in the child, and this process can still fork the sweep."""

    def work() -> tuple[int, dict[str, int]]:
        done: dict[str, int] = {}
        assert fan_out(lambda key, log: os.getpid(), ["a", "b"], 2, lambda _: None, done.__setitem__) == []
        sys.modules.setdefault("tensorstore_stand_in_loaded_by_the_child", sys)
        return os.getpid(), done

    child, grandchildren = run_forked(work, lambda _: None)
    assert child != os.getpid()
    assert set(grandchildren) == {"a", "b"} and not {child, os.getpid()} & set(grandchildren.values())
    assert "tensorstore_stand_in_loaded_by_the_child" not in sys.modules


def test_run_forked_names_what_failed_in_the_child():
    def work() -> None:
        raise ValueError("shard s3: bad record 7")

    with pytest.raises(RuntimeError, match=r"forked worker failed: ValueError: shard s3: bad record 7"):
        run_forked(work, lambda _: None)


def test_run_forked_runs_here_when_forking_is_unsafe(monkeypatch):
    import types

    monkeypatch.setitem(sys.modules, "tensorstore", types.ModuleType("tensorstore"))
    assert run_forked(os.getpid, lambda _: None) == os.getpid()
