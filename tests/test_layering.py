"""The dependency order is one way: kernels -> library -> orchestration glue ->
assets/jobs/sensors -> definitions.py (-> the demo driver in demo/); docs/layers.md writes it down.

Plain ``ast`` over the tree: a library module (marin_assets/, kernels/) must not import -
or load by path - the definition layer, and a sensor must not import an asset module
(what sensors share with assets lives in assets/partitions.py; the asset itself is handed
to the sensor factory in definitions.py). Inside the library, the packages and top-level
modules of marin_assets/ are ordered by the table of docs/layers.md: no import points up
that order, and the package graph has no cycle.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEFINITION_LAYER = {"assets", "jobs", "sensors", "definitions", "demo"}
LIBRARY = ("marin_assets", "kernels")
SHARED_WITH_SENSORS = {"assets.partitions"}
DYNAMIC_LOADERS = {"spec_from_file_location", "import_module", "__import__", "run_path"}
MAX_LINES = 300


def imported_modules(source: str) -> list[tuple[int, str]]:
    """(line, dotted module) for every absolute import, and for every dynamic load
    (importlib.import_module("x"), spec_from_file_location(..., "x.py"), ...) by its string arguments."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in DYNAMIC_LOADERS:
                found.append((node.lineno, f"<{name}>"))
                found += [
                    (node.lineno, a.value.removesuffix(".py").replace("/", "."))
                    for a in node.args
                    if isinstance(a, ast.Constant) and isinstance(a.value, str)
                ]
    return found


def library_violations(source: str) -> list[str]:
    out = []
    for line, module in imported_modules(source):
        if module.split(".")[0] in DEFINITION_LAYER or module == "<spec_from_file_location>":
            out.append(f"line {line}: {module}")
    return out


def sensor_violations(source: str) -> list[str]:
    out = []
    for line, module in imported_modules(source):
        is_asset_module = module.startswith("assets.")  # "assets.training", "assets.training.X"
        if is_asset_module and not any(module == s or module.startswith(s + ".") for s in SHARED_WITH_SENSORS):
            out.append(f"line {line}: {module}")
    return out


def _files(*dirs: str) -> list[Path]:
    return sorted(p for d in dirs for p in (ROOT / d).rglob("*.py"))


def test_the_checks_catch_what_they_look_for():
    assert library_violations("from assets.training import DEMO_PLAN\n")
    assert library_violations("import definitions\n")
    assert library_violations("import importlib.util\nimportlib.util.spec_from_file_location('m', 'definitions.py')\n")
    assert library_violations("import importlib\nimportlib.import_module('jobs.demo')\n")
    assert not library_violations("from marin_assets.store import ArtifactRef\nimport dagster\n")
    assert sensor_violations("from assets.training import phases\n")
    assert sensor_violations("from assets import training\n")
    assert not sensor_violations(
        "from assets.partitions import demo_phases\nfrom assets import partitions\nfrom jobs import eval_job\n"
    )


@pytest.mark.parametrize("path", _files(*LIBRARY), ids=lambda p: str(p.relative_to(ROOT)))
def test_library_does_not_import_the_definition_layer(path):
    assert library_violations(path.read_text()) == [], f"{path.relative_to(ROOT)} reaches into the definition layer"


def dagster_imports(source: str) -> list[str]:
    """Imports of dagster or any dagster_* package (dagster_pipes, dagster_k8s, ...)."""
    return [
        f"line {line}: {m}"
        for line, m in imported_modules(source)
        if m.split(".")[0] == "dagster" or m.split(".")[0].startswith("dagster_")
    ]


def test_only_the_orchestration_package_imports_dagster():
    assert dagster_imports("from dagster_pipes import open_dagster_pipes\n") and dagster_imports("import dagster as dg\n")
    assert not dagster_imports("import dagstered\nfrom marin_assets.store import ArtifactRef\n")
    outside = [p for p in _files(*LIBRARY) if "orchestration" not in p.relative_to(ROOT).parts]
    bad = {str(p.relative_to(ROOT)): v for p in outside if (v := dagster_imports(p.read_text()))}
    assert bad == {}, "only marin_assets/orchestration/ may import dagster"


# A fresh interpreter imports every library module outside orchestration/, one at a time, and names the first
# after which Dagster is loaded: the check above sees direct imports only, this one what they pull in.
_IMPORT_EACH = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
    if "dagster" in sys.modules:
        sys.exit(f"importing {name} loaded dagster")
