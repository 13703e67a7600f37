"""The dependency order is one way: kernels -> library -> orchestration glue ->
assets/jobs/sensors -> definitions.py (-> the demo driver in demo/).

Plain ``ast`` over the tree: a library module (marin_assets/, kernels/) must not import -
or load by path - the definition layer, and a sensor must not import an asset module
(what sensors share with assets lives in assets/partitions.py; the asset itself is handed
to the sensor factory in definitions.py).
"""

from __future__ import annotations

import ast
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
                found += [(node.lineno, a.value.removesuffix(".py").replace("/", "."))
                          for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
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
    assert not sensor_violations("from assets.partitions import demo_phases\nfrom assets import partitions\nfrom jobs import eval_job\n")


@pytest.mark.parametrize("path", _files(*LIBRARY), ids=lambda p: str(p.relative_to(ROOT)))
def test_library_does_not_import_the_definition_layer(path):
    assert library_violations(path.read_text()) == [], f"{path.relative_to(ROOT)} reaches into the definition layer"


def dagster_imports(source: str) -> list[str]:
    """Imports of dagster or any dagster_* package (dagster_pipes, dagster_k8s, ...)."""
    return [f"line {line}: {m}" for line, m in imported_modules(source)
            if m.split(".")[0] == "dagster" or m.split(".")[0].startswith("dagster_")]


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
    done = subprocess.run([sys.executable, "-c", _IMPORT_EACH, *names], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
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
    assert bad == {}, "import private names through marin_assets/orchestration/compat.py (Dagster) or marin_assets/compat.py (JAX)"


def test_sensors_do_not_import_asset_modules():
    bad = {str(p.relative_to(ROOT)): v for p in _files("sensors") if (v := sensor_violations(p.read_text()))}
    assert bad == {}


def test_definition_modules_stay_small():
    long = {str(p.relative_to(ROOT)): n for p in _files("assets", "jobs", "sensors")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"over {MAX_LINES} lines: split by concern"
