"""`python -m demo` (what `marin demo` runs): the DataKit, the scaling ladder, the Tootsie run, a greedy sample
of the model it trained and that model exported as a Hugging Face folder (export/demo).

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
from marin_assets.settings import artifact_prefix


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m demo", description="materialise the demo asset graph (local files, SQLite, CPU)"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON line (progress goes to stderr)")
    parser.add_argument("--skip-training", action="store_true", help="skip the phase-controlled training run")
    parser.add_argument("--skip-scaling", action="store_true", help="skip the scaling-law ladder")
    return parser.parse_args(argv)


def tagged(instance: dg.DagsterInstance, progress: Progress, session: str) -> Execute:
    """An ``execute(run, tags)`` that tags each run with its own id and reports its assets as they finish."""

    def execute(run, tags: dict[str, str]):
        mark = {"marin/demo_session": f"{session}-{uuid.uuid4().hex[:8]}"}
        return watched(instance, progress, mark, lambda: run({**tags, **mark}))

    return execute


def run_all(args: argparse.Namespace, out: TextIO) -> dict:
    from assets.partitions import demo_phases
    from assets.scaling_ladders import DEMO_LADDER
    from assets.training import TRAIN_KEY
    from definitions import defs
    from demo.datakit import run_datakit_in_child
    from demo.export import export_main_run
    from demo.phases import run_demo_phases
    from demo.sample import sample_main_run
    from demo.scaling import ladder_steps, run_ladder
    from jobs import DEMO_TAGS
    from marin_assets.train.budget import budget_path

    say = lambda text: print(text, file=out, flush=True)
    session = uuid.uuid4().hex[:12]
    say("DataKit: sources -> shards -> datasets -> mixture; one run per wave, shard partitions fanned out over local processes")
    datakit = run_datakit_in_child(defs, tags={**DEMO_TAGS, "marin/demo_session": f"{session}-datakit"}, log=say)
    summary = {"datakit": datakit, "success": datakit["success"]}
    with dg.DagsterInstance.get() as instance:

        def tootsie() -> None:
            say(
                "the Tootsie run: the phase controller decides each phase of train/demo; the ladder watch judges each "
                "phase against the ladder's runs"
            )
            phases = run_demo_phases(
                defs,
                instance,
                dg.AssetKey.from_user_string(TRAIN_KEY),
                budget_path(),
                log=say,
                execute=tagged(instance, Progress(None, out), session),
            )
            summary["phases"] = [t.get("phase") for t in phases["ticks"] if t.get("phase")]
            summary["decisions"] = phases["decisions"]

        main_run = None if args.skip_training else tootsie
        if summary["success"] and not args.skip_scaling:  # predict before you train (and fork before JAX starts here)
            steps = ladder_steps(DEMO_LADDER)  # the LR sweep, every sweep partition, fit, predictions, targets, comparison
            say(
                f"the scaling ladder (recipe v2, the main run's MoE family): {steps} assets, the sweep's runs on local "
                f"worker processes; each prediction is frozen before its target run starts, the main run's among them"
            )
            summary["scaling"] = run_ladder(
                defs, instance, DEMO_LADDER, log=say, main_run=main_run, execute=tagged(instance, Progress(steps, out), session)
            )
        elif summary["success"] and main_run is not None:
            main_run()
        if summary["success"] and main_run is not None:  # the model the run made, speaking
            try:
                summary["sample"] = sample_main_run(instance, dg.AssetKey.from_user_string(TRAIN_KEY), demo_phases)
            except (ValueError, OSError) as exc:  # a checkpoint that cannot be read: said, not a crash of the summary
                summary["sample"] = {"error": str(exc)}
        if summary["success"] and main_run is not None:  # the run's release: its newest phase as an HF folder
            say("the release: export/demo writes the main run's newest phase as a Hugging Face folder")
            export = export_main_run(
                defs,
                instance,
                dg.AssetKey.from_user_string(TRAIN_KEY),
                demo_phases,
                execute=tagged(instance, Progress(None, out), session),
                tags=dict(DEMO_TAGS),
            )
            if export is not None:
                summary["export"] = export
                # A promised output of the demo: a main run that could not be exported fails it.
                summary["success"] = "error" not in export
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
    summary["artifacts"] = artifact_prefix()
    summary["event_log"] = str(event_log)
    print(json.dumps(summary, sort_keys=True) if args.json else render(summary), flush=True)
    return 0 if summary["success"] else 1


def render(summary: dict) -> str:
    dk = summary["datakit"]
    lines = [
        f"\ndemo: {'SUCCESS' if summary['success'] else 'FAILED'} in {summary['seconds']}s",
        f"  DataKit: {dk['shards']} shards, {dk['partitions']} partitions ({dk['cache_hits']} cache hits) "
        f"in {dk['runs']} run(s) ({dk['up_to_date_waves']} wave(s) up to date), {dk['seconds']}s",
    ]
    for name, tokens in sorted(dk["datasets_train_tokens"].items()):
        lines.append(f"  datasets/{name:24s} {tokens:>12,} train tokens")
    for d in summary.get("decisions", []):
        lines.append(f"  phase {d['phase']:10s} -> {d.get('decision', ''):10s} {d.get('reason', '')}")
    if "scaling" in summary:
        sc = summary["scaling"]
        for name, t in sc["targets"].items():  # each target against the check's bound (the check fails if any misses)
            within = "within" if abs(t["relative_error"]) <= sc["bound"] else "outside"
            # |predicted - actual| / actual <= bound  <=>  actual in [predicted / (1 + bound), predicted / (1 - bound)]
            low, high = t["predicted"] / (1 + sc["bound"]), t["predicted"] / (1 - sc["bound"])
            lines.append(
                f"  scaling ladder: {name} ({t['multiple']:.3g}x the fitted compute) predicted loss "
                f"{t['predicted']:.4f} before its run, actual {t['actual']:.4f} (relative error "
                f"{t['relative_error']:+.2%}, {within} the {sc['bound']:.0%} bound: actual in "
                f"[{low:.4f}, {high:.4f}]); ladder compute {sc['ladder_cost_fraction']:.0%} of the targets'"
            )
            off = t.get("off_optimum") or {}
            if off.get("extrapolated"):
                lines.append(
                    f"  scaling ladder: {name}'s model sat {off['decades']:+.2f} decades from N*, past the ladder's "
                    f"runs ({off['ladder_reach_decades']:.2f}): its prediction extrapolated the off-optimum rise"
                )
        if sc["targets"]:
            lines.append(f"  scaling ladder: prediction_error check {'passed' if sc['passed'] else 'FAILED'}")
        if sc.get("waiting_for"):
            lines.append(f"  scaling ladder: predictions frozen; the comparison waits for {', '.join(sc['waiting_for'])}")
    sample = summary.get("sample")
    if sample and "error" in sample:
        lines.append(f"  sample of train/demo: none ({sample['error']})")
    elif sample:
        lines.append(
            f"  sample of train/demo {sample['phase']} (step {sample['step']}, greedy): "
            f"{sample['prompt']!r} -> {sample['completion']!r}"
        )
    export = summary.get("export")
    if export and "error" in export:
        lines.append(f"  export of train/demo {export['phase']}: FAILED ({export['error']})")
    elif export:
        lines.append(
            f"  export of train/demo {export['phase']} (step {export['step']}, {export['parameters']:,} parameters): "
            f"Hugging Face {export['layout']} folder {export['path']}"
        )
    lines.append(f"artifacts under {summary['artifacts']}; Dagster instance in {summary['dagster_home']} (`make ui` to browse)")
    lines.append(f"Dagster's event log (every DEBUG event of these runs): {summary['event_log']}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
