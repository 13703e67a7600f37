"""Pre-registered extrapolation: each target's prediction is frozen before its run starts,
and the comparison holds the runs to what was frozen.

The freeze is the experiment-record lock (its files: ``marin_assets/store/lock_files.py``): a prediction
is registered as the experiment ``scaling_<ladder>_<target>_<version[:16]>`` (the version of
the prediction's artifact) whose ``LOCK.json`` holds the prediction as its frozen fields and
their content hash, written once and never rewritten. A target run refuses to start
without that lock, or when the lock's hash is not the hash of the prediction it was handed
(``require_frozen``), and keeps the stamp (experiment, hash) in its run.json and counts. The
comparison checks every target's stamp against the prediction artifact and, where the lock
file is still there, against the lock: deleting LOCK.json after a run unfreezes nothing,
since the run carries the hash; an edited prediction or lock is refused either way.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from marin_assets.scaling.plots import plot_extrapolation
from marin_assets.scaling.predict import relative_error
from marin_assets.store import ArtifactStore
from marin_assets.store.fsutil import write_json_atomic
from marin_assets.store.lock_files import RecordChangedError, content_hash, experiment_dir, lock_path, read_lock
from marin_assets.store.names import validate_segment

STAMP_KEY = "prediction_lock"  # where a target's run.json keeps its stamp


class PredictionNotFrozen(RuntimeError):
    """A target run was asked to start before its prediction was registered."""


def lock_name(ladder: str, target: str, version: str) -> str:
    """The experiment name a prediction is registered under (a path segment)."""
    return validate_segment(f"scaling_{ladder}_{target}_{version[:16]}", "prediction lock name")


def as_json(value: Any) -> Any:
    """``value`` as the plain JSON it is written and hashed as (numpy floats become floats)."""
    return json.loads(json.dumps(value, default=float, allow_nan=False))


def register_prediction(store: ArtifactStore, name: str, prediction: Mapping[str, Any]) -> dict:
    """Freeze ``prediction`` under the lock ``name`` (written once); returns its stamp.

    A lock already there with the same hash is the same registration (a rerun); one with
    another hash is refused: a registered prediction is never replaced."""
    frozen = as_json(dict(prediction))
    digest = content_hash(frozen)
    lock = read_lock(store, name)
    if lock is None:
        store.fs.makedirs(experiment_dir(store, name), exist_ok=True)
        write_json_atomic(store.fs, lock_path(store, name), {"experiment": name, "frozen": frozen, "frozen_hash": digest})
    elif lock["frozen_hash"] != digest:
        raise RecordChangedError(
            f"{lock_path(store, name)}: prediction {name} is registered with hash "
            f"{lock['frozen_hash'][:16]}, not {digest[:16]}; a registered prediction is never replaced"
        )
    return {"experiment": name, "frozen_hash": digest}


def require_frozen(store: ArtifactStore, name: str, prediction: Mapping[str, Any]) -> dict:
    """Before a target run starts: the stamp of its registered prediction, or an error saying why it may not run."""
    lock = read_lock(store, name)
    if lock is None:
        raise PredictionNotFrozen(
            f"{lock_path(store, name)} does not exist: the prediction {name} was not registered, "
            f"so its target run may not start (materialise the prediction first)"
        )
    digest = content_hash(as_json(dict(prediction)))
    if lock["frozen_hash"] != digest:
        raise RecordChangedError(
            f"{lock_path(store, name)}: the registered prediction has hash {lock['frozen_hash'][:16]} "
            f"but the target was handed one with hash {digest[:16]}; refusing to run against it"
        )
    return {"experiment": name, "frozen_hash": digest}


def check_stamp(store: ArtifactStore, target: str, stamp: Any, prediction: Mapping[str, Any]) -> None:
    """The target run's stamp names this prediction (by hash), and so does its lock if it is still there."""
    if not (isinstance(stamp, dict) and isinstance(stamp.get("experiment"), str) and isinstance(stamp.get("frozen_hash"), str)):
        raise RecordChangedError(
            f"target {target}: its run carries no prediction stamp ({stamp!r:.80}); it cannot be compared with a prediction"
        )
    digest = content_hash(as_json(dict(prediction)))
    if stamp["frozen_hash"] != digest:
        raise RecordChangedError(
            f"target {target}: it ran against prediction hash {stamp['frozen_hash'][:16]}, but the "
            f"prediction now reads {digest[:16]}: the prediction was changed after its run"
        )
    lock = read_lock(store, stamp["experiment"])
    if lock is not None and lock["frozen_hash"] != digest:
        raise RecordChangedError(
            f"{lock_path(store, stamp['experiment'])}: holds hash {lock['frozen_hash'][:16]}, "
            f"not the {digest[:16]} target {target} ran against"
        )


