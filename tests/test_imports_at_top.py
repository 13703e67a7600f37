"""Imports at the top (issue 39, point 5): a library module imports our own modules at its top. A function
may import one of them only where import cost or an optional dependency demands it, and says which on the
import's line or the line above it::

    from marin_assets.model import forward  # deferred (import cost): jax
    # deferred (optional dependency): fasttext

Most local imports were written to dodge cycles that no longer exist, or Dagster's import; an unexplained
one hides the module's real dependencies and keeps the next reader guessing. Plain ``ast``, no imports.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OURS = ("marin_assets", "kernels")  # the library and the kernels below it (the definition layer is not checked)
REASON = re.compile(r"# deferred \((import cost|optional dependency)\): \S")


def _imports_our_own(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(alias.name.split(".")[0] in OURS for alias in node.names)
    return isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").split(".")[0] in OURS)


def unexplained_local_imports(source: str) -> list[int]:
    """The lines of function-local imports of marin_assets (absolute or relative) with no reason comment."""
    lines = source.splitlines()
    found = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        for node in ast.walk(function):
            if _imports_our_own(node) and not any(
                REASON.search(line) for line in (lines[node.lineno - 1], lines[node.lineno - 2] if node.lineno > 1 else "")
            ):
                found.append(node.lineno)
    return sorted(set(found))  # a nested function's import is walked from each enclosing one


def test_the_check_finds_an_unexplained_local_import():
    source = (
        "def f():\n"
        "    from marin_assets.model import forward  # deferred (import cost): jax\n"
        "    # deferred (optional dependency): fasttext\n"
        "    from .quality_fasttext import train_fasttext\n"
        "    from marin_assets.store import fsutil\n"
        "    import json\n"
    )
    assert unexplained_local_imports(source) == [5]


def test_local_imports_of_our_own_modules_say_why():
    unexplained = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted((ROOT / "marin_assets").rglob("*.py"))
        for line in unexplained_local_imports(path.read_text())
    ]
    assert not unexplained, (
        "move these imports to the module's top, or say why not (# deferred (import cost): jax):\n" + "\n".join(unexplained)
    )