"""


def test_no_library_module_outside_orchestration_loads_dagster_even_indirectly():
    names = []
    for path in _files(*LIBRARY):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if "orchestration" not in parts:
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    assert "marin_assets.local_workers" in names and len(names) > 100
    done = subprocess.run([sys.executable, "-c", _IMPORT_EACH, *names], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


COMPATS = {ROOT / "marin_assets" / "compat.py", ROOT / "marin_assets" / "orchestration" / "compat.py"}
PRIVATE = ("dagster._", "jax._src")


def private_imports(source: str) -> list[str]:
    """Imports of private Dagster or JAX modules, and string references to them (sys.modules peeks)."""
    found = [f"line {line}: {m}" for line, m in imported_modules(source) if m.startswith(PRIVATE)]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(PRIVATE):
            found.append(f"line {node.lineno}: {node.value!r}")
    return found


def test_private_dagster_and_jax_names_come_from_the_compat_module():
    assert private_imports("from dagster._core.launcher import RunLauncher\n")
    assert private_imports("import sys\nsys.modules.get('jax._src.xla_bridge')\n")
    assert not private_imports("from marin_assets.orchestration.compat import RunLauncher\nimport dagster as dg\n")
    files = [p for p in _files(*LIBRARY, "assets", "jobs", "sensors", "demo") if p not in COMPATS] + [ROOT / "definitions.py"]
    bad = {str(p.relative_to(ROOT)): v for p in files if (v := private_imports(p.read_text()))}
    assert bad == {}, (
        "import private names through marin_assets/orchestration/compat.py (Dagster) or marin_assets/compat.py (JAX)"
    )


def test_sensors_do_not_import_asset_modules():
    bad = {str(p.relative_to(ROOT)): v for p in _files("sensors") if (v := sensor_violations(p.read_text()))}
    assert bad == {}


def test_definition_modules_stay_small():
    long = {
        str(p.relative_to(ROOT)): n
        for p in _files("assets", "jobs", "sensors")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, f"over {MAX_LINES} lines: split by concern"


# The order of marin_assets/'s packages and top-level modules, read from docs/layers.md (its one record): a
# row of the library table is ``| level | `name/` or `name.py` | what it holds |``.
LAYERS_DOC = ROOT / "docs" / "layers.md"
_LAYER_ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*`([A-Za-z_][\w]*)(?:/|\.py)`\s*\|")
LIBRARY_ROOT = ROOT / "marin_assets"


def documented_levels(text: str) -> dict[str, int]:
    """{name: level} of the library table (the section headed "## The library"); a name listed twice is an error."""
    section = re.split(r"^## ", text, flags=re.M)
    table = next((s for s in section if s.startswith("The library")), "")
    levels: dict[str, int] = {}
    for line in table.splitlines():
        if m := _LAYER_ROW.match(line):
            assert m.group(2) not in levels, f"docs/layers.md lists {m.group(2)} twice"
            levels[m.group(2)] = int(m.group(1))
    return levels


def library_units(root: Path = LIBRARY_ROOT) -> set[str]:
    """The packages (folders with an __init__.py) and top-level modules of marin_assets/, ``__init__`` included."""
    return {p.name for p in root.iterdir() if (p / "__init__.py").is_file()} | {p.stem for p in root.glob("*.py")}


def package_imports(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, dotted module) of every import in ``source`` (the module ``module``): module level and inside
    functions, relative ones resolved, ``from X import a`` as X and X.a, and the string of every dynamic load."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            origin = ".".join(base + ([node.module] if node.module else []))
            found.append((node.lineno, origin))
            found += [(node.lineno, f"{origin}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in DYNAMIC_LOADERS:
                found += [(node.lineno, a.value) for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    return found


def unit_of(dotted: str, units: set[str]) -> str | None:
    """The package or top-level module of marin_assets that ``dotted`` names (``__init__`` for the package itself
    and the names it defines), None outside marin_assets."""
    parts = dotted.split(".")
    if parts[0] != "marin_assets":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in units else "__init__"


def import_edges(root: Path = LIBRARY_ROOT) -> list[tuple[str, str, str]]:
    """(from unit, to unit, "file:line imports module") for every import of one unit of marin_assets by another."""
    units = library_units(root)
    edges = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent)
        parts = rel.with_suffix("").parts
        is_package = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_package else parts)
        here = unit_of(module, units) if len(parts) > 2 or not is_package else "__init__"
        seen = set()
        for line, imported in package_imports(path.read_text(), module, is_package):
            there = unit_of(imported, units)
            # `from marin_assets import hf` names the package root and hf: the root is not what it means.
            if there is None or there == here or (there == "__init__" and imported == "marin_assets"):
                continue
            if (line, there) not in seen:
                seen.add((line, there))
                edges.append((here, there, f"{rel}:{line} imports {imported}"))
    return edges


def upward_imports(edges: list[tuple[str, str, str]], levels: dict[str, int]) -> list[str]:
    return [
        f"{where} ({a}, level {levels[a]} -> {b}, level {levels[b]})"
        for a, b, where in edges
        if a in levels and b in levels and levels[b] > levels[a]
    ]


def package_cycles(edges: list[tuple[str, str, str]]) -> list[list[str]]:
    """One cycle (a list of units, the first repeated at the end) per strongly connected group of units."""
    graph: dict[str, set[str]] = {}
    for a, b, _ in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_through(graph, set(group), group[0]) for group in groups]


def _cycle_through(graph: dict[str, set[str]], group: set[str], start: str) -> list[str]:
    """A shortest path start -> ... -> start inside ``group`` (breadth first)."""
    parent: dict[str, str] = {}
    queue = [start]
    for node in queue:
        for nxt in sorted(graph[node] & group):
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [*reversed(path), start]
            if nxt not in parent:
                parent[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"{sorted(group)} is strongly connected, so a cycle goes through {start}")


def test_the_layer_checks_catch_what_they_look_for(tmp_path):
    doc = (
        "# x\n## The library, bottom\n| level | name | holds |\n|---|---|---|\n| 0 | `low.py` | a |\n| 1 | `high/` | b |\n"
        "## Outside\n| 9 | `other/` | c |\n"
    )
    assert documented_levels(doc) == {"low": 0, "high": 1}
    lib = tmp_path / "marin_assets"
    (lib / "high" / "sub").mkdir(parents=True)
    for name in ("__init__.py", "high/__init__.py", "high/sub/__init__.py"):
        (lib / name).write_text("")
    (lib / "low.py").write_text(
        "import importlib\ndef f():\n    from marin_assets.high import sub\n"
        "    importlib.import_module('marin_assets.high.sub')\n"
    )
    (lib / "high" / "sub" / "deep.py").write_text("from ... import low\nfrom ..sub import deep\n")
    assert library_units(lib) == {"__init__", "high", "low"}
    edges = import_edges(lib)
    assert {(a, b) for a, b, _ in edges} == {("low", "high"), ("high", "low")}
    assert upward_imports(edges, {"low": 0, "high": 1}) == [
        "marin_assets/low.py:3 imports marin_assets.high (low, level 0 -> high, level 1)",
        "marin_assets/low.py:4 imports marin_assets.high.sub (low, level 0 -> high, level 1)",
    ]
    assert package_cycles(edges) == [["high", "low", "high"]]
    assert package_cycles([("a", "b", ""), ("b", "c", ""), ("c", "a", ""), ("c", "d", "")]) == [["a", "b", "c", "a"]]
    assert package_cycles([("a", "b", ""), ("b", "c", "")]) == []


def test_every_package_and_module_of_the_library_is_in_the_layer_order():
    levels = documented_levels(LAYERS_DOC.read_text())
    units = library_units()
    assert len(units) > 15 and "train" in units and "settings" in units
    assert sorted(units - set(levels)) == [], "add these to the library table of docs/layers.md"
    assert sorted(set(levels) - units) == [], "docs/layers.md lists these, and marin_assets/ has no such package or module"


def test_no_import_points_up_the_layer_order():
    levels = documented_levels(LAYERS_DOC.read_text())
    edges = import_edges()
    assert len(edges) > 100 and {("train", "model"), ("cli", "train")} <= {(a, b) for a, b, _ in edges}
    bad = upward_imports(edges, levels)
    assert bad == [], "imports that point up docs/layers.md's order (move the piece that points up):\n" + "\n".join(bad)


def test_the_package_graph_has_no_cycle():
    cycles = package_cycles(import_edges())
    assert cycles == [], "package cycles: " + "; ".join(" -> ".join(c) for c in cycles)
