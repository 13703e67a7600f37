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


@pytest.fixture(scope="module")
def two_processes(caches, jax_cache, tmp_path_factory):
    """`marin train` over 4 devices with each row's positions split over all of them (``sequence_parallel: 4``,
    mesh 1x4x1), 8 steps: as 2 processes of 2 devices ("two": each sequence group spans both processes), and
    as 1 process of 4 ("one"). {name: (its folder, the finished process)}."""
    runs = {}
    for name, layout in (("two", ("2", "2")), ("one", ("1", "4"))):
        out = tmp_path_factory.mktemp(name)
        argv = ("--processes", layout[0], "--devices-per-process", layout[1], "--steps", "8")
        runs[name] = out, run_cli(caches, out, *argv, batch_size=8, sequence_parallel=4)
    return runs


@pytest.mark.slow
def test_two_processes_of_two_devices_train_one_run(two_processes):
    tmp_path, proc = two_processes["two"]
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
def test_a_sequence_group_across_two_processes_trains_as_inside_one(two_processes):
    """Each process reads the group's whole rows and its devices take their chunks of positions: step by step
    the losses of one process of the same four devices."""
    for name, processes in (("two", 2), ("one", 1)):
        out, proc = two_processes[name]
        assert proc.returncode == 0, proc.stderr[-3000:]
        for i in range(processes):
            log = (out / "run" / "workers" / f"process-{i}.log").read_text()
            assert "steps on mesh {'data': 1, 'sequence': 4, 'expert': 1}" in log
    two, one = (
        {r["step"]: r["loss"] for r in read_metrics(two_processes[n][0] / "run" / "metrics.jsonl")} for n in ("two", "one")
    )
    assert sorted(two) == sorted(one) == list(range(1, 9))
    print(json.dumps({"max_loss_diff": max(abs(two[s] - one[s]) for s in one), "last": [two[8], one[8]]}))
    assert max(abs(two[s] - one[s]) for s in one) <= 1e-6, (two, one)


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
    """``sequence_parallel`` must divide the devices: said before any worker starts, and without
    ``--processes`` (one CPU device) by the mesh, naming the knob."""
    proc = run_cli(caches, tmp_path, "--processes", "3", "--devices-per-process", "2", timeout=120, sequence_parallel=4)
    assert proc.returncode == 2
    assert "sequence_parallel 4 does not divide the 6 devices (--processes x --devices-per-process)" in proc.stderr
    assert not (tmp_path / "run" / "workers").exists()
    proc = run_cli(caches, tmp_path, timeout=120, sequence_parallel=4)
    assert proc.returncode == 2
    assert "sequence axis size 4 (TrainConfig.sequence_parallel) does not divide the 1 devices" in proc.stderr
