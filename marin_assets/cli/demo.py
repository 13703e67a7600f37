"""`marin demo`: materialise the demo asset graph on the embedded default."""

from __future__ import annotations

import argparse
import json
import os
import time


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo", help="materialise the demo asset graph (local files, SQLite, CPU)")
    parser.add_argument("--job", default="demo", help="asset job to run (default: demo)")
    parser.add_argument("--definitions", default="definitions.py", help="code location file")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    parser.add_argument("--skip-training", action="store_true", help="skip the phase-controlled training run")
    parser.add_argument("--skip-scaling", action="store_true", help="skip the scaling-law ladder")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("DAGSTER_HOME", os.path.abspath(".dagster_home"))
    os.environ.setdefault("MARIN_PREFIX", os.path.abspath("artifacts"))
    os.makedirs(os.environ["DAGSTER_HOME"], exist_ok=True)
    from marin_assets.orchestration.demo import run_job

    started = time.monotonic()
    summary = run_job(args.job, args.definitions)
    if summary["success"] and not args.skip_training:
        from marin_assets.orchestration.demo import run_demo_step

        phases = run_demo_step("phases", args.definitions)
        summary["phases"] = [t.get("phase") for t in phases["ticks"] if t.get("phase")]
        summary["decisions"] = phases["decisions"]
    if summary["success"] and not args.skip_scaling:
        from marin_assets.orchestration.demo import run_demo_step

        summary["scaling"] = run_demo_step("scaling", args.definitions)
    summary["seconds"] = round(time.monotonic() - started, 1)
    summary["artifacts"] = os.environ["MARIN_PREFIX"]
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        hits = sum(1 for a in summary["assets"].values() if a["cache_hit"])
        print(f"\n{args.job}: {'SUCCESS' if summary['success'] else 'FAILED'} in {summary['seconds']}s, "
              f"{len(summary['assets'])} assets ({hits} cache hits), run {summary['run_id']}")
        for key, info in sorted(summary["assets"].items()):
            print(f"  {key:40s} {'hit ' if info['cache_hit'] else 'new '} {info['path']}")
        for d in summary.get("decisions", []):
            print(f"  phase {d['phase']:10s} -> {d.get('decision', ''):10s} {d.get('reason', '')}")
        if "scaling" in summary:
            sc = summary["scaling"]
            print(f"  scaling ladder: predicted loss {sc['prediction']:.4f} vs actual {sc['actual']:.4f} at the held-out budget "
                  f"(relative error {sc['relative_error']:+.2%}, check {'passed' if sc['passed'] else 'FAILED'})")
        print(f"artifacts under {summary['artifacts']}; Dagster instance in {summary['dagster_home']} (`make ui` to browse)")
    return 0 if summary["success"] else 1
