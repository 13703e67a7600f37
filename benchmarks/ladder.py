"""ladder: pre-registered extrapolation of scaling ladders, recipe v2 against v1 and an MoE ladder.

The protocol of the scaling assets (assets/scaling.py), driven here over a process pool:
for each ladder, the recipe's reference LR is re-tuned (the LR sweep, v2), the IsoFLOP runs
up to C_fit are trained (every (budget, width) at each seed), the fit predicts the held-out
targets at 3x, 10x and 30x C_fit (config, loss, an interval from the seeds), each prediction
is registered with the experiment-record lock, and only then are the target runs trained;
each checks its lock before it starts and carries the prediction's hash, which the
comparison checks. Data (--data): the demo's DataKit datasets (`mixture`: what `make demo`
leaves under $MARIN_PREFIX, read as the ladder assets read them) or the screens' corpus
(`stdlib`, the default: marin_assets/experiments/data.py, made here; nothing is downloaded).

Ladders, sized for a shared 2-core CPU: the demo's dense 1-layer family (head size 4, batch
16) fitted on 5e9, 1e10 and 2e10 FLOPs, 4 widths each, under v2 and under v1 (same budgets,
widths and seeds); and the MoE family of the demo's main run (assets/scaling_ladders.py MOE_LADDER:
4 routed experts, top-2, the main run's router (softmax gating, no balancing bias, no shared expert since the
demo's model became Qwen3-MoE-shaped), expert widths, KV grouping and aspect ratio)
under v2 on 4e9, 8e9 and 1.6e10, whose last target is the main run's own model (width 64, its
batch 8) at 30x C_fit, trained here (the demo's ladder observes the demo's main run instead).
Every ladder run at --seeds seeds (default 2).

One JSON line per figure (ratio > 1: we are better):
  prediction_error_3x, _10x, _30x   |predicted - actual| / actual in % of the dense v2 ladder
                   (ours) vs the dense v1 ladder (reference); the actual is the mean of the target
                   run at --target-seeds seeds (default 2: one run's seed noise is 1.0-1.3% of
                   its loss here, the size of the target). Extra: both signed errors, each seed's
                   loss, and the interval the mean should fall in (the fit's seed interval
                   widened by the runs' noise; marin_assets/scaling/extrapolation.py run_interval).
  prediction_error_moe_main         the MoE ladder's |error| in % on the main run's model
                   (ours) vs the issue's 1% target (reference); extra: its 3x and 10x errors.
  holdout_error_top_budget          the ladder's own check, made before any target runs: the fit
                   without C_fit predicting C_fit's runs (2x out; mean |error| in % over its widths) of
                   dense v2 (ours) vs dense v1 (reference). Extra: the signed errors of all three
                   ladders and one run's seed noise (run_noise: the seeds' pooled SD over the loss, in %).
  ladder_cost_fraction              the dense v2 ladder's FLOPs (its runs and LR sweep) over
                   its three targets' FLOPs (ours) vs Delphi's ~1% of the main run (reference).
The LR sweep trains past its grid's edge while the best LR sits on it (LrSweepSettings.edge_extensions).
The comparisons (JSON), their plots (PNG) and the holdout checks (holdout.json) are written under --out/<ladder>/. A ladder
whose fit finds fewer than two budgets with a vertex predicts nothing: its figures are
missing, the reason goes to stderr and the exit status is 1.

`--quick` runs the same protocol on tiny budgets (1 seed, targets at 2x and 3x): a check that
it runs end to end; its numbers are noise (and its tiny fits can miss a vertex).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from _common import emit  # noqa: E402


def ladders(quick: bool, seeds: int):
    """(name, Ladder, recipe) of each ladder the benchmark runs."""
    from assets.scaling_ladders import MOE_LADDER
    from marin_assets.scaling.ladder import Ladder, Target
    from marin_assets.scaling.planner import FamilyShape

    # Head size 4 for the dense family: at these CPU budgets the best width is 4-16 (measured on the demo's
    # datasets at head size 8: at 1e10 width 8 beat 16, 24 and 32; at 2e10 and 4e10 width 16 was best).
    dense_family = FamilyShape(head_dim=4)
    if quick:
        dense = dict(
            budgets=(2.5e9, 5e9), widths=((4, 8, 16), (8, 16, 24)), seeds=(0,), targets=(Target("x2", 2), Target("x3", 3))
        )
        moe = dataclasses.replace(
            MOE_LADDER,
            budgets=(4e9, 8e9),
            widths=((8, 16, 24),) * 2,
            seeds=(0,),
            targets=(Target("x2", 2), main_run_model(MOE_LADDER, 3.0)),
        )
    else:
        targets = (Target("x3", 3), Target("x10", 10), Target("x30", 30))
        dense = dict(
            budgets=(5e9, 1e10, 2e10),
            widths=((4, 8, 12, 16), (4, 8, 12, 16), (8, 12, 16, 24)),
            seeds=tuple(range(seeds)),
            targets=targets,
        )
        # The main run's MoE family (widths 8, 16, 32; x3, x10 and the main run's model at 30x).
        moe = dataclasses.replace(
            MOE_LADDER,
            budgets=(4e9, 8e9, 1.6e10),
            widths=((8, 16, 32),) * 3,
            seeds=tuple(range(seeds)),
            targets=(Target("x3", 3), Target("x10", 10), main_run_model(MOE_LADDER, 30.0)),
        )
    return [
        ("dense_v2", Ladder(name="dense_v2", family=dense_family, **dense), "v2"),
        ("dense_v1", Ladder(name="dense_v1", family=dense_family, **dense), "v1"),
        ("moe_v2", dataclasses.replace(moe, name="moe_v2"), "v2"),
    ]


def main_run_model(ladder, multiple: float):
    """The ladder's main-run target as a run the benchmark trains: the main run's model (its family,
    width and batch) at ``multiple`` x C_fit (the demo's ladder observes the demo's run instead)."""
    return dataclasses.replace(ladder.targets[-1], multiple=multiple, tokens=None, observed=None)


# Every run of a dense ladder at one batch, the demo's (the LR rule is in steps: one batch keeps
# it one rule); the MoE ladder's small budgets of wide models need small batches (its main run has 8).
BATCHES = {"dense_v2": [16], "dense_v1": [16], "moe_v2": [2, 4, 8]}


# ---------------------------------------------------------------- work done in the pool


def run_job(job: dict) -> dict:
    """One training job in a worker process: an LR sweep, a ladder run or a target run."""
    from marin_assets.scaling.sweep import held_out_streams

    data = job["datasets"]
    if job["kind"] == "lr_sweep":
        from marin_assets.scaling.lr_sweep import run_lr_sweep

        return run_lr_sweep(job["settings"], job["grid"], job["shape"], data, job["out"], run_prefix=job["name"], log=_quiet)
    if job["kind"] == "sweep":
        from marin_assets.scaling.sweep import run_sweep_point

        return run_sweep_point(
            job["budget"],
            job["width"],
            job["settings"],
            data,
            held_out_streams(data),
            job["out"],
            log=_quiet,
            recipe=job["recipe"],
            shape=job["shape"],
            seed=job["seed"],
            run_prefix=job["name"],
        )
    from marin_assets.scaling.extrapolation import STAMP_KEY, require_frozen
    from marin_assets.scaling.ladder_predict import frozen_candidate
    from marin_assets.scaling.sweep import train_candidate
    from marin_assets.store import ArtifactStore

    stamp = require_frozen(ArtifactStore(job["store"]), job["lock"], job["prediction"])  # before the run starts
    cand = frozen_candidate(job["prediction"], job["settings"])
    counts = train_candidate(
        cand,
        job["settings"],
        data,
        held_out_streams(data),
        job["out"],
        run_name=job["name"],
        seed=job["settings"].seed,
        log=_quiet,
        record={STAMP_KEY: stamp, "target": job["target"]},
    )
    return counts | stamp


def _quiet(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_all(pool: cf.Executor, jobs: list[dict]) -> list[dict]:
    """Every job on the pool, longest (most FLOPs) first; results in the jobs' order."""
    order = sorted(range(len(jobs)), key=lambda i: -jobs[i].get("cost", 0.0))
    futures = {i: pool.submit(run_job, jobs[i]) for i in order}
    return [futures[i].result() for i in range(len(jobs))]


