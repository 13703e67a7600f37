"""`python -m demo` (what `marin demo` runs): the data job, the Tootsie run, the scaling ladder.

Run from the repository root: it imports ``definitions`` like any user code would. The
terminal gets one line per asset as it finishes and the summary; Dagster's event stream
goes to $DAGSTER_HOME/logs/demo-<time>.log.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
import uuid
from pathlib import Path
from typing import TextIO

import dagster as dg

from demo.progress import Execute, Progress, stderr_to, watched


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m demo", description="materialise the demo asset graph (local files, SQLite, CPU)")
    parser.add_argument("--job", default="demo", help="asset job to run first (default: demo)")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON line (progress goes to stderr)")
    parser.add_argument("--skip-training", action="store_true", help="skip the phase-controlled training run")
    parser.add_argument("--skip-scaling", action="store_true", help="skip the scaling-law ladder")
    parser.add_argument("--skip-shards", action="store_true", help="skip the sharded DataKit graph")
    return parser.parse_args(argv)


def run_data_job(job_name: str, instance: dg.DagsterInstance, progress: Progress, session: str) -> dict:
    """The data job with its own (multiprocess) executor, as `dagster job execute` would run it."""
    from dagster._core.definitions.reconstruct import ReconstructableRepository

    from jobs import DEMO_TAGS

    repo = ReconstructableRepository.for_file(str(Path("definitions.py").resolve()), "defs", working_directory=os.getcwd())
    tags = {**DEMO_TAGS, "marin/demo_session": f"{session}-data"}
    result = watched(instance, progress, {"marin/demo_session": tags["marin/demo_session"]}, lambda: dg.execute_job(
        repo.get_reconstructable_job(job_name), instance=instance, tags=tags, raise_on_error=False))
    assets = {}
    for event in result.get_asset_materialization_events():
        meta = event.materialization.metadata
        assets[event.asset_key.to_user_string()] = {
            "path": meta["path"].value if "path" in meta else None,
            "cache_hit": meta["cache_hit"].value if "cache_hit" in meta else None,
            "version": meta["version"].value[:16] if "version" in meta else None,
        }
    return {"job": job_name, "run_id": result.run_id, "success": result.success, "assets": assets}


def tagged(instance: dg.DagsterInstance, progress: Progress, session: str) -> Execute:
    """An ``execute(run, tags)`` that tags each run with its own id and reports its assets as they finish."""
    def execute(run, tags: dict[str, str]):
        mark = {"marin/demo_session": f"{session}-{uuid.uuid4().hex[:8]}"}
        return watched(instance, progress, mark, lambda: run({**tags, **mark}))
    return execute


def run_all(args: argparse.Namespace, out: TextIO) -> dict:
    from assets.scaling import DEMO_LADDER
    from assets.training import TRAIN_KEY
    from definitions import defs
    from demo.phases import run_demo_phases
    from demo.scaling import run_ladder
    from sensors.phase_controller import budget_path

    say = lambda text: print(text, file=out, flush=True)
    session = uuid.uuid4().hex[:12]
    total = len(defs.resolve_job_def(args.job).asset_layer.executable_asset_keys)
    with dg.DagsterInstance.get() as instance:
        say(f"{args.job}: {total} assets")
        summary = run_data_job(args.job, instance, Progress(total, out), session)
        if summary["success"] and not args.skip_shards:
            from demo.shards import run_shard_graph
            from jobs import DEMO_TAGS

            say("the sharded DataKit graph: one run per wave, shard partitions fanned out over local processes")
            summary["shards"] = run_shard_graph(defs, instance, tags={**DEMO_TAGS, "marin/demo_session": f"{session}-shards"}, log=say)
            summary["success"] = summary["shards"]["success"]
        if summary["success"] and not args.skip_training:
            say("the Tootsie run: the phase controller decides each phase of train/demo")
            phases = run_demo_phases(defs, instance, dg.AssetKey.from_user_string(TRAIN_KEY), budget_path(), log=say,
                                     execute=tagged(instance, Progress(None, out), session))
            summary["phases"] = [t.get("phase") for t in phases["ticks"] if t.get("phase")]
            summary["decisions"] = phases["decisions"]
        if summary["success"] and not args.skip_scaling:
            steps = 2 + len(DEMO_LADDER.keys()) + 2  # data, every sweep partition, fit, prediction
            say(f"the scaling ladder: {steps} assets")
            summary["scaling"] = run_ladder(defs, instance, DEMO_LADDER, log=say,
                                            execute=tagged(instance, Progress(steps, out), session))
    return summary


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not Path("definitions.py").is_file():
        print("definitions.py not found: run `marin demo` from the repository root", file=sys.stderr)
        return 2
    home = Path(os.environ.setdefault("DAGSTER_HOME", os.path.abspath(".dagster_home")))
    event_log = home / "logs" / f"demo-{time.strftime('%Y%m%d-%H%M%S')}.log"
    started = time.monotonic()
    with stderr_to(event_log) as terminal:
        out = terminal if args.json else sys.stdout
        print(f"Dagster's event log: {event_log}", file=out, flush=True)
        try:
            summary = run_all(args, out)
        except Exception:  # the person sees the error, not only the log file
            traceback.print_exc(file=terminal)
            print(f"demo failed; Dagster's event log: {event_log}", file=terminal)
            return 1
    summary["seconds"] = round(time.monotonic() - started, 1)
    summary["dagster_home"] = str(home)
    summary["artifacts"] = os.environ.get("MARIN_PREFIX", os.path.abspath("artifacts"))
    summary["event_log"] = str(event_log)
    print(json.dumps(summary, sort_keys=True) if args.json else render(summary), flush=True)
    return 0 if summary["success"] else 1


def render(summary: dict) -> str:
    hits = sum(1 for a in summary["assets"].values() if a["cache_hit"])
    lines = [f"\n{summary['job']}: {'SUCCESS' if summary['success'] else 'FAILED'} in {summary['seconds']}s, "
             f"{len(summary['assets'])} assets ({hits} cache hits), run {summary['run_id']}"]
    for key, info in sorted(summary["assets"].items()):
        lines.append(f"  {key:40s} {'hit ' if info['cache_hit'] else 'new '} {info['path']}")
    if "shards" in summary:
        sh = summary["shards"]
        lines.append(f"  sharded graph: {sh['shards']} shards, {sh['partitions']} partitions ({sh['cache_hits']} cache hits) "
                     f"in {sh['runs']} run(s) ({sh['up_to_date_waves']} wave(s) up to date), {sh['seconds']}s")
    for d in summary.get("decisions", []):
        lines.append(f"  phase {d['phase']:10s} -> {d.get('decision', ''):10s} {d.get('reason', '')}")
    if "scaling" in summary:
        sc = summary["scaling"]
        lines.append(f"  scaling ladder: predicted loss {sc['prediction']:.4f} vs actual {sc['actual']:.4f} at the held-out budget "
                     f"(relative error {sc['relative_error']:+.2%}, check {'passed' if sc['passed'] else 'FAILED'})")
    lines.append(f"artifacts under {summary['artifacts']}; Dagster instance in {summary['dagster_home']} (`make ui` to browse)")
    lines.append(f"Dagster's event log (every DEBUG event of these runs): {summary['event_log']}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
