"""`marin experiment ...`: screening experiments from records in ``experiments/``.

screen RECORD [--json] [--store PREFIX] [--report DIR]
    Runs every (arm, budget, seed) of the record (content-cached in the artifact store, so
    a rerun only computes what is new), fits the baseline's loss vs compute and prints one
    line per arm: {"arm", "effective_speedup", "ci_low", "ci_high", "runs"} (--json), or a
    table. The corpus is a DataKit dataset made first (experiments/data.py). Exit codes: 0 done
    and every control arm's expectation held; 3 a control failed (the screen cannot be
    trusted); 2 bad record, or a started record was edited; 1 the DataKit run failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from marin_assets.experiments.data import CorpusError
from marin_assets.experiments.record_files import load_record
from marin_assets.settings import artifact_prefix
from marin_assets.store import ArtifactStore
from marin_assets.train.checkpoints.work_dir import work_dir_lease
from marin_assets.train.compile_cache import ensure_compile_cache


def register(subparsers) -> None:
    parser = subparsers.add_parser("experiment", help="Screen ideas by effective speedup (experiments/*.yaml).")
    sub = parser.add_subparsers(dest="experiment_command", metavar="SUBCOMMAND")
    p = sub.add_parser("screen", help="Run a record's arms and print each arm's effective speedup.")
    p.add_argument("record", help="experiments/<name>.yaml")
    p.add_argument("--json", action="store_true", help="one JSON object per arm on stdout")
    p.add_argument("--store", default=None, help="artifact store prefix (default $MARIN_PREFIX, else ./artifacts)")
    p.add_argument("--report", default=None, metavar="DIR", help="also write report.md, its PNGs and analysis.json here")
    p.set_defaults(handler=_screen)
    parser.set_defaults(handler=lambda args: (parser.print_help(), 0)[1])


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _screen(args: argparse.Namespace) -> int:
    ensure_compile_cache()

    from marin_assets.experiments.analysis import render_report  # deferred (import cost): polars, pyarrow
    from marin_assets.experiments.screen import run_screen  # deferred (import cost): polars, pyarrow

    try:
        record = load_record(args.record)
        result = run_screen(record, ArtifactStore(args.store or artifact_prefix()), log=_log)
    except (ValueError, FileNotFoundError) as exc:
        print(f"marin experiment screen: {exc}", file=sys.stderr)
        return 2
    except CorpusError as exc:
        print(f"marin experiment screen: {exc}", file=sys.stderr)
        return 1
    for arm in result["arms"]:
        if args.json:
            print(json.dumps({k: arm[k] for k in ("arm", "effective_speedup", "ci_low", "ci_high", "runs")}))
        else:
            print(
                f"{arm['arm']:>16}  speedup {_fmt(arm['effective_speedup'])}  "
                f"[{_fmt(arm['ci_low'])}, {_fmt(arm['ci_high'])}]  runs {arm['runs']}"
            )
    if args.report:
        try:
            _write_report(Path(args.report), *render_report(record, result), result)
        except ValueError as exc:  # a file where the folder goes, or another screen writing there
            print(f"marin experiment screen: {exc}", file=sys.stderr)
            return 2
    _log(
        f"{record.name}: {result['computed']} run(s) computed, {result['cache_hits']} cached; noise floor "
        f"x{_fmt(result['noise_floor']['factor'])}; criterion held: {result['criterion']['held']}"
    )
    for control in result["controls"]:
        _log(f"control {control['check']}: {'held' if control['held'] else 'FAILED'}")
    return 0 if result["controls_held"] else 3


def _write_report(out: Path, markdown: str, images: dict[str, bytes], result: dict) -> None:
    """report.md, its PNGs and analysis.json into ``out``, holding the folder's lease (one writer)."""
    with work_dir_lease(out, "marin experiment screen --report"):
        (out / "report.md").write_text(markdown)
        for name, data in images.items():
            (out / name).write_bytes(data)
        (out / "analysis.json").write_text(json.dumps(result, indent=1))


def _fmt(x) -> str:
    return "inf" if x is None else f"{x:.3f}"
