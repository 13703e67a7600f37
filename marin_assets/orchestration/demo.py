"""Run an asset job of the code location in-process on the configured instance."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
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


def load_definitions(definitions_file: str = "definitions.py") -> dg.Definitions:
    path = Path(definitions_file).resolve()
    sys.path.insert(0, str(path.parent))  # definitions.py imports assets/, jobs/, sensors/
    spec = importlib.util.spec_from_file_location("marin_definitions", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.defs


def run_phases(definitions_file: str = "definitions.py", log=print) -> dict:
    """The Tootsie demo: the phase controller sensor drives train/demo through its phases."""
    from marin_assets.orchestration.phase_demo import decision_log, run_phase_demo

    defs = load_definitions(definitions_file)
    from assets.training import TRAIN_KEY, demo_budget, demo_cut, demo_raise  # the code location's own demo knobs
    from sensors.phase_controller import budget_path

    with dg.DagsterInstance.get() as instance:
        started = time.time()
        ticks = run_phase_demo(defs, instance, budget_path(), demo_budget(), demo_raise, demo_cut, log=log)
        decisions = decision_log(instance, dg.AssetKey(TRAIN_KEY.split("/")), since=started)
    return {"ticks": ticks, "decisions": decisions}


def run_scaling(definitions_file: str = "definitions.py", log=print) -> dict:
    """The CPU IsoFLOP ladder: fit on the smaller budgets, predict the largest, check."""
    defs = load_definitions(definitions_file)
    from assets.scaling import run_ladder  # the code location's ladder driver

    with dg.DagsterInstance.get() as instance:
        return run_ladder(defs, instance, log=log)
