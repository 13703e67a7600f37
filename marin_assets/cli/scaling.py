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
from marin_assets.knobs import add_flags, from_flags
from marin_assets.scaling.data import load_runs_csv
from marin_assets.scaling.fits import IsoFlopConfig, fit_isoflop
from marin_assets.scaling.parametric import ParametricFitConfig, fit_parametric_with_ci
from marin_assets.scaling.predict import predict_optimum


def register(subparsers) -> None:
    parser = subparsers.add_parser("scaling", help="Fit scaling laws (IsoFLOP and Chinchilla parametric).")
    sub = parser.add_subparsers(dest="scaling_command", metavar="SUBCOMMAND")
    bootstrap_flags = {"bootstrap_n": "bootstrap", "bootstrap_seed": "seed"}

    p = sub.add_parser("fit-parametric", help="Fit L(N, D) = E + A/N^alpha + B/D^beta (Huber on log-loss, L-BFGS grid).")
    p.add_argument(
        "--csv", required=True, help="columns params, tokens or flops, loss (or 'Model Size', 'Training FLOP', 'loss')"
    )
    p.add_argument("--json", action="store_true", help="print compact JSON on one line")
    add_flags(
        p,
        ParametricFitConfig,
        {"drop_highest": "drop-highest", **bootstrap_flags, "max_rows": "max-rows"},
        float_type=finite_float,
    )
    p.set_defaults(handler=_fit_parametric)

    q = sub.add_parser("fit-isoflop", help="Per-budget Huber quadratics, N*/D* power laws and the loss envelope.")
    q.add_argument("--csv", required=True, help="columns flops, params, tokens, loss")
    q.add_argument("--json", action="store_true", help="print compact JSON on one line")
    add_flags(q, IsoFlopConfig, ["bucket_base", "huber_delta"], float_type=finite_float)
    q.add_argument("--predict", type=finite_float, action="append", default=[], help="also predict the optimum at this budget")
    add_flags(q, IsoFlopConfig, {**bootstrap_flags, "max_runs_per_budget": "max-runs-per-budget"}, float_type=finite_float)
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


def _print(report: dict, compact: bool, command: str) -> None:
    for why in report["rows"]["why"]:  # runs left out of a fit for its cost are said, not only in the JSON
        print(f"marin scaling {command}: {why}", file=sys.stderr)
    print(json.dumps(_clean(report), indent=None if compact else 2))


def _fit_parametric(args: argparse.Namespace) -> int:
    try:
        config = from_flags(args, ParametricFitConfig)
        report = fit_parametric_with_ci(load_runs_csv(args.csv), config)
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"marin scaling fit-parametric: {exc}", file=sys.stderr)
        return 2
    _print(report, args.json, "fit-parametric")
    return 0


def _fit_isoflop(args: argparse.Namespace) -> int:
    try:
        config = from_flags(args, IsoFlopConfig)
        result = fit_isoflop(load_runs_csv(args.csv), config)
        report = result.as_dict()
        if args.predict:
            report["predictions"] = [predict_optimum(result, c).as_dict() for c in args.predict]
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"marin scaling fit-isoflop: {exc}", file=sys.stderr)
        return 2
    _print(report, args.json, "fit-isoflop")
    return 0
