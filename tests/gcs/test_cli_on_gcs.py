"""The README's CLI chain with every path on the GCS emulator: `marin datakit run --prefix gs://...`
-> `marin train --cache gs://.../cache --out gs://...` -> `--resume`, each a fresh process; the
resumed run ends where an uninterrupted one does, bit for bit."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gcs.gcs_emulator import emulator_env

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "tiny_moe.yaml"
MARIN = shutil.which("marin", path=str(Path(sys.executable).parent)) or "marin"


def marin(*argv: str) -> dict:
    """With the default worker count (one per core): forked workers use the gs:// store their run
    process opened, which a pinned count of 1 once hid (issue 35)."""
    env = {key: value for key, value in {**os.environ, **emulator_env()}.items() if key != "MARIN_LOCAL_WORKERS"}
    done = subprocess.run([MARIN, *argv], env=env, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_datakit_run_train_and_resume_on_the_emulator(gcs_prefix, tmp_path):
    rng = random.Random(0)
    words = [w for w in (ROOT / "README.md").read_text().split() if w.isalpha()]
    folder = tmp_path / "input"
    folder.mkdir()
    (folder / "a.jsonl").write_text(
        "".join(json.dumps({"id": str(i), "text": " ".join(rng.choices(words, k=150))}) + "\n" for i in range(200))
    )

    summary = marin("datakit", "run", "--input", str(folder), "--prefix", gcs_prefix, "--tokenizer", "bytes", "--json")
    assert summary["cache"] == f"{gcs_prefix}/cache" and summary["docs_out"] == 200 and summary["tokens"]["train"] > 0

    cache = summary["cache"]
    straight = marin("train", "--cache", cache, "--config", str(CONFIG), "--out", f"{gcs_prefix}/straight", "--steps", "6")
    marin("train", "--cache", cache, "--config", str(CONFIG), "--out", f"{gcs_prefix}/resumed", "--steps", "4")
    resumed = marin(
        "train", "--cache", cache, "--config", str(CONFIG), "--out", f"{gcs_prefix}/resumed", "--steps", "6", "--resume"
    )
    assert resumed["checkpoint"] == f"{gcs_prefix}/resumed/checkpoints/step-000000006"
    assert (resumed["final_step"], resumed["last_loss"]) == (straight["final_step"], straight["last_loss"])
    assert not list(tmp_path.glob("*/checkpoints")), "checkpoints were written locally"
