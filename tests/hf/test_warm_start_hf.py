"""`marin train --warm-start hf:PATH`: a phase starts from imported HF weights (step 0, data position 0, a
fresh optimizer); an HF model that is not the run's model is refused in one line naming the field."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from marin_assets.cli import main
from marin_assets.hf import export_hf, import_hf
from tests.hf.support import LLAMA_MODEL, save_checkpoint
from tests.support.caches import stdlib_paragraphs, write_cache
from tests.support.configs import TINY_TRAIN


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A byte cache, an HF folder of a perturbed dense model, and the train config of that model."""
    root = tmp_path_factory.mktemp("hf_warm")
    write_cache(root / "cache", stdlib_paragraphs())
    export_hf(save_checkpoint(root / "src", LLAMA_MODEL), root / "hf", tokenizer="bytes")
    config = dict(
        TINY_TRAIN,
        model=LLAMA_MODEL,
        num_steps=2,
        checkpoint_every_steps=2,
        schedule={"kind": "wsd", "peak_lr": 3e-3, "warmup_steps": 1, "decay_steps": 1},
    )
    (root / "train.yaml").write_text(yaml.safe_dump(config))
    return root


def _train(setup, out, *extra) -> int:
    return main(
        ["train", "--config", str(setup / "train.yaml"), "--cache", f"license={setup / 'cache'}", "--out", str(out), *extra]
    )


@pytest.mark.slow  # one dense compile and two steps
def test_a_phase_trains_from_imported_hf_weights(setup, tmp_path, capsys):
    from marin_assets.train.checkpoints import checkpoint as ckpt

    assert _train(setup, tmp_path / "run", "--warm-start", f"hf:{setup / 'hf'}") == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["final_step"] == 2  # counted from 0: the imported weights carry no step
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r][:2] == [1, 2]
    latest = ckpt.latest_valid(tmp_path / "run" / "checkpoints")
    assert latest is not None
    arrays, meta = ckpt.load(latest)
    assert meta["data_position"]["batches"] == 2 and meta["phase_start_step"] == 0
    imported, _ = import_hf(setup / "hf")
    trained = arrays["['params']['layers']['wq']"]
    # Two small Adam steps from the imported weights (entries ~0.2), nowhere near a fresh init (~0.02).
    assert np.max(np.abs(trained - imported["layers"]["wq"])) < 0.02
    assert np.std(trained) > 0.1


def test_an_hf_model_that_is_not_the_runs_is_refused_naming_the_field(setup, tmp_path, capsys):
    other = dict(yaml.safe_load((setup / "train.yaml").read_text()), model=dict(LLAMA_MODEL, norm_eps=1e-6))
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(other))
    argv = [
        "train",
        "--config",
        str(tmp_path / "other.yaml"),
        "--cache",
        f"license={setup / 'cache'}",
        "--out",
        str(tmp_path / "run"),
        "--warm-start",
        f"hf:{setup / 'hf'}",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # the lines before it: the trainer's info
    assert err.startswith("marin train: warm start hf:")
    assert "its model differs from this run's in ModelConfig.norm_eps (1e-05 there, 1e-06 here)" in err
    assert main([*argv[:-1], f"hf:{tmp_path / 'missing'}"]) == 2
    assert "no config.json" in capsys.readouterr().err