# ---------------------------------------------------------------- the protocol


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny budgets: a check that the protocol runs end to end")
    parser.add_argument("--workers", type=int, default=2, help="training processes")
    parser.add_argument("--seeds", type=int, default=2, help="seeds of every ladder run (their spread gives the intervals)")
    parser.add_argument(
        "--target-seeds",
        type=int,
        default=2,
        help="seeds of every target run: the actual is their mean (one run's seed noise is 1.0-1.3%% here)",
    )
    parser.add_argument("--files", type=int, default=168, help="standard-library files in the corpus (168: all)")
    parser.add_argument(
        "--data",
        choices=("stdlib", "mixture"),
        default="stdlib",
        help="stdlib: the screens' corpus, made here; mixture: the demo's DataKit datasets, read from the "
        "mixture asset of $MARIN_PREFIX's store (what `make demo` leaves), as the ladder assets read them",
    )
    parser.add_argument("--out", default="", help="where the store, comparisons and plots go (default: a temp dir)")
    args = parser.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="ladder-bench-")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    data = training_data(args, out)
    os.environ["MARIN_PREFIX"] = str(out / "store")  # the runs' telemetry goes there, not to ./artifacts
    from marin_assets.store import ArtifactStore

    store = ArtifactStore(str(out / "store"))
    setups = ladders(args.quick, 1 if args.quick else args.seeds)
    context = multiprocessing.get_context("spawn")  # JAX must not be forked
    with cf.ProcessPoolExecutor(args.workers, mp_context=context) as pool:
        results = protocol(pool, store, data, setups, out, quick=args.quick, target_seeds=args.target_seeds)
    elapsed = time.monotonic() - started
    figures(results, quick=args.quick, seconds=elapsed, data=data["what"], out=out)
    failed = {name: r["failed"] for name, r in results.items() if "failed" in r}
    for name, why in failed.items():
        print(f"ladder: {name} made no prediction ({why}); its figures are missing", file=sys.stderr)
    return 1 if failed else 0


