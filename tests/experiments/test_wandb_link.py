"""W&B is optional: with ``wandb: true`` in an arm's config a run links its (offline) W&B run
in its row and keeps the run folder; without it the row has no link. Real training, real
wandb in offline mode (no network)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from marin_assets.experiments.record import record_from_dict
from marin_assets.experiments.runs import execute_run, materialize_corpus, run_spec, run_version, wandb_run_dir
from marin_assets.store import ArtifactStore
from tests.experiments.test_screen_e2e import RECORD


@pytest.fixture(scope="module")
def record():
    data = copy.deepcopy(RECORD)
    data["name"] = "wandb_link"
    data["arms"] = {"logged": {"change": {"wandb": True}, "seeds": [0]}}
    data["criterion"] = {"statement": "nothing is judged here", "checks": []}
    return record_from_dict(data, source="wandb_link.yaml")


def test_runs_link_their_wandb_run_only_when_enabled(record, tmp_path, monkeypatch):
    import jax

    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "jax"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_home"))
    store = ArtifactStore(str(tmp_path / "store"))
    corpus = materialize_corpus(store, record.data_files, log=lambda m: None)
    plain, logged = run_spec(record, "baseline", 3.0e7, 0), run_spec(record, "logged", 3.0e7, 0)
    assert (plain.config.wandb, logged.config.wandb) == (False, True)
    # Enabling W&B is a different run config, hence another content version.
    assert run_version(plain, record, corpus.version) != run_version(logged, record, corpus.version)

    row = execute_run(plain, corpus, record.validation_windows, str(tmp_path / "plain"))
    assert "wandb" not in row and not (tmp_path / "plain" / "wandb").exists()

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
