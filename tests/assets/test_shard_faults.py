"""Acceptance (issue 12): a shard's worker killed mid-partition on the real sharded graph.

The graph's first waves run through `materialize_waves` with two local workers (a range run
forks a pool); the normalize of one shard SIGKILLs its own worker process. Then: the other
shards' artifacts are committed (pointers written, events recorded), the step fails naming
that shard and the signal, and a rerun computes only the killed shard (cache_hit on every
other partition), then carries on downstream.
"""

from __future__ import annotations

import os
import signal

import dagster as dg
import pytest

import assets.datakit.normalized as normalized_module
from assets.datakit import make_datakit_graph
from assets.partitions import datakit_shards
from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource
from marin_assets.orchestration.fanout import WORKERS_ENV
from marin_assets.orchestration.waves import materialize_waves
from tests.assets.shard_corpus import SOURCE, base_records
from tests.assets.test_shard_assets import SHARD_BYTES, eval_ngrams, quality_model, raw_source, tokenizer

SELECTION = [dg.AssetKey(["shards", name]) for name in ("index", "normalized", "pii", "language", "quality", "exact_map")]
VICTIM = f"{SOURCE}-raw-00000-00002"


def _killing_normalize(victim_file: str, parent_pid: int):
    """normalize() that SIGKILLs the worker process given the victim's raw shard file."""
    real = normalized_module.normalize

    def normalize(paths, out_dir, config):
        if any(os.path.basename(p) == victim_file for p in paths):
            if os.getpid() == parent_pid:  # never kill the test process itself
                raise AssertionError("the victim shard was computed in the test process, not on a worker")
            os.kill(os.getpid(), signal.SIGKILL)
        return real(paths, out_dir, config)

    return normalize


def _materialize(assets, instance, resources, seen: list[str]):
    index = next(a for a in assets if a.key.to_user_string() == "shards/index")
    return materialize_waves(
        assets,
        instance,
        resources,
        selection=SELECTION,
        log=seen.append,
        run_config={"ops": {index.op.name: {"config": {"shard_bytes": SHARD_BYTES}}}},
    )


def _messages(error) -> str:
    """The step error's message and its causes' (Dagster wraps the body's exception)."""
    return "" if error is None else error.message + _messages(error.cause)


def _events(results) -> dict[tuple[str, str | None], bool]:
    """{(asset key, partition): cache_hit} of every materialization the runs recorded."""
    return {
        (e.asset_key.to_user_string(), e.partition): e.materialization.metadata["cache_hit"].value
        for r in results
        for e in r.get_asset_materialization_events()
    }


@pytest.mark.forks
@pytest.mark.slow
def test_a_killed_shard_worker_fails_only_its_shard_and_a_rerun_computes_only_it(tmp_path, monkeypatch):
    store = ArtifactStoreResource(prefix=str(tmp_path / "prefix"))
    resources = {"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)}
    instance = dg.DagsterInstance.ephemeral()
    assets = [
        raw_source({"raw-00000.jsonl": base_records()}),
        quality_model,
        eval_ngrams,
        tokenizer,
        *make_datakit_graph({SOURCE: f"sources/{SOURCE}"}),
    ]
    assert dg.materialize(assets[:4], instance=instance, resources=resources).success
    monkeypatch.setenv(WORKERS_ENV, "2")
    monkeypatch.setattr(normalized_module, "normalize", _killing_normalize(f"{VICTIM}.jsonl", os.getpid()))

    log: list[str] = []
    first = _materialize(assets, instance, resources, log)
    shards = sorted(instance.get_dynamic_partitions(datakit_shards.name))
    assert len(shards) == 4 and VICTIM in shards
    others = [s for s in shards if s != VICTIM]
    # wave 1 (the index) succeeded, wave 2 failed and nothing after it started
    assert [r.success for r in first] == [True, False]
    assert log[-1].startswith("wave 2/") and "failed" in log[-1]
    [failure] = [e for e in first[1].all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    message = _messages(failure.event_specific_data.error)
    assert f"1 of 4 partitions failed ('{VICTIM}')" in message and "3 committed" in message
    assert f"killed by SIGKILL while computing partition '{VICTIM}'" in message
    for other in others:
        assert other not in message
    # the other shards are committed (pointer + event); the victim has neither
    assert {s: store.store.read_pointer("shards/normalized", s) is not None for s in shards} == {s: s != VICTIM for s in shards}
    assert _events(first[1:]) == {("shards/normalized", s): False for s in others}

    monkeypatch.undo()  # the victim's worker lives now
    monkeypatch.setenv(WORKERS_ENV, "2")
    second = _materialize(assets, instance, resources, [])
    assert all(r.success for r in second)
    events = _events(second)
    assert {s: events[("shards/normalized", s)] for s in shards} == {s: s != VICTIM for s in shards}
    assert events[("shards/index", None)] is True
    # steps that never ran before compute every shard, now that the failed step is whole
    for key in ("shards/quality", "shards/exact_map"):
        assert {s: events[(key, s)] for s in shards} == {s: False for s in shards}


def test_the_kill_switch_refuses_to_kill_the_test_process(tmp_path):
    """With one worker a range computes in this process: the wrapper must raise, not kill."""
    raw = tmp_path / f"{VICTIM}.jsonl"
    raw.write_text('{"text": "x"}\n')
    with pytest.raises(AssertionError, match="in the test process"):
        _killing_normalize(raw.name, os.getpid())([str(raw)], str(tmp_path / "out"), None)