def training_data(args: argparse.Namespace, out: Path) -> dict:
    """{"datasets": {source: dataset index}, "vocab_size", "what"} the ladders train and score on."""
    from marin_assets.store import ArtifactStore

    if args.data == "mixture":
        from assets.scaling_configs import ladder_data
        from marin_assets.settings import artifact_prefix

        mixture = ArtifactStore(artifact_prefix()).read_pointer("mixture", None)
        if mixture is None:
            raise SystemExit(f"ladder: no mixture asset in {artifact_prefix()} (run `make demo` first, or --data stdlib)")
        datasets, vocab = ladder_data(mixture)
        return {"datasets": datasets, "vocab_size": vocab, "what": f"the demo's datasets {sorted(datasets)}"}
    from marin_assets.experiments.data import materialize_corpus

    corpus = materialize_corpus(ArtifactStore(str(out / "store")), 20 if args.quick else args.files, log=_quiet)
    return {
        "datasets": {"stdlib": corpus.index},
        "vocab_size": corpus.vocab_size,
        "what": f"{corpus.train_tokens} train tokens of the standard library",
    }


def protocol(pool: cf.Executor, store, data: dict, setups, out: Path, *, quick: bool, target_seeds: int) -> dict:
    """LR sweeps, ladder runs, fits and frozen predictions, then the target runs (each at
    ``target_seeds`` seeds) and the comparisons."""
    from marin_assets.scaling.ladder import SweepSettings
    from marin_assets.scaling.lr_sweep import LrSweepSettings, resolve_recipe
    from marin_assets.scaling.recipes import get_recipe

    batches = {name: [4] if quick and name != "moe_v2" else BATCHES[name] for name, _, _ in setups}
    settings = {
        name: SweepSettings(
            vocab_size=data["vocab_size"], recipe=recipe, batch_sizes=batches[name], validation_windows=64 if quick else 256
        )
        for name, _, recipe in setups
    }
    tuned = [(name, ladder) for name, ladder, recipe in setups if get_recipe(recipe).tuned_by_sweep]
    lr_jobs = [
        {
            "kind": "lr_sweep",
            "name": f"lr-{name}",
            "datasets": data["datasets"],
            "settings": settings[name],
            "grid": LrSweepSettings(),
            "shape": ladder.family,
            "out": str(out / name / "lr_sweep"),
            "cost": 3e10,
        }
        for name, ladder in tuned
    ]
    lr = dict(zip([name for name, _ in tuned], run_all(pool, lr_jobs), strict=True))
    recipes = {name: resolve_recipe(settings[name], lr.get(name)) for name, _, _ in setups}
    sweep_jobs = [
        {
            "kind": "sweep",
            "name": f"sweep-{name}",
            "datasets": data["datasets"],
            "settings": settings[name],
            "recipe": recipes[name],
            "shape": ladder.family,
            "budget": budget,
            "width": width,
            "seed": seed,
            "cost": budget,
            "out": str(out / name / "sweep" / f"{budget:.2g}-{width}-{seed}"),
            "ladder": name,
        }
        for name, ladder, _ in setups
        for budget, widths in zip(ladder.budgets, ladder.widths, strict=True)
        for width in widths
        for seed in ladder.seeds
    ]
    sweeps = run_all(pool, sweep_jobs)
    predictions, failed = {}, {}
    for name, ladder, _ in setups:
        try:
            predictions[name] = frozen_predictions(store, name, ladder, settings[name], sweeps, sweep_jobs, lr.get(name), out)
        except ValueError as err:  # e.g. fewer than two budgets with a vertex: this ladder predicts nothing
            failed[name] = f"{type(err).__name__}: {err}"
            _quiet(f"{name}: no prediction: {failed[name]}")
    target_jobs = [
        {
            "kind": "target",
            "name": f"target-{name}-{t}-s{seed}",
            "ladder": name,
            "datasets": data["datasets"],
            "settings": dataclasses.replace(settings[name], seed=settings[name].seed + seed),
            "store": store.root,
            "lock": lock,
            "prediction": pred,
            "target": t,
            "cost": pred["config"]["flops"],
            "out": str(out / name / "targets" / t / f"s{seed}"),
        }
        for name, preds in predictions.items()
        for t, (lock, pred) in preds.items()
        for seed in range(target_seeds)
    ]
    targets = run_all(pool, target_jobs)
    return {
        name: comparison(store, name, ladder, predictions[name], targets, target_jobs, out)
        if name in predictions
        else {"failed": failed[name]}
        for name, ladder, _ in setups
    }


