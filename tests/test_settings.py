"""marin_assets/settings.py lists every MARIN_* variable the code reads or sets, and only those; the
code reads them only through its setting() and never hands one to itself through os.environ."""

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


# ---- reads go through setting() -------------------------------------------------------------

LIBRARY_DIRS = tuple(d for d in CODE_DIRS if d not in ("tests", "benchmarks"))
MAPPING_READS = {"get", "pop", "setdefault"}


def library_trees() -> dict[str, ast.Module]:
    """Every code file but tests, benchmarks and settings.py itself, parsed."""
    files = [ROOT / "definitions.py"] + [p for d in LIBRARY_DIRS for p in (ROOT / d).rglob("*.py")]
    return {str(p.relative_to(ROOT)): ast.parse(p.read_text()) for p in files if p != SETTINGS_FILE}


def marin_constants(trees) -> dict[str, str]:
    """Every module-level ``NAME = "MARIN_..."`` of the tree, so an imported constant resolves too,
    then every parameter whose default is one (``watch_env: str = WATCH_ENV``)."""
    found: dict[str, str] = {}
    for tree in trees:
        for node in tree.body:
            if isinstance(node, ast.Assign) and _marin_literal(node.value):
                found.update({t.id: node.value.value for t in node.targets if isinstance(t, ast.Name)})
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args.posonlyargs + node.args.args
                pairs = [
                    *zip(args[len(args) - len(node.args.defaults) :], node.args.defaults, strict=True),
                    *zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True),
                ]
                found.update({a.arg: name for a, d in pairs if d is not None and (name := _marin(d, found))})
    return found


def _marin_literal(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and bool(NAME.fullmatch(node.value))


def _marin(node: ast.AST, constants: dict[str, str]) -> str | None:
    """The MARIN_* name an expression is: a literal, or a constant by name (module.NAME too)."""
    if _marin_literal(node):
        return node.value  # type: ignore[attr-defined]
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return constants.get(name) if name else None


def _is_os_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ" and getattr(node.value, "id", None) == "os"


def direct_uses(tree: ast.Module, constants: dict[str, str]) -> list[str]:
    """'line: what' for each read of a MARIN_* variable not through setting() (mapping.get(X),
    mapping[X], X in mapping, os.getenv(X)), and each write of one into os.environ."""
    found = []
    for node in ast.walk(tree):
        name, what = None, ""
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            if node.func.attr in MAPPING_READS or (node.func.attr == "getenv" and getattr(node.func.value, "id", None) == "os"):
                name, what = _marin(node.args[0], constants), ast.unparse(node.func)
        elif isinstance(node, ast.Subscript):
            if isinstance(node.ctx, ast.Load) or _is_os_environ(node.value):  # a child's env dict may be written
                name, what = _marin(node.slice, constants), f"{ast.unparse(node.value)}[]"
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            name, what = _marin(node.left, constants), "in"
        if name:
            found.append(f"line {node.lineno}: {what} {name}")
    return found


def test_marin_variables_are_read_through_setting():
    """No module reads a listed variable past setting() (which refuses an unlisted one and reads
    empty as unset), nor hands a value to our own code by writing it into os.environ."""
    trees = library_trees()
    constants = marin_constants(trees.values())
    found = {path: uses for path, tree in trees.items() if (uses := direct_uses(tree, constants))}
    assert not found, f"read these through marin_assets.settings.setting(name, env): {found}"


def test_the_direct_use_scan_sees_each_form():
    source = (
        'import os\nWATCH = "MARIN_USER_DATA_DIR"\n'
        'a = os.environ.get("MARIN_PREFIX")\nb = os.environ[WATCH]\nc = os.getenv(WATCH)\nd = env.get(mod.WATCH, "")\n'
        'e = "MARIN_PREFIX" in env\nos.environ["MARIN_LOCAL_WORKERS"] = "2"\nos.environ.setdefault(WATCH, "x")\n'
        'child = {}\nchild["MARIN_PROCESS_OFFSET"] = "0"\nf = os.environ.get("DAGSTER_HOME")\ng = setting(WATCH, env)\n'
        "def h(watch_env=WATCH):\n    return os.environ.get(watch_env)\n"
    )
    tree = ast.parse(source)
    uses = direct_uses(tree, marin_constants([tree]))
    assert [u.split(":")[0] for u in uses] == [f"line {n}" for n in (3, 4, 5, 6, 7, 8, 9, 15)], uses
