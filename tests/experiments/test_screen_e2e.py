"""A tiny screen end to end, for real: `marin experiment screen` (the DataKit corpus, training,
cache hits, the controls, the report), the immutability rule through the CLI, and the Dagster
assets with ``dg.materialize`` on the same store."""

from __future__ import annotations

import json

import dagster as dg
import pytest
import yaml

from marin_assets.cli import main
from tests.support.byte_tokens import VOCAB_SIZE
from tests.support.configs import SCREEN_MODEL

pytestmark = pytest.mark.slow  # an end-to-end screen: the DataKit driver (a subprocess) and 18 trainings

# model.vocab_size unset: the runs take the dataset's (the byte tokenizer's 257).
MODEL = {k: v for k, v in SCREEN_MODEL.items() if k != "vocab_size"}
# 46368 FLOPs/token x 64 tokens/step: the budgets buy 10, 20 and 40 steps.
RECORD = {
    "name": "tiny_screen",
    "hypothesis": "The same config with other seeds matches the baseline; a 30x lower learning rate is worse.",
    "links": {"issue": 14},
    "baseline": {
        "config": {
            "model": MODEL,
            "seq_len": 16,
            "batch_size": 4,
            "schedule": {"kind": "constant", "warmup_steps": 2, "peak_lr": 0.003},
        }
    },
    "budgets": [3.0e7, 6.0e7, 1.2e8],
    "seeds": [0, 1],
    "validation_windows": 32,
    "bootstrap": 50,
    "data_files": 6,
    "arms": {
        "control_seed": {"change": {}, "seeds": [5, 6], "expect": {"ci_contains": 1.0}},
        # 30x too low: at 10-40 steps a 30x *higher* rate still helped (measured), so it is no control here.
        "control_harm": {"change": {"schedule": {"peak_lr": 0.0001}}, "expect": {"ci_high_below": 1.0}},
    },
    "criterion": {
        "statement": "control_harm is worse than the baseline",
        "checks": [{"arm": "control_harm", "speedup_below": 1.0}],
    },
}
N_RUNS = 3 * (2 + 2 + 2)


@pytest.fixture(scope="module")
def screen(tmp_path_factory):
    """The record file, the store, and the first CLI run's (rc, stdout, stderr)."""
    root = tmp_path_factory.mktemp("screen")
    path = root / "tiny_screen.yaml"
    path.write_text(yaml.safe_dump(RECORD, sort_keys=False))
    store = root / "store"
    return path, store, _cli(path, store, "--report", str(root / "report"))


def _cli(path, store, *extra):
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["experiment", "screen", str(path), "--json", "--store", str(store), *extra])
    return rc, out.getvalue(), err.getvalue()


def test_screen_prints_one_line_per_arm_and_the_controls_hold(screen):
    path, store, (rc, out, err) = screen
    assert rc == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["arm"] for line in lines] == ["control_seed", "control_harm"]
    assert all(set(line) == {"arm", "effective_speedup", "ci_low", "ci_high", "runs"} for line in lines)
    seed, harm = lines
    assert seed["runs"] == 6 and harm["runs"] == 6
    assert seed["ci_low"] <= 1.0 <= seed["ci_high"]
    assert harm["ci_high"] < 1.0 and harm["ci_low"] <= harm["effective_speedup"] <= harm["ci_high"]
    assert f"{N_RUNS} run(s) computed, 0 cached" in err
    assert "DataKit artifact(s) computed" in err  # the corpus was made by the DataKit, in this store
    report = path.parent / "report"
    assert "**Criterion held: yes**" in (report / "report.md").read_text()
    assert (report / "loss_vs_compute.png").read_bytes()[:4] == b"\x89PNG"
    analysis = json.loads((report / "analysis.json").read_text())
    assert analysis["controls_held"] is True and len(analysis["runs"]) == N_RUNS
    steps = sorted({r["steps"] for r in analysis["runs"]})
    assert steps == [10, 20, 40]  # 1.2e8 / 2.97e6 = 40.4 steps, rounded


def test_rerun_is_all_cache_hits(screen):
    path, store, (_, first, _) = screen
    rc, out, err = _cli(path, store)
    assert rc == 0 and out == first
    assert f"0 run(s) computed, {N_RUNS} cached" in err
    assert "every DataKit artifact was a cache hit" in err  # the corpus's DataKit run computed nothing


