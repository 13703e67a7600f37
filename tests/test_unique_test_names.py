"""Test modules share one import namespace (no packages under tests/), so basenames must be unique.

Two `test_cli.py` files in different folders make pytest refuse to collect the second one
("import file mismatch"), which hides every test in it.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).parent


def test_module_basenames_are_unique():
    names = Counter(p.name for p in TESTS.rglob("*.py") if p.name not in {"conftest.py", "__init__.py"})
    assert [name for name, n in names.items() if n > 1] == []
