"""`marin scaling ...`: scaling-law fits from a CSV of runs.

fit-parametric  Chinchilla approach 3, L(N, D) = E + A/N^alpha + B/D^beta.
fit-isoflop     approach 2: per-budget optima, N* and D* power laws, loss envelope.

Both print one JSON object (with --json, compact; otherwise indented) including every excluded
row or budget and why, and "rows": the runs given and used (a large input is fitted on a
deterministic subsample, which stderr also says); the exit code is 2 when the input cannot be fitted.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from marin_assets.cli._types import finite_float


def register(subparsers) -> None:
    parser = subparsers.add_parser("scaling", help="Fit scaling laws (IsoFLOP and Chinchilla parametric).")
    sub = parser.add_subparsers(dest="scaling_command", metavar="SUBCOMMAND")

    p = sub.add_parser("fit-parametric", help="Fit L(N, D) = E + A/N^alpha + B/D^beta (Huber on log-loss, L-BFGS grid).")
    p.add_argument("--csv", required=True, help="columns params, tokens or flops, loss (or 'Model Size', 'Training FLOP', 'loss')")
    p.add_argument("--json", action="store_true", help="print compact JSON on one line")
    p.add_argument("--drop-highest", type=int, default=0, help="drop the K highest-loss runs (the Chinchilla protocol uses 5)")
    p.add_argument("--bootstrap", type=int, default=100, help="bootstrap resamples for the confidence intervals (0 = none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-rows", type=int, default=None,
                   help="fit a deterministic subsample of this many runs when given more (default: "
                   "ParametricFitConfig.max_rows; said on stderr and in the JSON's 'rows')")
    p.set_defaults(handler=_fit_parametric)

    q = sub.add_parser("fit-isoflop", help="Per-budget Huber quadratics, N*/D* power laws and the loss envelope.")
    q.add_argument("--csv", required=True, help="columns flops, params, tokens, loss")
    q.add_argument("--json", action="store_true", help="print compact JSON on one line")
    q.add_argument("--bucket-base", type=finite_float, default=1.1, help="FLOP buckets are powers of this (Marin: 1.1)")
    q.add_argument("--huber-delta", type=finite_float, default=0.01)
    q.add_argument("--predict", type=finite_float, action="append", default=[], help="also predict the optimum at this budget")
    q.add_argument("--bootstrap", type=int, default=200)
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--max-runs-per-budget", type=int, default=None,
                   help="fit a deterministic subsample of this many runs of a budget that has more (default: "
                   "IsoFlopConfig.max_runs_per_budget; said on stderr and in the JSON's 'rows')")
    q.set_defaults(handler=_fit_isoflop)

    parser.set_defaults(handler=lambda args: (parser.print_help(), 0)[1])


def _clean(value):
    """NaN/inf are not JSON; print them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _given(**flags) -> dict:
    """The flags the user set: the rest keep the library's defaults (one place for each number)."""
    return {name: value for name, value in flags.items() if value is not None}


def _print(report: dict, compact: bool, command: str) -> None:
    for why in report["rows"]["why"]:  # runs left out of a fit for its cost are said, not only in the JSON
        print(f"marin scaling {command}: {why}", file=sys.stderr)
    print(json.dumps(_clean(report), indent=None if compact else 2))


def _fit_parametric(args: argparse.Namespace) -> int:
    from marin_assets.scaling.bootstrap import BootstrapConfig
    from marin_assets.scaling.data import drop_highest_loss, load_runs_csv
    from marin_assets.scaling.parametric import ParametricFitConfig, fit_parametric_with_ci

    try:
        config = ParametricFitConfig(**_given(max_rows=args.max_rows))
        runs = drop_highest_loss(load_runs_csv(args.csv), args.drop_highest)
        report = fit_parametric_with_ci(runs, config, BootstrapConfig(n=args.bootstrap, seed=args.seed))
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"marin scaling fit-parametric: {exc}", file=sys.stderr)
        return 2
    _print(report, args.json, "fit-parametric")
    return 0


def _fit_isoflop(args: argparse.Namespace) -> int:
    from marin_assets.scaling.bootstrap import BootstrapConfig
    from marin_assets.scaling.data import load_runs_csv
    from marin_assets.scaling.fits import IsoFlopConfig, fit_isoflop
    from marin_assets.scaling.predict import predict_optimum

    try:
        config = IsoFlopConfig(
            bucket_base=args.bucket_base,
            huber_delta=args.huber_delta,
            **_given(max_runs_per_budget=args.max_runs_per_budget),
            bootstrap=BootstrapConfig(n=args.bootstrap, seed=args.seed),
        )
        result = fit_isoflop(load_runs_csv(args.csv), config)
        report = result.as_dict()
        if args.predict:
            report["predictions"] = [predict_optimum(result, c).as_dict() for c in args.predict]
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"marin scaling fit-isoflop: {exc}", file=sys.stderr)
        return 2
    _print(report, args.json, "fit-isoflop")
    return 0
