"""`marin train` as a new user meets it: fed by `marin datakit run`, bad configs, NaN output.

The README path, end to end (slow): `marin datakit run --input X --prefix P --json`, then
`marin train --cache P/cache --config examples/tiny_moe.yaml --out R`, killed with SIGKILL,
then `--resume`: it finishes, the loss falls, the held-out loss is reported.
"""

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from marin_assets.train.checkpoints import checkpoint as ckpt
from marin_assets.train.metrics import read_metrics
from tests.support.caches import stdlib_module_docs, stdlib_paragraphs, write_cache
from tests.support.configs import TINY_TRAIN

BIN = Path(sys.executable).parent
MARIN = shutil.which("marin", path=str(BIN)) or "marin"
ROOT = Path(__file__).resolve().parents[2]


def marin_train(cache, cfg, out, *extra, env=None, timeout=300):
    return subprocess.run(
        [MARIN, "train", "--cache", str(cache), "--config", str(cfg), "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


@pytest.mark.parametrize(
    "text,field",
    [
        ("- 1\n- 2\n", "expected a mapping of TrainConfig fields, got list"),
        ("model: 5\n", "config.model must be a mapping of ModelConfig fields, got int 5"),
        ("model:\n  init_std: .nan\n", "ModelConfig.init_std must be finite, got nan"),
        ("optimizer:\n  weight_decay: .nan\n", "OptimizerConfig.weight_decay must be finite, got nan"),
        ("guards:\n  grad_clip: .inf\n", "GuardConfig.grad_clip must be finite, got inf"),
    ],
)
def test_wrong_shaped_config_is_a_one_line_error(caches, tmp_path, capsys, text, field):
    """In this process (the CLI's own entry point; a subprocess per case cost ~6 s of imports each):
    exit 2, one line on stderr naming the file and the field, nothing written."""
    from marin_assets.cli import main

    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    rc = main(["train", "--cache", str(caches["license"]), "--config", str(cfg), "--out", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert err.strip().splitlines() == [err.strip()]  # one line, no traceback
    assert err.startswith(f"marin train: {cfg}: ") and field in err
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_a_wrong_shaped_config_from_the_installed_command_is_one_line(caches, tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("model: 5\n")
    r = marin_train(caches["license"], cfg, tmp_path / "out", timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]  # one line, no traceback
    assert r.stderr.startswith(f"marin train: {cfg}: ") and "config.model must be a mapping" in r.stderr


def test_summary_prints_null_for_non_finite_numbers(tmp_path):
    from marin_assets.cli.train import _summary
    from marin_assets.train.loop import TrainResult

    result = TrainResult(
        final_step=3,
        tokens=12,
        metrics_path=tmp_path,
        checkpoint_dir=None,
        loss_curve_png=None,
        counts={"skipped_nonfinite": 3},
        data_position={},
        tokens_left={},
        phase_start_step=0,
        last_loss=math.nan,
        validation_loss=math.inf,
    )
    line = json.dumps(_summary(result), allow_nan=False)
    assert json.loads(line)["last_loss"] is None and json.loads(line)["validation_loss"] is None
    assert json.loads(line)["counts"] == {"skipped_nonfinite": 3}


def test_malformed_yaml_config_is_one_line_with_file_and_line(caches, tmp_path):
    cfg = tmp_path / "broken.yaml"
    cfg.write_text("model: {d_model: 64\n")
    r = marin_train(caches["license"], cfg, tmp_path / "out", timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    # Before: PyYAML's eight-line report ("while parsing a flow mapping / in <unicode string>...").
    assert r.stderr == f"marin train: {cfg}:2:1: invalid YAML: expected ',' or '}}', but got '<stream end>'\n"


def test_held_out_note_only_when_no_cache_has_a_validation_split(caches, tmp_path):
    from marin_assets.cli.train import held_out_note
    from marin_assets.train.loop import open_sources

    def note(caches: dict) -> str | None:
        return held_out_note(open_sources(caches))  # what `marin train` hands it

    single = str(caches["license"])
    advice = "(pass what marin datakit run reports as cache, <prefix>/cache, for train and validation splits)"
    assert note({"train": single}) == f"marin train: no held-out loss: no validation split in {single} {advice}"
    folder = tmp_path / "cache"
    write_cache(folder / "train", stdlib_paragraphs()[:20])
    write_cache(folder / "validation", stdlib_paragraphs()[20:22])
    assert note({"train": str(folder)}) is None
    assert note({"a": single, "b": str(folder)}) is None  # one source with held-out data is enough
    assert note({"a": single, "b": str(caches["docs"])}) == (
        f"marin train: no held-out loss: no validation split in {single}, {caches['docs']} {advice}"
    )


def test_library_log_lines_reach_stderr_once_with_the_prefix(capsys):
    import logging

    from marin_assets.cli.train import show_library_log

    show_library_log()
    show_library_log()  # a second in-process run adds no second handler
    logging.getLogger("marin_assets.train.loop").info("resumed from %s at step %d", "R/checkpoints/step-000000100", 100)
    logging.getLogger("marin_assets.train.data.batches").debug("not shown")
    assert capsys.readouterr().err == "marin train: resumed from R/checkpoints/step-000000100 at step 100\n"


@pytest.mark.slow
def test_a_run_that_skips_every_step_exits_non_zero_with_the_counts(caches, jax_cache, tmp_path):
    """A byte cache (no stats.json, so no vocab check) on a 100-token model: every batch is
    flagged corrupt. Before: 'success', rc 0. Now rc 1 and the counts."""
    data = dict(TINY_TRAIN, num_steps=6, model=dict(TINY_TRAIN["model"], vocab_size=100))
    cfg = tmp_path / "v100.yaml"
    cfg.write_text(yaml.safe_dump(data))
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(jax_cache), JAX_PLATFORMS="cpu")
    r = marin_train(caches["license"], cfg, tmp_path / "out", env=env)
    assert r.returncode == 1, r.stderr[-2000:]
    assert "skipped 6 of 6 steps" in r.stderr and "'skipped_bad_batch': 6" in r.stderr
    assert json.loads(r.stdout)["counts"]["skipped_bad_batch"] == 6


def write_input(path: Path) -> Path:
    docs = stdlib_paragraphs() + stdlib_module_docs(
        ("json", "argparse", "dataclasses", "functools", "pathlib", "collections", "typing", "logging", "unittest", "inspect")
    )
    with path.open("w") as f:
        for i, text in enumerate(docs):
            f.write(json.dumps({"id": f"doc-{i}", "text": text}) + "\n")
    return path


README_STEPS = 40


@pytest.mark.slow
def test_readme_path_datakit_then_train_then_kill_and_resume(jax_cache, tmp_path):
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(jax_cache), JAX_PLATFORMS="cpu")
    prefix, out = tmp_path / "P", tmp_path / "R"
    dk = subprocess.run(
        [
            MARIN,
            "datakit",
            "run",
            "--input",
            str(write_input(tmp_path / "in.jsonl")),
            "--prefix",
            str(prefix),
            "--validation-fraction",
            "0.2",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert dk.returncode == 0, dk.stderr[-2000:]
    summary = json.loads(dk.stdout)
    assert Path(summary["cache"]) == prefix / "cache" and summary["tokens"]["validation"] > 128
    vocab = json.loads((prefix / "cache" / "dataset.json").read_text())["tokenizer"]["vocab_size"]
    assert vocab == summary["vocab_size"] == 50280  # the default: OLMo's pinned BPE, not one fitted on the input

    # The README's config with a batch of 4 sequences, not 16, for 40 steps with a checkpoint every 20: the
    # default tokenizer's 50,280-row unembedding dominates a step on CPU, and this is the suite's longest test
    # (185 s alone at 16 x 80 steps).
    config = yaml.safe_load((ROOT / "examples" / "tiny_moe.yaml").read_text())
    config |= {"batch_size": 4, "checkpoint_every_steps": README_STEPS // 2}
    (tmp_path / "tiny_moe.yaml").write_text(yaml.safe_dump(config))
    command = [
        MARIN,
        "train",
        "--cache",
        str(prefix / "cache"),
        "--config",
        str(tmp_path / "tiny_moe.yaml"),
        "--out",
        str(out),
        "--steps",
        str(README_STEPS),
    ]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    killed_at, deadline = None, time.time() + 400
    while time.time() < deadline and proc.poll() is None:
        latest = ckpt.latest_valid(out / "checkpoints")
        if latest is not None and int(latest.name.split("-")[1]) < README_STEPS:
            proc.send_signal(signal.SIGKILL)
            killed_at = int(latest.name.split("-")[1])
            break
        time.sleep(0.02)
    proc.wait(timeout=60)
    assert killed_at is not None, f"run ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
    assert proc.returncode == -signal.SIGKILL

    done = subprocess.run(command + ["--resume"], capture_output=True, text=True, timeout=400, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    # The user is told where it picked up (the line was logged at INFO and dropped before).
    resumed = re.search(r"^marin train: resumed from \S+step-(\d{9}) at step (\d+)$", done.stderr, re.M)
    assert resumed and resumed[1].lstrip("0") == resumed[2] and killed_at <= int(resumed[2]) < README_STEPS
    result = json.loads(done.stdout)
    assert result["final_step"] == README_STEPS and result["counts"]["skipped_bad_batch"] == 0
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, README_STEPS + 1))
    first, last = [r["loss"] for r in rows[:10]], [r["loss"] for r in rows[-10:]]
    assert sum(last) / 10 < sum(first) / 10 - 1.0  # the loss falls, by more than a nat
    # held-out loss: finite, below the untrained model's (about ln(vocab)) by half a nat or more
    assert rows[0]["loss"] == pytest.approx(math.log(vocab), abs=0.5)
    assert 0 < result["validation_loss"] < rows[0]["loss"] - 0.5
    meta = json.loads((Path(result["checkpoint"]) / "meta.json").read_text())
    assert meta["config"]["model"]["vocab_size"] == vocab  # taken from the cache's tokenizer


@pytest.mark.slow
def test_a_shard_with_a_deleted_chunk_is_one_line_exit_2_not_zeros(jax_cache, tmp_path):
    # Before: rc 0, the missing chunk read as zeros (the zarr fill value; token 0 is a valid id).
    from marin_assets.datakit.datasets import Dataset, write_dataset
    from tests.support.datasets import byte_tokenizer_identity, write_shard

    docs = stdlib_paragraphs()
    shards = tuple(write_shard(str(tmp_path / "shards"), f"s-{i}", docs[i::2], docs[i : i + 2]) for i in range(2))
    write_dataset(Dataset("src", shards, byte_tokenizer_identity()), str(tmp_path / "cache"))
    (tmp_path / "shards" / "s-1" / "train" / "input_ids" / "data" / "c" / "0").unlink()
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(jax_cache), JAX_PLATFORMS="cpu")
    r = marin_train(tmp_path / "cache", ROOT / "examples" / "tiny_moe.yaml", tmp_path / "R", "--steps", "2", env=env)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [line for line in r.stderr.strip().splitlines() if not line.startswith("marin train: MFU")]
    assert lines[-1].startswith("marin train: dataset shard s-1: ") and "s-1/train/input_ids/data/c/0: missing" in lines[-1]
    assert "Traceback" not in r.stderr
