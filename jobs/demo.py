"""The demo's steps after the data job, run in-process by `marin demo`.

They live in the definition layer because they drive this code location's own sensor,
budget file and ladder; the library finds them as ``DEMO_STEPS`` in definitions.py.
"""

from __future__ import annotations

import time

import dagster as dg

from assets.scaling import run_ladder
from assets.training import TRAIN_KEY, demo_budget, demo_cut, demo_raise
from marin_assets.orchestration.phase_demo import decision_log, run_phase_demo
from sensors.phase_controller import budget_path


def phases(defs: dg.Definitions, instance: dg.DagsterInstance, log=print) -> dict:
    """The Tootsie run: the phase controller sensor decides every phase of train/demo."""
    started = time.time()
    ticks = run_phase_demo(defs, instance, budget_path(), demo_budget(), demo_raise, demo_cut, log=log)
    return {"ticks": ticks, "decisions": decision_log(instance, dg.AssetKey(TRAIN_KEY.split("/")), since=started)}


def scaling(defs: dg.Definitions, instance: dg.DagsterInstance, log=print) -> dict:
    """The CPU IsoFLOP ladder: fit on the smaller budgets, predict the largest, check."""
    return run_ladder(defs, instance, log=log)


DEMO_STEPS = {"phases": phases, "scaling": scaling}