def test_the_runs_read_the_datakit_dataset(screen):
    """Each run names the dataset it trained and was scored on (its index and version), in its row and
    its provenance, and its content version hashes that dataset's version."""
    import hashlib
    from pathlib import Path

    from marin_assets.experiments.data import corpus_jsonl, open_corpus
    from marin_assets.experiments.record_files import load_record
    from marin_assets.experiments.runs import committed_runs, plan_runs, run_version, runs_key
    from marin_assets.store import ArtifactStore

    path, store_dir, _ = screen
    store = ArtifactStore(str(store_dir))
    corpus = open_corpus(store, RECORD["data_files"])
    digest = hashlib.sha256(corpus_jsonl(RECORD["data_files"])).hexdigest()  # the folder is named by its input
    assert corpus.index == str(store_dir / "experiments" / "corpus" / digest[:16] / "cache" / "dataset.json")
    record = load_record(path)
    specs = {s.key: s for s in plan_runs(record, corpus.vocab_size)}
    rows = committed_runs(store, record.name)
    assert sorted(k for k, _ in rows) == sorted(specs) and len(rows) == N_RUNS
    for key, row in rows:
        assert row["corpus"] == {"index": corpus.index, "version": corpus.version}
        assert row["config"]["model"]["vocab_size"] == VOCAB_SIZE  # the dataset's, the record leaves it unset
        ref = store.read_pointer(runs_key(record.name), key)
        assert ref.version == run_version(specs[key], record, corpus.version)
        provenance = json.loads((Path(ref.path) / "provenance.json").read_text())
        assert provenance["upstream"] == {"corpus": corpus.version} and provenance["corpus"] == {"index": corpus.index}
    analysis = json.loads((path.parent / "report" / "analysis.json").read_text())
    assert analysis["corpus_versions"] == [corpus.version]
    assert f"version {corpus.version[:16]}" in (path.parent / "report" / "report.md").read_text()


def test_editing_a_started_record_is_refused(screen, tmp_path):
    path, store, _ = screen
    edited = tmp_path / "tiny_screen.yaml"
    data = yaml.safe_load(path.read_text())
    data["hypothesis"] = data["hypothesis"].replace("is worse", "is better")
    edited.write_text(yaml.safe_dump(data, sort_keys=False))
    rc, out, err = _cli(edited, store)
    assert rc == 2 and out == ""
    assert "experiment 'tiny_screen' has started runs" in err and "its hypothesis may no longer change" in err


def test_a_failing_control_exits_3(screen, tmp_path):
    """A control with an expectation its runs cannot meet: the screen is not trusted. Another experiment
    (an expectation is frozen with its arm), so its own runs: the baseline and that arm only (12 runs, not
    18), on the first test's corpus (a DataKit cache hit)."""
    path, store, _ = screen
    data = yaml.safe_load(path.read_text())
    data["name"] = "tiny_screen_strict"
    data["arms"] = {"control_harm": {**data["arms"]["control_harm"], "expect": {"ci_low_above": 1.0}}}
    strict = tmp_path / "tiny_screen_strict.yaml"
    strict.write_text(yaml.safe_dump(data))
    rc, out, err = _cli(strict, store)
    assert rc == 3 and len(out.splitlines()) == 1, err
    assert "control control_harm: ci low above 1: FAILED" in err


def test_bad_record_exits_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**RECORD, "name": "bad", "budgets": [1e7]}))
    rc, out, err = _cli(bad, tmp_path / "store")
    assert rc == 2 and out == "" and "need >= 3 budgets" in err


def test_dagster_assets_materialize_runs_analysis_and_report(screen):
    """The record's assets on the CLI's store: the corpus (its DataKit run all cache hits), every run
    partition a cache hit, then the analysis and the report (Markdown with embedded PNGs) materialize."""
    from assets.experiments import build_all, build_experiment_assets
    from marin_assets.experiments.data import open_corpus
    from marin_assets.orchestration import ArtifactStoreResource
    from marin_assets.store import ArtifactStore

    path, store, _ = screen
    runs, analysis, report = build_experiment_assets(path)
    corpus_asset = build_all([path])[0]
    everything = [corpus_asset, runs, analysis, report]
    resources = {"artifact_store": ArtifactStoreResource(prefix=str(store))}
    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize(everything, selection=[corpus_asset.key], resources=resources, instance=instance)
    (made,) = result.asset_materializations_for_node(corpus_asset.node_def.name)[0].metadata["datasets"].value
    corpus = open_corpus(ArtifactStore(str(store)), RECORD["data_files"])
    assert made == {
        "data_files": RECORD["data_files"],
        "index": corpus.index,
        "version": corpus.version,
        "train_tokens": corpus.train_tokens,
        "validation_tokens": corpus.validation_tokens,
        "vocab_size": VOCAB_SIZE,
    }
    keys = runs.partitions_def.get_partition_keys()
    assert len(keys) == N_RUNS and "control_harm-C6e07-s1" in keys
    for key in keys:
        result = dg.materialize(everything, selection=[runs.key], partition_key=key, resources=resources, instance=instance)
        meta = result.asset_materializations_for_node(runs.node_def.name)[0].metadata
        assert meta["cache_hit"].value is True and meta["validation_loss"].value > 0
    result = dg.materialize(everything, selection=[analysis.key, report.key], resources=resources, instance=instance)
    assert result.success
    a_meta = result.asset_materializations_for_node(analysis.node_def.name)[0].metadata
    assert a_meta["controls_held"].value is True and a_meta["runs"].value == N_RUNS
    r_meta = result.asset_materializations_for_node(report.node_def.name)[0].metadata
    markdown = r_meta["report"].value
    assert "# Experiment `tiny_screen`" in markdown and "| control_harm |" in markdown
    assert markdown.count("data:image/png;base64,") == 2
    assert r_meta["criterion_held"].value is True
