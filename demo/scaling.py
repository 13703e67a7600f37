"""The demo's scaling ladder, in process: data, every sweep partition, fit, prediction, check."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import dagster as dg

from demo.progress import Execute, run_directly

from marin_assets.scaling.ladder import Ladder


def run_ladder(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    ladder: Ladder,
    *,
    log: Callable[[str], None] = print,
    run_config: Mapping[str, Any] | None = None,
    job_name: str = "scaling",
    execute: Execute = run_directly,
) -> dict:
    """Materialise ``ladder`` (on the DataKit's mixture, materialised first): every sweep
    partition in one range run, fanned out over $MARIN_LOCAL_WORKERS processes (so the demo
    runs the ladder before anything starts JAX in this process, which would rule out forking),
    then scaling_fit and prediction, whose check compares the prediction with the best run at
    the largest budget.

    Uses the job ``job_name`` of ``defs``; ``run_config``'s {"ops": {op: ...}} entries go to
    the steps that run those ops, its other entries (e.g. loggers) to every run. The
    prediction only reads the fit budgets' runs, so running the target's partitions first
    changes nothing in it. Returns {"prediction", "actual", "relative_error", "passed",
    "exponents", "seconds", ...}; raises if a step fails."""
    started = time.monotonic()
    job = defs.resolve_job_def(job_name)
    run_config = dict(run_config or {})
    op_config = run_config.pop("ops", {})

    def run(keys: Sequence[str], partition: str | None = None, partitions: tuple[str, str] | None = None):
        t0 = time.monotonic()
        selection = [dg.AssetKey.from_user_string(k) for k in keys]
        names = {k.to_python_identifier() for k in selection}
        ops = {name: cfg for name, cfg in op_config.items() if name in names}
        config = {**run_config, **({"ops": ops} if ops else {})}
        tags = {"marin/ladder_step": "+".join(keys).replace("/", "_") + (f"-{partition}" if partition else "")}
        if partitions:
            tags.update(
                {"dagster/asset_partition_range_start": partitions[0], "dagster/asset_partition_range_end": partitions[1]}
            )
        result = execute(
            lambda final_tags: job.execute_in_process(
                instance=instance,
                partition_key=partition,
                raise_on_error=True,
                asset_selection=selection,
                run_config=config or None,
                tags=final_tags,
            ),
            tags,
        )
        where = f" [{partition}]" if partition else f" [{partitions[0]} .. {partitions[1]}]" if partitions else ""
        log(f"scaling ladder: {'+'.join(keys)}{where} in {time.monotonic() - t0:.1f}s")
        return result

    keys = ladder.keys()
    run(["sweep"], partitions=(keys[0], keys[-1]))
    result = run(["scaling_fit", "prediction"])
    checks = [e for e in result.get_asset_check_evaluations() if e.check_name == "prediction_error"]
    if not checks:
        raise RuntimeError("scaling ladder: the prediction_error check did not run")
    meta = {k: v.value for k, v in checks[0].metadata.items()}
    if "actual_loss" not in meta:
        raise RuntimeError(f"scaling ladder: the check did not evaluate: {checks[0].description}")
    fit = result.output_for_node("scaling_fit").counts
    out = {
        "prediction": meta["predicted_loss"],
        "actual": meta["actual_loss"],
        "relative_error": meta["relative_error"],
        "passed": bool(checks[0].passed),
        "bound": meta["bound"],
        "actual_best_partition": meta["actual_best_partition"],
        "predicted_params": meta["predicted_params"],
        "actual_best_params": meta["actual_best_params"],
        "exponents": {"n_opt": fit["n_opt_exponent"], "d_opt": fit["d_opt_exponent"]},
        "budgets_fitted": fit["budgets_fitted"],
        "budgets_excluded": fit["budgets_excluded"],
        "seconds": round(time.monotonic() - started, 1),
    }
    log(
        f"scaling ladder: predicted loss {out['prediction']:.4f} at C={ladder.target_label}, actual best "
        f"{out['actual']:.4f} ({out['actual_best_partition']}): relative error {out['relative_error']:+.2%} "
        f"(bound {out['bound']:.0%}, {'passed' if out['passed'] else 'FAILED'}); N* ~ C^{out['exponents']['n_opt']:.3f}, "
        f"D* ~ C^{out['exponents']['d_opt']:.3f}; {out['seconds']:.0f}s"
    )
    return out
