"""marin_assets/settings.py lists every MARIN_* variable the code reads or sets, and only those."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from marin_assets.settings import SETTINGS, artifact_prefix, setting

ROOT = Path(__file__).resolve().parents[1]
CODE_DIRS = ("marin_assets", "kernels", "assets", "sensors", "jobs", "demo", "benchmarks", "tests")
NAME = re.compile(r"\bMARIN_[A-Z0-9_]*[A-Z0-9]\b")
SETTINGS_FILE = ROOT / "marin_assets" / "settings.py"


def code_files() -> list[Path]:
    files = [ROOT / "definitions.py"] + [p for d in CODE_DIRS for p in (ROOT / d).rglob("*.py")]
    return [p for p in files if p not in (SETTINGS_FILE, Path(__file__).resolve())]


def names_in_strings(source: str) -> set[str]:
    """MARIN_* names in the string constants of a module (docstrings included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found |= set(NAME.findall(node.value))
    return found


def names_in_code() -> dict[str, str]:
    """name -> the first file that mentions it, over the code and our YAML configs."""
    seen: dict[str, str] = {}
    for path in code_files():
        for name in names_in_strings(path.read_text()):
            seen.setdefault(name, str(path.relative_to(ROOT)))
    for path in ROOT.glob("*.yaml"):
        for name in NAME.findall(path.read_text()):
            seen.setdefault(name, path.name)
    return seen


def test_every_variable_in_the_code_is_listed():
    unlisted = {name: where for name, where in names_in_code().items() if name not in SETTINGS}
    assert not unlisted, f"add these to marin_assets/settings.py: {unlisted}"


def test_every_listed_variable_is_used():
    used = names_in_code()
    assert not [name for name in SETTINGS if name not in used]


def test_the_scan_sees_names_in_strings_and_docstrings():
    source = '"""Reads $MARIN_ALPHA."""\nx = os.environ.get("MARIN_BETA_2")\n# MARIN_GAMMA in a comment\n'
    assert names_in_strings(source) == {"MARIN_ALPHA", "MARIN_BETA_2"}


def test_setting_refuses_an_unlisted_name_and_reads_empty_as_unset():
    with pytest.raises(KeyError, match="MARIN_NOT_A_SETTING"):
        setting("MARIN_NOT_A_SETTING", {})
    assert setting("MARIN_PREFIX", {"MARIN_PREFIX": ""}) is None
    assert setting("MARIN_PREFIX", {"MARIN_PREFIX": "gs://b/x"}) == "gs://b/x"


def test_artifact_prefix_default_is_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert artifact_prefix({}) == str(tmp_path / "artifacts")
    assert artifact_prefix({"MARIN_PREFIX": "gs://b/x"}) == "gs://b/x"