def frozen_predictions(store, name: str, ladder, settings, sweeps, sweep_jobs, lr, out: Path) -> dict:
    """Fit ``name``'s runs, predict every target and register each prediction: {target: (lock, prediction)}."""
    from marin_assets.scaling.extrapolation import as_json, lock_name, register_prediction
    from marin_assets.scaling.fits import IsoFlopConfig
    from marin_assets.scaling.ladder import fit_ladder
    from marin_assets.scaling.ladder_predict import predict_target
    from marin_assets.scaling.sweep import partition_key
    from marin_assets.store.lock_files import content_hash

    counts = {
        partition_key(j["budget"], j["width"], j["seed"]): c | {"lr_sweep_flops": lr["flops"] if lr else 0.0}
        for j, c in zip(sweep_jobs, sweeps, strict=True)
        if j["ladder"] == name
    }
    fit_dir = out / name / "fit"
    fit_dir.mkdir(parents=True, exist_ok=True)
    fit_ladder(
        counts,
        IsoFlopConfig(),
        extrapolate_to=max(t.multiple for t in ladder.targets) * ladder.c_fit,
        out_dir=str(fit_dir),
        log=_quiet,
    )
    fit = json.loads((fit_dir / "fit.json").read_text())
    write_holdout(name, counts, out)
    frozen = {}
    for target in ladder.targets:
        pred = as_json(predict_target(fit, ladder, target, settings))
        lock = lock_name(name, target.name, content_hash(pred))  # the assets name it by the prediction's version
        register_prediction(store, lock, pred)
        (out / name / f"prediction_{target.name}.json").write_text(json.dumps(pred, indent=1))
        frozen[target.name] = (lock, pred)
        _quiet(f"{name}: {target.name} frozen as {lock}: width {pred['config']['width']}, loss {pred['loss']:.4f}")
    return frozen


def write_holdout(name: str, counts: dict, out: Path) -> None:
    """The ladder's own check, before its targets run: the fit without its largest budget
    predicting that budget's runs (2x out), and how far apart its seeds land."""
    from marin_assets.scaling.fits import IsoFlopConfig
    from marin_assets.scaling.ladder_predict import run_noise, top_budget_holdout

    try:
        result = top_budget_holdout(counts, IsoFlopConfig())
    except ValueError as err:  # too few vertices below the top budget: the check is missing, not failed
        result = {"missing": f"{type(err).__name__}: {err}"}
    result["run_sd"] = run_noise(counts)
    (out / name / "holdout.json").write_text(json.dumps(result, indent=1))


def comparison(store, name: str, ladder, predictions: dict, targets, target_jobs, out: Path) -> dict:
    """The comparison of ``name``'s targets with their frozen predictions; writes its JSON and plot."""
    from marin_assets.scaling.extrapolation import check_stamp, compare, comparison_png

    runs: dict[str, list[dict]] = {}
    for job, counts in zip(target_jobs, targets, strict=True):
        if job["ladder"] == name:
            runs.setdefault(job["target"], []).append(counts)
    preds = {t: pred for t, (_, pred) in predictions.items()}
    for t, seeds in runs.items():
        for counts in seeds:
            check_stamp(store, t, {"experiment": counts["experiment"], "frozen_hash": counts["frozen_hash"]}, preds[t])
    result = compare(preds, runs, ladder.max_relative_error)
    (out / name / "comparison.json").write_text(json.dumps(result, indent=1))
    (out / name / "comparison.png").write_bytes(comparison_png(result, preds))
    return result


