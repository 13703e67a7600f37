"""The demo's scaling ladder, in process: the LR sweep, every sweep partition, the fit, the
pre-registered predictions, then the main run (its last target), the other target runs and the
comparison."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import dagster as dg

from demo.progress import Execute, run_directly
from marin_assets.scaling.ladder import Ladder


def ladder_steps(ladder: Ladder) -> int:
    """How many asset materialisations ``run_ladder`` makes (for the progress counter)."""
    return 1 + len(ladder.keys()) + 1 + 2 * len(ladder.targets) + 1


def run_ladder(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    ladder: Ladder,
    *,
    log: Callable[[str], None] = print,
    run_config: Mapping[str, Any] | None = None,
    job_name: str = "scaling",
    execute: Execute = run_directly,
    main_run: Callable[[], object] | None = None,
) -> dict:
    """Materialise ``ladder`` (on the DataKit's mixture, materialised first), one run per step:
    the lr_sweep; every sweep partition in one range run, fanned out over $MARIN_LOCAL_WORKERS
    processes (so the demo runs the ladder before anything starts JAX in this process, which
    would rule out forking); the fit; the predictions (each frozen by its lock as it is
    written); then ``main_run()``, the run a target observes (``Target.observed``: the demo's
    Tootsie run, started only now that its prediction is frozen); only then the target runs
    (an observed target scores the run's newest phase); and the comparison, whose check holds
    every target to the ladder's bound. A ladder with an observed target and no ``main_run``
    stops after the predictions: {"targets": {}, "waiting_for": [the observed runs], ...}.

    Uses the job ``job_name`` of ``defs``; ``run_config``'s {"ops": {op: ...}} entries go to
    the steps that run those ops, its other entries (e.g. loggers) to every run. Returns
    {"targets": {name: {"predicted", "actual", "relative_error", "interval"}}, "passed",
    "bound", "ladder_cost_fraction", "best_lr", "exponents", "seconds", ...}; raises if a step fails."""
    started = time.monotonic()
    job = defs.resolve_job_def(job_name)
    run_config = dict(run_config or {})
    op_config = run_config.pop("ops", {})
    prefix = f"scaling/{ladder.name}"

    def run(keys: Sequence[str], partitions: Sequence[str] = ()):
        t0 = time.monotonic()
        selection = [dg.AssetKey.from_user_string(k) for k in keys]
        names = {k.to_python_identifier() for k in selection}
        ops = {name: cfg for name, cfg in op_config.items() if name in names}
        config = {**run_config, **({"ops": ops} if ops else {})}
        tags = {"marin/ladder_step": "+".join(keys).replace("/", "_")}
        if len(partitions) > 1:
            tags.update(
                {"dagster/asset_partition_range_start": partitions[0], "dagster/asset_partition_range_end": partitions[-1]}
            )
        result = execute(
            lambda final_tags: job.execute_in_process(
                instance=instance,
                partition_key=partitions[0] if len(partitions) == 1 else None,
                raise_on_error=True,
                asset_selection=selection,
                run_config=config or None,
                tags=final_tags,
            ),
            tags,
        )
        where = f" [{partitions[0]} .. {partitions[-1]}]" if len(partitions) > 1 else f" [{partitions[0]}]" if partitions else ""
        log(f"scaling ladder: {' + '.join(keys)}{where} in {time.monotonic() - t0:.1f}s")
        return result

    def node(key: str) -> str:
        return dg.AssetKey.from_user_string(key).to_python_identifier()

    lr = run([f"{prefix}/lr_sweep"]).output_for_node(node(f"{prefix}/lr_sweep")).counts
    run([f"{prefix}/sweep"], ladder.keys())
    fit = run([f"{prefix}/fit"]).output_for_node(node(f"{prefix}/fit")).counts
    run([f"{prefix}/{t}/prediction" for t in ladder.target_keys])  # each frozen before any target run exists
    observed = sorted({t.observed for t in ladder.targets if t.observed})
    if observed and main_run is None:
        log(f"scaling ladder: predictions frozen; the comparison waits for {', '.join(observed)}")
        return {"targets": {}, "waiting_for": observed, "best_lr": lr["best_lr"], "seconds": round(time.monotonic() - started, 1)}
    main_s = 0.0  # the main run's time is its own, not the ladder's
    if main_run is not None:
        t0 = time.monotonic()
        main_run()
        main_s = time.monotonic() - t0
    run([f"{prefix}/{t}/target" for t in ladder.target_keys])
    result = run([f"{prefix}/comparison"])
    checks = [e for e in result.get_asset_check_evaluations() if e.check_name == "prediction_error"]
    if not checks:
        raise RuntimeError("scaling ladder: the prediction_error check did not run")
    rows = checks[0].metadata["rows"].value
    out = {
        "targets": {
            r["target"]: {
                k: r.get(k)
                for k in ("multiple", "predicted", "actual", "relative_error", "interval", "flops", "width", "off_optimum")
            }
            for r in rows
        },
        "passed": bool(checks[0].passed),
        "bound": checks[0].metadata["bound"].value,
        "ladder_cost_fraction": checks[0].metadata["ladder_cost_fraction"].value,
        "best_lr": lr["best_lr"],
        "exponents": {"n_opt": fit["n_opt_exponent"], "d_opt": fit["d_opt_exponent"]},
        "budgets_fitted": fit["budgets_fitted"],
        "budgets_excluded": fit["budgets_excluded"],
        "seconds": round(time.monotonic() - started - main_s, 1),
    }
    summary = "; ".join(
        f"{name} (C={r['flops']:.2g}): predicted {r['predicted']:.4f}, actual {r['actual']:.4f}, {r['relative_error']:+.2%}"
        for name, r in out["targets"].items()
    )
    log(
        f"scaling ladder: {summary} (bound {out['bound']:.0%}, {'passed' if out['passed'] else 'FAILED'}); reference LR "
        f"{out['best_lr']:.3g}; N* ~ C^{out['exponents']['n_opt']:.3f}; ladder compute {out['ladder_cost_fraction']:.0%} "
        f"of the targets'; {out['seconds']:.0f}s"
    )
    return out
