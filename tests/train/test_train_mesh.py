"""The training worker on the ("data", "expert") mesh, for real across processes: it runs 2
processes and reports through Pipes; a worker killed with SIGKILL fails its peer within 60 s,
and a resumed rerun ends bit-identical to an uninterrupted run. (That ``loop.train`` gives the
same losses on 1 x 1, 1 x 4 and 2 x 2 is test_mesh.py's, on the session's shared runs.)"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from dagster_pipes import encode_param

from marin_assets.orchestration.training_backends import WORKER_MODULE
from marin_assets.train.checkpoints import checkpoint as ckpt
from marin_assets.train.metrics import read_metrics
from tests.support.configs import TINY_TRAIN
from tests.train.test_mesh import PROC_TIMEOUT_S, finish
from tests.train.test_mesh import launch_argv as launch

# Enough steps that the kill lands mid-run: it comes as soon as the step-10 checkpoint is
# committed (the test polls every 50 ms, while 10 more steps take seconds), and the survivor
# cannot step past it without its peer (each step is a collective; a 2-process step costs
# ~0.3-0.6 s on 2 CPU cores, so the run is kept short). The resume then crosses a checkpoint
# and trains 10 steps on to the final one, as the straight run does.
WORKER_STEPS = 20


def worker_spec(caches, out_dir: Path, resume: bool) -> dict:
    config = dict(TINY_TRAIN, num_steps=WORKER_STEPS, checkpoint_every_steps=10, batch_size=8)
    return {
        "config": config,
        "caches": {k: str(v) for k, v in caches.items()},
        "out_dir": str(out_dir),
        "resume": resume,
        "warm_start": None,
    }


def run_workers(spec: dict, path: Path, **env) -> list[subprocess.Popen]:
    path.write_text(json.dumps(spec))
    return launch(2, 2, [sys.executable, "-m", WORKER_MODULE, "--spec", str(path)], **env)


def final_arrays(out_dir: Path) -> dict:
    return ckpt.load(ckpt.latest_valid(out_dir / "checkpoints"))[0]


@pytest.fixture(scope="module")
def straight(caches, tmp_path_factory):
    """An uninterrupted 2-process x 2-device worker run; process 0 reports through Pipes."""
    root = tmp_path_factory.mktemp("straight")
    messages = root / "messages.jsonl"
    context = {
        "asset_keys": ["train/tiny"],
        "code_version_by_asset_key": None,
        "provenance_by_asset_key": None,
        "partition_key": None,
        "partition_key_range": None,
        "partition_time_window": None,
        "run_id": "r1",
        "job_name": "j",
        "retry_number": 0,
        "extras": {},
    }
    finish(
        run_workers(
            worker_spec(caches, root / "out", resume=False),
            root / "spec.json",
            DAGSTER_PIPES_CONTEXT=encode_param({"data": context}),
            DAGSTER_PIPES_MESSAGES=encode_param({"path": str(messages)}),
        ),
        PROC_TIMEOUT_S,
    )
    return root


@pytest.mark.slow
def test_two_worker_processes_train_one_run_and_process_0_reports(straight):
    sent = [json.loads(line) for line in (straight / "messages.jsonl").read_text().splitlines()]
    rows = [m["params"]["payload"]["metrics"] for m in sent if m["method"] == "report_custom_message"]
    assert [r["step"] for r in rows] == list(range(1, WORKER_STEPS + 1))
    (mat,) = [m["params"] for m in sent if m["method"] == "report_asset_materialization"]
    meta = {k: v["raw_value"] for k, v in mat["metadata"].items()}
    assert meta["mesh"] == {"data": 2, "sequence": 1, "expert": 2} and meta["devices"] == 4
    assert meta["final_step"] == WORKER_STEPS and meta["tokens"] == WORKER_STEPS * 8 * TINY_TRAIN["seq_len"]
    assert [r["step"] for r in read_metrics(straight / "out" / "metrics.jsonl")] == list(range(1, WORKER_STEPS + 1))
    assert rows[-1]["loss"] < rows[0]["loss"]


@pytest.mark.slow
def test_killed_worker_fails_its_peer_and_the_resumed_run_is_bit_identical(caches, straight, tmp_path):
    out = tmp_path / "out"
    procs = run_workers(worker_spec(caches, out, resume=False), tmp_path / "spec.json", MARIN_HEARTBEAT_TIMEOUT_S="10")
    try:
        deadline = time.monotonic() + PROC_TIMEOUT_S
        while ckpt.latest_valid(out / "checkpoints") is None:  # mid-run: a checkpoint is committed
            assert time.monotonic() < deadline and procs[0].poll() is None, procs[0].stderr.read()[-3000:]
            time.sleep(0.05)
        procs[1].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        try:
            procs[0].wait(timeout=90)
        except subprocess.TimeoutExpired:
            pass
        elapsed = time.monotonic() - killed_at
        rc = procs[0].poll()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    print(
        json.dumps(
            {"survivor_rc": rc, "seconds_to_fail": round(elapsed, 1), "resumes_from": ckpt.latest_valid(out / "checkpoints").name}
        )
    )
    assert rc not in (None, 0), f"survivor still running {elapsed:.0f} s after the kill"
    assert elapsed < 60
    resumed_from = int(ckpt.latest_valid(out / "checkpoints").name.split("-")[1])
    assert 0 < resumed_from < WORKER_STEPS  # the kill landed mid-run
    finish(run_workers(worker_spec(caches, out, resume=True), tmp_path / "spec.json"), PROC_TIMEOUT_S)
    a, b = final_arrays(straight / "out"), final_arrays(out)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    losses = [(r["step"], r["loss"]) for r in read_metrics(out / "metrics.jsonl")]
    assert losses == [(r["step"], r["loss"]) for r in read_metrics(straight / "out" / "metrics.jsonl")]
