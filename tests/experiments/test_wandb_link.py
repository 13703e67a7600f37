"""W&B is optional: with ``wandb: true`` in an arm's config a run links its (offline) W&B run
in its row and keeps the run folder; without it the row has no link. Real training, real
wandb in offline mode (no network)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from marin_assets.experiments.data import Corpus
from marin_assets.experiments.record_files import record_from_dict
from marin_assets.experiments.runs import execute_run, run_spec, run_version, wandb_run_dir
from tests.experiments.test_screen_e2e import RECORD


@pytest.fixture(scope="module")
def record():
    data = copy.deepcopy(RECORD)
    data["name"] = "wandb_link"
    data["arms"] = {"logged": {"change": {"wandb": True}, "seeds": [0]}}
    data["criterion"] = {"statement": "nothing is judged here", "checks": []}
    return record_from_dict(data, source="wandb_link.yaml")


def stand_in_corpus(root: Path) -> Corpus:
    """A real dataset index over byte-level shard caches (tests/support/datasets.py), read as the
    DataKit's is, without running the DataKit: W&B linking is what this file tests (the corpus's
    own DataKit run is tests/experiments/test_corpus.py's)."""
    from marin_assets.datakit.datasets import Dataset, write_dataset
    from tests.support.byte_tokens import EOS, VOCAB_SIZE
    from tests.support.caches import stdlib_paragraphs
    from tests.support.datasets import write_shard

    paragraphs = stdlib_paragraphs()
    shard = write_shard(str(root), "stdlib-test-00000", paragraphs[:-10], paragraphs[-10:])
    index = write_dataset(
        Dataset("stdlib", (shard,), {"sha256": "bytes-test", "vocab_size": VOCAB_SIZE, "eos_id": EOS}), str(root)
    )
    return Corpus(index, "5" * 64, shard.train_tokens, shard.validation_tokens, VOCAB_SIZE, str(root))


@pytest.mark.slow
def test_runs_link_their_wandb_run_only_when_enabled(record, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_home"))
    corpus = stand_in_corpus(tmp_path / "corpus")
    plain, logged = (run_spec(record, arm, 3.0e7, 0, corpus.vocab_size) for arm in ("baseline", "logged"))
    assert (plain.config.wandb, logged.config.wandb) == (False, True)
    # Enabling W&B is a different run config, hence another content version.
    assert run_version(plain, record, corpus.version) != run_version(logged, record, corpus.version)

    row = execute_run(plain, corpus, record.validation_windows, str(tmp_path / "plain"))
    assert "wandb" not in row and not (tmp_path / "plain" / "wandb").exists()
    assert row["corpus"] == {"index": corpus.index, "version": corpus.version}

    row = execute_run(logged, corpus, record.validation_windows, str(tmp_path / "logged"))
    link = row["wandb"]
    assert link["mode"] == "offline" and len(link["run_id"]) >= 6
    kept = Path(link["dir"])
    assert kept.parent == tmp_path / "logged" / "wandb" and kept.name.endswith(f"-{link['run_id']}")
    assert list(kept.glob("*.wandb")), "the offline run's data file (for `wandb sync`) was not kept"
    assert json.loads((tmp_path / "logged" / "run.json").read_text())["wandb"] == link
    assert wandb_run_dir(tmp_path / "logged") == (kept, link["run_id"], "offline")


def test_wandb_run_dir_reads_only_wandb_run_folders(tmp_path):
    assert wandb_run_dir(tmp_path) is None
    (tmp_path / "wandb" / "latest-run").mkdir(parents=True)
    (tmp_path / "wandb" / "offline-run-2026_bad-x").mkdir()
    assert wandb_run_dir(tmp_path) is None
    (tmp_path / "wandb" / "run-20261130_044938-abc123").mkdir()
    assert wandb_run_dir(tmp_path) == (tmp_path / "wandb" / "run-20261130_044938-abc123", "abc123", "online")
    (tmp_path / "wandb" / "offline-run-20261130_044939-def456").mkdir()
    with pytest.raises(RuntimeError, match="2 W&B runs where one run was trained"):
        wandb_run_dir(tmp_path)
