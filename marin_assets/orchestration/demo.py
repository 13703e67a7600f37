"""Run an asset job of the code location in-process on the configured instance."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import dagster as dg
from dagster._core.definitions.reconstruct import ReconstructableRepository


def run_job(job_name: str, definitions_file: str = "definitions.py", tags: dict[str, str] | None = None) -> dict:
    """Execute ``job_name`` from ``definitions_file`` (its multiprocess executor included)
    on ``DagsterInstance.get()`` and summarise every materialisation of the run."""
    path = Path(definitions_file).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"{definitions_file} not found: run `marin demo` from the repository root")
    repo = ReconstructableRepository.for_file(str(path), "defs", working_directory=str(path.parent))
    with dg.DagsterInstance.get() as instance:
        result = dg.execute_job(repo.get_reconstructable_job(job_name), instance=instance, tags=tags or {}, raise_on_error=False)
        assets = {}
        for event in result.get_asset_materialization_events():
            meta = event.materialization.metadata
            assets[event.asset_key.to_user_string()] = {
                "path": meta["path"].value if "path" in meta else None,
                "cache_hit": meta["cache_hit"].value if "cache_hit" in meta else None,
                "version": meta["version"].value[:16] if "version" in meta else None,
            }
        return {
            "job": job_name,
            "run_id": result.run_id,
            "success": result.success,
            "dagster_home": os.environ.get("DAGSTER_HOME"),
            "assets": assets,
        }


def load_code_location(definitions_file: str = "definitions.py"):
    """Import definitions.py by path (the library never imports the definition layer by name)."""
    path = Path(definitions_file).resolve()
    sys.path.insert(0, str(path.parent))  # definitions.py imports assets/, jobs/, sensors/
    spec = importlib.util.spec_from_file_location("marin_definitions", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_demo_step(name: str, definitions_file: str = "definitions.py", log=print) -> dict:
    """Run one of the code location's ``DEMO_STEPS`` (e.g. "phases", "scaling") in-process."""
    module = load_code_location(definitions_file)
    with dg.DagsterInstance.get() as instance:
        return module.DEMO_STEPS[name](module.defs, instance, log=log)
