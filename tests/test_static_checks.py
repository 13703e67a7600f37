"""Static checks ratchet (issue 26 item 2): ruff and basedpyright may not report anything beyond the recorded
baselines in .lint/, so `make test` fails on a new finding (`make lint` runs the same check and lists them)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("lint_ratchet", ROOT / ".lint" / "ratchet.py")
assert _spec is not None and _spec.loader is not None
ratchet = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ratchet)

MODULE = "marin_assets/store/names.py"  # any checked module; copied, never edited


def test_ruff_finds_nothing_beyond_its_baseline():
    assert ratchet.check_ruff() == []


@pytest.mark.slow
def test_basedpyright_finds_nothing_beyond_its_baseline():
    assert ratchet.check_pyright() == []


def test_both_tools_check_the_same_folders():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert ratchet.checked_paths() == ["marin_assets", "kernels", "assets", "sensors", "jobs", "demo", "definitions.py"]
    assert config["tool"]["basedpyright"]["baselineFile"] == ".lint/basedpyright-baseline.json"
    assert (ROOT / ".lint" / "basedpyright-baseline.json").is_file() and ratchet.RUFF_BASELINE.is_file()


def _copy_module(tmp_path: Path, text: str) -> None:
    target = tmp_path / MODULE
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def test_the_ruff_ratchet_catches_an_unused_import_and_an_unformatted_file(tmp_path):
    baseline = tmp_path / "ruff-baseline.json"
    shutil.copy(ratchet.RUFF_BASELINE, baseline)
    original = (ROOT / MODULE).read_text()
    _copy_module(tmp_path, original)
    # the copy is checked exactly as in the repository: same config, same baseline key
    assert ratchet.check_ruff(tmp_path, [MODULE], baseline) == []

    _copy_module(
        tmp_path, original.replace("from __future__ import annotations\n", "from __future__ import annotations\n\nimport os\n", 1)
    )
    problems = ratchet.check_ruff(tmp_path, [MODULE], baseline)
    recorded = json.loads(baseline.read_text())["check"].get(MODULE, {}).get("F401", 0)
    header = f"ruff F401 in {MODULE}: {recorded + 1} now, {recorded} recorded\n"
    assert any(p.startswith(header) and "`os` imported but unused" in p for p in problems), problems

    assert MODULE not in json.loads(baseline.read_text())["format"], "choose a MODULE that ruff format leaves as it is"
    _copy_module(tmp_path, original + "\n\n_INJECTED = {  'a':1 }\n")  # a formatted file that stops being so
    new_file = "marin_assets/store/_injected.py"  # and a new file that never was
    (tmp_path / new_file).write_text("_INJECTED = {  'a':1 }\n")
    problems = ratchet.check_ruff(tmp_path, [MODULE, new_file], baseline)
    assert [p for p in problems if p.startswith("ruff format")] == [
        f"ruff format: {file} would be reformatted (`ruff format {file}`)" for file in (new_file, MODULE)
    ]


def test_update_drops_fixed_findings_and_refuses_while_something_is_new(tmp_path):
    baseline = tmp_path / "ruff-baseline.json"
    _copy_module(tmp_path, "from __future__ import annotations\n\nimport os\nimport re\n")
    assert ratchet.check_ruff(tmp_path, [MODULE], baseline, record=True) == []
    assert json.loads(baseline.read_text())["check"] == {MODULE: {"F401": 2}}
    _copy_module(tmp_path, "from __future__ import annotations\n\nimport os\n\nprint(os == None)\n")  # both fixed, E711 new
    assert ratchet.check_ruff(tmp_path, [MODULE], baseline, update=True) != []
    assert json.loads(baseline.read_text())["check"] == {MODULE: {"F401": 2}}  # untouched: a new one is pending
    _copy_module(tmp_path, "from __future__ import annotations\n\nimport os\n\nprint(os)\n")
    assert ratchet.check_ruff(tmp_path, [MODULE], baseline, update=True) == []
    assert json.loads(baseline.read_text())["check"] == {}


@pytest.mark.slow
def test_the_basedpyright_ratchet_reports_a_new_error_and_not_a_recorded_one(tmp_path):
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["basedpyright"]
    (tmp_path / "pyproject.toml").write_text(
        "[tool.basedpyright]\n"
        f'include = ["{MODULE}"]\n'
        f'pythonVersion = "{settings["pythonVersion"]}"\n'
        f'typeCheckingMode = "{settings["typeCheckingMode"]}"\n'
        f'venvPath = "{ROOT}"\nvenv = "{settings["venv"]}"\n'
        'baselineFile = "baseline.json"\n'
    )
    old = 'def old() -> int:\n    return "recorded"\n'
    _copy_module(tmp_path, old)
    assert ratchet.check_pyright(tmp_path, record=True) == []
    assert (tmp_path / "baseline.json").is_file()
    _copy_module(tmp_path, old + "\n\ndef new() -> str:\n    return 1\n")
    problems = ratchet.check_pyright(tmp_path)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"basedpyright reportReturnType in {MODULE}:6: ")


@pytest.mark.parametrize(
    ("baseline", "current", "new"),
    [
        ({}, {"a.py": {"F401": 1}}, {("a.py", "F401"): (0, 1)}),
        ({"a.py": {"F401": 2}}, {"a.py": {"F401": 2, "E501": 1}}, {("a.py", "E501"): (0, 1)}),
        ({"a.py": {"F401": 2}}, {"a.py": {"F401": 3}}, {("a.py", "F401"): (2, 3)}),
        ({"a.py": {"F401": 2}}, {"a.py": {"F401": 1}}, {}),
    ],
)
def test_new_lint_is_whatever_exceeds_the_recorded_count(baseline, current, new):
    assert ratchet.new_lint(baseline, current) == new
