"""`marin train --processes P --devices-per-process D`: the processes backend from the CLI."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from marin_assets.train.metrics import read_metrics
from tests.support.configs import TINY_TRAIN

MARIN = shutil.which("marin", path=str(Path(sys.executable).parent)) or "marin"


def run_cli(caches, tmp_path, *extra, timeout=600, **config):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(dict(TINY_TRAIN, **config)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COORDINATOR", "MARIN_", "DAGSTER_PIPES"))}
    env.update(JAX_PLATFORMS="cpu")
    argv = [
        MARIN,
        "train",
        "--cache",
        f"license={caches['license']}",
        "--cache",
        f"docs={caches['docs']}",
        "--config",
        str(cfg),
        "--out",
        str(tmp_path / "run"),
        *extra,
    ]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_two_processes_of_two_devices_train_one_run(caches, jax_cache, tmp_path):
    proc = run_cli(caches, tmp_path, "--processes", "2", "--devices-per-process", "2", "--steps", "8", batch_size=8)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["processes"] == 2 and summary["devices"] == 4
    assert summary["final_step"] == 8 and summary["tokens"] == 8 * 8 * TINY_TRAIN["seq_len"]
    assert summary["checkpoint"].endswith("step-000000008")
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 9))  # process 0 alone wrote them
    assert summary["last_loss"] == rows[-1]["loss"]
    logs = tmp_path / "run" / "workers"
    for i in (0, 1):
        assert f"process {i} of 2 joined 127.0.0.1:" in (logs / f"process-{i}.log").read_text()
    assert "(4 global devices)" in (logs / "process-0.log").read_text()
    assert "started 2 worker processes" in proc.stderr


@pytest.mark.slow
def test_a_batch_that_does_not_split_over_the_processes_fails_before_launch(caches, tmp_path):
    proc = run_cli(caches, tmp_path, "--processes", "3", timeout=120)
    assert proc.returncode == 2
    assert "batch_size 4 is not divisible by the 3 batch shards" in proc.stderr
    assert not (tmp_path / "run" / "workers").exists()
    proc = run_cli(caches, tmp_path, "--processes", "0", timeout=120)
    assert proc.returncode == 2 and "--processes: must be a positive integer, got '0'" in proc.stderr


@pytest.mark.slow
def test_a_sequence_axis_that_does_not_fit_the_devices_fails_before_training(caches, tmp_path):
    """``sequence_parallel`` needs that many devices inside each process: said before any worker starts, and
    without ``--processes`` (one CPU device) by the mesh, naming the knob."""
    proc = run_cli(caches, tmp_path, "--processes", "1", "--devices-per-process", "2", timeout=120, sequence_parallel=4)
    assert proc.returncode == 2
    assert "sequence_parallel 4 does not divide the 2 devices of a process" in proc.stderr
    assert not (tmp_path / "run" / "workers").exists()
    proc = run_cli(caches, tmp_path, timeout=120, sequence_parallel=4)
    assert proc.returncode == 2
    assert "sequence axis size 4 (TrainConfig.sequence_parallel) does not divide the 1 devices" in proc.stderr
