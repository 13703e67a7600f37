"""Which records the code location builds: the repo's experiments/, or $MARIN_EXPERIMENTS_DIR."""

from __future__ import annotations

import sys

import pytest
import yaml

from assets.experiments import RECORDS_DIR, RECORDS_ENV, build_all, records_dir
from tests.experiments.test_screen_e2e import RECORD  # a record whose budgets buy >= 10 steps
from tests.support.byte_tokens import VOCAB_SIZE


def test_default_is_the_repo_experiments_folder(monkeypatch):
    monkeypatch.delenv(RECORDS_ENV, raising=False)
    assert records_dir() == RECORDS_DIR and (RECORDS_DIR / "screen_tiny_moe.yaml").is_file()


def test_env_folder_replaces_the_default(monkeypatch, tmp_path):
    (tmp_path / "tiny_screen.yaml").write_text(yaml.safe_dump(RECORD))
    monkeypatch.setenv(RECORDS_ENV, str(tmp_path))
    keys = sorted(k.to_user_string() for a in build_all() for k in a.keys)
    assert keys == [
        "experiments/corpus",
        "experiments/tiny_screen/analysis",
        "experiments/tiny_screen/report",
        "experiments/tiny_screen/runs",
    ]


def test_env_that_is_not_a_folder_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv(RECORDS_ENV, str(tmp_path / "missing"))
    with pytest.raises(ValueError, match=f"{RECORDS_ENV}=.*missing' is not a folder of experiment records"):
        records_dir()


def test_the_outline_lists_exactly_the_planned_runs(tmp_path):
    from marin_assets.experiments.record_files import load_record, record_outline
    from marin_assets.experiments.runs import partition_key, plan_runs, run_keys

    (tmp_path / "tiny_screen.yaml").write_text(yaml.safe_dump(RECORD))
    for path in (RECORDS_DIR / "screen_tiny_moe.yaml", tmp_path / "tiny_screen.yaml"):
        outline, record = record_outline(path), load_record(path)
        assert (outline.name, outline.hypothesis, outline.data_files) == (record.name, record.hypothesis, record.data_files)
        keys = [partition_key(*run) for run in outline.runs]
        assert keys == run_keys(record) == [spec.key for spec in plan_runs(record, VOCAB_SIZE)]
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(RECORD))
    with pytest.raises(ValueError, match="name 'tiny_screen' must equal the file name 'other'"):
        record_outline(tmp_path / "other.yaml")


def test_loading_the_code_location_does_not_import_jax():
    """Every process that loads definitions.py (each demo step) would pay ~1.2 s CPU for jax."""
    import subprocess

    code = "import sys, definitions; bad = [m for m in ('jax', 'jaxlib') if m in sys.modules]; print(bad)"
    out = subprocess.run([sys.executable, "-c", code], cwd=RECORDS_DIR.parent, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
