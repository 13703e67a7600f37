"""tests/ is one package tree (issue 26 item 3): a module imports its helpers by absolute name
(``from tests.support.caches import write_cache``), which works the same from any working
directory and pytest import mode, and two folders may hold modules of one basename.

So every folder holding Python is a package, and nothing edits sys.path: a subprocess script
runs as a module (``python -m tests.train.train_check``) from the repository root.
"""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).parent
SYS_PATH_EDIT = re.compile(r"sys\.path\.(insert|append|extend)\(|sys\.path\s*\+?=[^=]|site\.addsitedir\(")


def _modules() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_folder_holding_python_is_a_package():
    folders = {p.parent for p in _modules()}
    assert sorted(str(d.relative_to(TESTS.parent)) for d in folders if not (d / "__init__.py").is_file()) == []


def test_no_module_edits_sys_path():
    """Source text, not the syntax tree: a script a test hands to ``python -c`` is a string."""
    offenders = [
        f"{p.relative_to(TESTS.parent)}:{n}"
        for p in _modules()
        if p != Path(__file__)
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if SYS_PATH_EDIT.search(line)
    ]
    assert offenders == []