def figures(results: dict, *, quick: bool, seconds: float, data: str, out: Path) -> None:
    """The benchmark's JSON lines (those of a ladder that made no prediction are missing)."""
    v2, v1, moe = ({r["target"]: r for r in results[name].get("rows", [])} for name in ("dense_v2", "dense_v1", "moe_v2"))
    for target in v2 if v1 else []:
        a, b = v2[target], v1[target]
        emit(
            f"prediction_error_{target.removeprefix('x')}x",
            "%",
            100 * abs(a["relative_error"]),
            100 * abs(b["relative_error"]),
            higher_is_better=False,
            reference_is="recipe v1 on the same ladder",
            v2_signed_pct=round(100 * a["relative_error"], 3),
            v1_signed_pct=round(100 * b["relative_error"], 3),
            v2_predicted=a["predicted"],
            v2_actual=a["actual"],
            v2_actual_runs=a["actual_runs"],
            v2_interval=a["run_interval"],
            v2_in_interval=a["actual_in_interval"],
            v1_predicted=b["predicted"],
            v1_actual=b["actual"],
            v1_actual_runs=b["actual_runs"],
            v1_interval=b["run_interval"],
            flops=a["flops"],
            data=data,
            quick=quick,
        )
    if moe:
        moe_figure(moe, quick)
    holdout_figure(out, quick)
    dense = results["dense_v2"]
    if "rows" in dense:
        emit(
            "ladder_cost_fraction",
            "fraction",
            dense["ladder_cost_fraction"],
            0.01,
            higher_is_better=False,
            reference_is="Delphi's ~1% of the main run (issue 23)",
            ladder_flops=dense["ladder_flops"],
            lr_sweep_flops=dense["lr_sweep_flops"],
            target_flops=dense["target_flops"],
            moe_fraction=results["moe_v2"].get("ladder_cost_fraction"),
            seconds=round(seconds, 1),
            quick=quick,
        )


def holdout_figure(out: Path, quick: bool) -> None:
    """The ladders' own 2x check (write_holdout): dense v2's mean |error| vs dense v1's; a ladder's
    check that is missing leaves the figure out."""
    checks = {}
    for name in ("dense_v2", "dense_v1", "moe_v2"):
        path = out / name / "holdout.json"
        checks[name] = json.loads(path.read_text()) if path.exists() else {"missing": "no fit"}
    v2, v1 = checks["dense_v2"], checks["dense_v1"]
    if "rows" not in v2 or "rows" not in v1:
        return

    def signed(check: dict) -> list[float] | None:
        return [round(100 * r["relative_error"], 3) for r in check["rows"]] if "rows" in check else None

    emit(
        "holdout_error_top_budget",
        "%",
        100 * v2["mean_abs_relative_error"],
        100 * v1["mean_abs_relative_error"],
        higher_is_better=False,
        reference_is="recipe v1's ladder, the same check",
        what="the fit without C_fit predicting C_fit's runs (2x out), mean |error| over its widths",
        v2_signed_pct=signed(v2),
        v1_signed_pct=signed(v1),
        moe_signed_pct=signed(checks["moe_v2"]),
        params=[r["params"] for r in v2["rows"]],
        run_sd_pct={n: c.get("run_sd") and round(100 * c["run_sd"], 3) for n, c in checks.items()},
        quick=quick,
    )


def moe_figure(moe: dict, quick: bool) -> None:
    last = list(moe.values())[-1]
    emit(
        "prediction_error_moe_main",
        "%",
        100 * abs(last["relative_error"]),
        1.0,
        higher_is_better=False,
        reference_is="the issue's target |error| <= 1%",
        signed_pct=round(100 * last["relative_error"], 3),
        predicted=last["predicted"],
        actual=last["actual"],
        actual_runs=last["actual_runs"],
        interval=last["run_interval"],
        in_interval=last["actual_in_interval"],
        off_optimum=last["off_optimum"],
        flops=last["flops"],
        others_signed_pct={t: round(100 * r["relative_error"], 3) for t, r in moe.items()},
        quick=quick,
    )


if __name__ == "__main__":
    sys.exit(main())
