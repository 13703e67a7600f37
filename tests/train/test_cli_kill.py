"""`marin train` killed with SIGKILL mid-run, then `--resume`: same loss curve as straight."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from marin_assets.train.checkpoints import checkpoint as ckpt
from marin_assets.train.config import config_from_dict
from marin_assets.train.loop import train
from marin_assets.train.metrics import read_metrics
from tests.support.configs import TINY_TRAIN

MARIN = shutil.which("marin", path=str(Path(sys.executable).parent)) or "marin"
STEPS = 200


def cli(caches, cfg_path, out, *extra):
    return [
        MARIN,
        "train",
        "--cache",
        f"license={caches['license']}",
        "--cache",
        f"docs={caches['docs']}",
        "--config",
        str(cfg_path),
        "--out",
        str(out),
        *extra,
    ]


@pytest.mark.slow
def test_kill_dash_nine_then_resume_matches_straight_run(caches, jax_cache, tmp_path):
    # Long enough that the kill (at the first checkpoint from step 20 on) lands mid-run, short enough
    # to train three times (killed, resumed, straight) in a few seconds each.
    data = dict(TINY_TRAIN, num_steps=STEPS, checkpoint_every_steps=10)
    data["schedule"] = dict(TINY_TRAIN["schedule"], decay_steps=40)
    cfg_path = tmp_path / "tiny.yaml"
    cfg_path.write_text(yaml.safe_dump(data))
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(jax_cache), JAX_PLATFORMS="cpu")
    out = tmp_path / "run"
    proc = subprocess.Popen(cli(caches, cfg_path, out), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    killed_at = None
    while time.time() < deadline and proc.poll() is None:
        latest = ckpt.latest_valid(out / "checkpoints")
        if latest is not None and int(latest.name.split("-")[1]) >= 20:
            proc.send_signal(signal.SIGKILL)
            killed_at = int(latest.name.split("-")[1])
            break
        time.sleep(0.02)
    proc.wait(timeout=60)
    assert killed_at is not None, f"run ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
    assert proc.returncode == -signal.SIGKILL
    assert max(r["step"] for r in read_metrics(out / "metrics.jsonl")) < STEPS

    # without --resume the CLI refuses to overwrite
    refused = subprocess.run(cli(caches, cfg_path, out), env=env, capture_output=True, text=True, timeout=240)
    assert refused.returncode == 2 and "--resume" in refused.stderr

    done = subprocess.run(cli(caches, cfg_path, out, "--resume"), env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    straight = train(config_from_dict(data), {"license": caches["license"], "docs": caches["docs"]}, tmp_path / "straight")
    key = lambda rows: [(r["step"], r["loss"], r["lr"], r["grad_norm"], r["skipped"]) for r in rows]
    resumed_rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in resumed_rows] == list(range(1, STEPS + 1))
    assert key(resumed_rows) == key(read_metrics(straight.metrics_path))
    assert (out / "loss_curve.png").exists()


def test_cli_rejects_bad_config(caches, tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml.safe_dump(dict(TINY_TRAIN, batch_sise=3)))
    r = subprocess.run(
        [MARIN, "train", "--cache", str(caches["license"]), "--config", str(cfg), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "unknown field(s) ['batch_sise']" in r.stderr