def compare(predictions: Mapping[str, Mapping[str, Any]], actual: Mapping[str, Any], bound: float) -> dict:
    """Each target's predicted and actual loss, the relative error, whether the prediction's
    interval holds the actual, and the ladder's compute as a fraction of the targets'.

    ``actual[target]``: its run's counts, or a list of counts of the same run at several seeds,
    whose mean loss is the actual. The interval judged is ``run_interval``: the fit's seed
    interval widened by the runs' own noise."""
    rows = []
    for name in sorted(predictions, key=lambda t: predictions[t]["budget"]):
        pred = predictions[name]
        runs = [actual[name]] if isinstance(actual[name], Mapping) else list(actual[name])
        losses = [float(r["validation_loss"]) for r in runs]
        loss = sum(losses) / len(losses)
        interval = run_interval(pred, len(runs))
        rows.append(
            {
                "target": name,
                "multiple": pred["multiple"],
                "budget": pred["budget"],
                "flops": runs[0]["flops"],
                "predicted": pred["loss"],
                "actual": loss,
                "actual_runs": losses,
                "relative_error": float(relative_error(pred["loss"], loss)),
                "interval": pred.get("interval"),
                "run_interval": interval,
                "actual_in_interval": None if interval is None else bool(interval["low"] <= loss <= interval["high"]),
                "off_optimum": pred.get("off_optimum"),
                "width": runs[0]["width"],
                "params": runs[0]["params"],
            }
        )
    first = predictions[rows[0]["target"]]
    target_flops = float(sum(r["flops"] for r in rows))  # one run per target: the seeds repeat a run, not the budget
    ladder_flops = first["ladder_flops"] + first["lr_sweep_flops"]
    worst = max(abs(r["relative_error"]) for r in rows)
    return {
        "rows": rows,
        "bound": bound,
        "passed": worst <= bound,
        "max_abs_relative_error": worst,
        "ladder_flops": first["ladder_flops"],
        "lr_sweep_flops": first["lr_sweep_flops"],
        "target_flops": target_flops,
        "ladder_cost_fraction": ladder_flops / target_flops,
        "recipe": first["recipe"]["name"],
        "ladder": first["ladder"],
    }


def run_interval(prediction: Mapping[str, Any], runs: int) -> dict | None:
    """Where the mean loss of ``runs`` seeds of the target should land: the fit's seed interval
    with the runs' noise (the ladder's ``run_sd`` over sqrt(runs), at the interval's level)
    added in quadrature on each side. The fit's interval alone where the ladder measured no
    run noise; None without an interval."""
    from statistics import NormalDist

    interval, sd = prediction.get("interval"), prediction.get("run_sd")
    if interval is None:
        return None
    if sd is None:
        return dict(interval)
    z = NormalDist().inv_cdf(0.5 + interval["level"] / 2)
    noise = z * sd * prediction["loss"] / math.sqrt(runs)
    loss = prediction["loss"]
    return dict(interval) | {
        "low": loss - math.hypot(loss - interval["low"], noise),
        "high": loss + math.hypot(interval["high"] - loss, noise),
        "runs": runs,
        "run_sd": sd,
    }


def comparison_counts(comparison: Mapping[str, Any]) -> dict:
    """The comparison asset's counts: each target's predicted and actual loss and error, the cost fraction."""
    rows = comparison["rows"]
    return {
        **{
            f"{k}_{r['target']}": r[v]
            for r in rows
            for k, v in (("relative_error", "relative_error"), ("actual", "actual"), ("predicted", "predicted"))
        },
        **{
            k: comparison[k]
            for k in (
                "max_abs_relative_error",
                "passed",
                "ladder_cost_fraction",
                "ladder_flops",
                "lr_sweep_flops",
                "target_flops",
                "recipe",
            )
        },
    }


def comparison_png(comparison: Mapping[str, Any], predictions: Mapping[str, Mapping[str, Any]]) -> bytes:
    """Loss against compute: the fitted optima, the extrapolated law, and each target's
    prediction (with its interval for the runs compared) next to its actual loss."""
    first = next(iter(predictions.values()))
    rows = comparison["rows"]
    return plot_extrapolation(
        fitted=[(p["budget"], p["vertex_loss"]) for p in first["in_sample"]],
        law=first["loss_law"],
        targets=[
            (
                r["flops"],
                r["predicted"],
                (r["run_interval"] or {}).get("low", math.nan),
                (r["run_interval"] or {}).get("high", math.nan),
                r["actual"],
                r["target"],
            )
            for r in rows
        ],
        title=f"{comparison['ladder']} ladder, recipe {comparison['recipe']}: fitted to C={first['c_fit']:.2g}",
    )
