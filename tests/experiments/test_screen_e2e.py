"""A tiny screen end to end, for real: `marin experiment screen` (training, cache hits, the
controls, the report), the immutability rule through the CLI, and the Dagster assets with
``dg.materialize`` on the same store."""

from __future__ import annotations

import json

import dagster as dg
import pytest
import yaml

from marin_assets.cli import main
from tests.support.configs import SCREEN_MODEL

# 46272 FLOPs/token x 64 tokens/step: the budgets buy 10, 20 and 41 steps.
RECORD = {
    "name": "tiny_screen",
    "hypothesis": "The same config with other seeds matches the baseline; a 30x lower learning rate is worse.",
    "links": {"issue": 14},
    "baseline": {"config": {"model": SCREEN_MODEL, "seq_len": 16, "batch_size": 4,
                            "schedule": {"kind": "constant", "warmup_steps": 2, "peak_lr": 0.003}}},
    "budgets": [3.0e7, 6.0e7, 1.2e8], "seeds": [0, 1],
    "validation_windows": 32, "bootstrap": 50, "data_files": 6,
    "arms": {"control_seed": {"change": {}, "seeds": [5, 6], "expect": {"ci_contains": 1.0}},
             # 30x too low: at 10-40 steps a 30x *higher* rate still helped (measured), so it is no control here.
             "control_harm": {"change": {"schedule": {"peak_lr": 0.0001}}, "expect": {"ci_high_below": 1.0}}},
    "criterion": {"statement": "control_harm is worse than the baseline",
                  "checks": [{"arm": "control_harm", "speedup_below": 1.0}]},
}
N_RUNS = 3 * (2 + 2 + 2)


@pytest.fixture(scope="module")
def screen(tmp_path_factory):
    """The record file, the store, and the first CLI run's (rc, stdout, stderr)."""
    import jax

    root = tmp_path_factory.mktemp("screen")
    jax.config.update("jax_compilation_cache_dir", str(root / "jax"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
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
    report = path.parent / "report"
    assert "**Criterion held: yes**" in (report / "report.md").read_text()
    assert (report / "loss_vs_compute.png").read_bytes()[:4] == b"\x89PNG"
    analysis = json.loads((report / "analysis.json").read_text())
    assert analysis["controls_held"] is True and len(analysis["runs"]) == N_RUNS
    steps = sorted({r["steps"] for r in analysis["runs"]})
    assert steps == [10, 20, 41]  # 1.2e8 / 2.96e6 = 40.5 steps, rounded


def test_rerun_is_all_cache_hits(screen):
    path, store, (_, first, _) = screen
    rc, out, err = _cli(path, store)
    assert rc == 0 and out == first
    assert f"0 run(s) computed, {N_RUNS} cached" in err


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
    """The same runs (cache hits) judged by an impossible expectation: the screen is not trusted."""
    path, store, _ = screen
    data = yaml.safe_load(path.read_text())
    data["name"] = "tiny_screen_strict"
    data["arms"]["control_harm"]["expect"] = {"ci_low_above": 1.0}
    strict = tmp_path / "tiny_screen_strict.yaml"
    strict.write_text(yaml.safe_dump(data))
    rc, out, err = _cli(strict, store)
    assert rc == 3 and len(out.splitlines()) == 2
    assert "control control_harm: ci low above 1: FAILED" in err


def test_bad_record_exits_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**RECORD, "name": "bad", "budgets": [1e7]}))
    rc, out, err = _cli(bad, tmp_path / "store")
    assert rc == 2 and out == "" and "need >= 3 budgets" in err


def test_dagster_assets_materialize_runs_analysis_and_report(screen):
    """The record's assets on the CLI's store: every run partition is a cache hit, then the
    analysis and the report (Markdown with embedded PNGs) materialize."""
    from assets.experiments import build_experiment_assets, experiment_corpus
    from marin_assets.orchestration import ArtifactStoreResource

    path, store, _ = screen
    runs, analysis, report = build_experiment_assets(path)
    everything = [experiment_corpus, runs, analysis, report]
    resources = {"artifact_store": ArtifactStoreResource(prefix=str(store))}
    instance = dg.DagsterInstance.ephemeral()
    keys = runs.partitions_def.get_partition_keys()
    assert len(keys) == N_RUNS and "control_harm-C6e07-s1" in keys
    for key in keys:
        result = dg.materialize(everything, selection=[runs.key], partition_key=key, resources=resources,
                                instance=instance)
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
