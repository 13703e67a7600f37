"""The DataKit's sources job through Dagster's own CLI, as a user would run it (subprocess)."""

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

REPO = Path(__file__).resolve().parents[2]
DAGSTER = str(Path(sys.executable).with_name("dagster"))


@pytest.mark.slow
def test_dagster_job_execute_runs_the_sources_job_then_hits_the_cache(tmp_path, monkeypatch):
    home, prefix = tmp_path / "home", tmp_path / "prefix"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    env = {**os.environ, "DAGSTER_HOME": str(home), "MARIN_PREFIX": str(prefix)}
    monkeypatch.setenv("DAGSTER_HOME", str(home))  # dagster.yaml reads it
    # `dagster job execute` takes a file (it has no -w); `dagster job launch -w
    # workspace.yaml` is covered by the UI end-to-end test.
    cmd = [DAGSTER, "job", "execute", "-f", "definitions.py", "-j", "datakit_sources", "-o", "sources__sotu,tokenizer"]
    for expect_hit in (False, True):
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "RUN_SUCCESS" in proc.stderr + proc.stdout
        with dg.DagsterInstance.from_config(str(home)) as instance:
            event = instance.get_latest_materialization_event(dg.AssetKey(["sources", "sotu"]))
            meta = event.asset_materialization.metadata
            assert meta["cache_hit"].value is expect_hit
            assert meta["count/docs"].value == 233
    assert list(prefix.glob("sources/sotu/__all__/*/data/raw-*.jsonl.gz"))


@pytest.mark.slow
def test_dagster_job_execute_of_an_unknown_partition_names_it_and_the_known_ones(tmp_path, monkeypatch):
    # Before: the run failed loading its "mixture" input ("upstream asset 'mixture' has not been
    # materialised yet") and never said that partition 'nope' does not exist.
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    env = {**os.environ, "DAGSTER_HOME": str(home), "MARIN_PREFIX": str(tmp_path / "prefix")}
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.add_dynamic_partitions("demo_phases", ["kestrel", "ocelot"])
    cmd = [DAGSTER, "job", "execute", "-f", "definitions.py", "-j", "train_phase", "--tags", '{"dagster/partition": "nope"}']
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    assert (
        "ValueError: step train__demo: partition 'nope' is not a partition of demo_phases; known (2): ['kestrel', 'ocelot']"
    ) in proc.stdout + proc.stderr
    assert "has not been materialised" not in proc.stdout + proc.stderr  # refused before any input is read
