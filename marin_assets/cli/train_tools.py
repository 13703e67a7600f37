"""The checkpoint tools under ``marin train`` (``cli/train.py`` registers them as its TOOL sub-commands).

Recovery tools (``marin_assets/train/checkpoints/necromancy.py``, ``transplant.py``), each writing a new out dir:

  marin train necromancy --checkpoint CKPT --cache [NAME=]DIR --steps N --out NEW
      the optimizer state rebuilt from N gradients at CKPT's frozen parameters; then
      ``marin train --cache ... --config ... --out NEW --resume`` continues the run.
  marin train transplant --checkpoint CKPT --config TARGET.yaml --mapping qk_norm|upcycle --out NEW
      CKPT's weights carried into another architecture; then ``--warm-start NEW``.

Retention (``marin_assets/train/checkpoints/retention.py``), in place, under OUT's lease:

  marin train prune --out OUT --keep-last N [--keep-step S ...] [--dry-run] [--json]
      delete OUT's checkpoints but the newest N valid ones, each phase's final, the --keep-step
      ones and any folder that is not a valid committed checkpoint; says what it kept and why,
      and what it deleted. ``--resume`` on OUT still continues from its newest checkpoint.
"""

from __future__ import annotations

import argparse
import sys

from marin_assets.cli._train_shared import json_safe, named_caches, show_library_log
from marin_assets.cli._types import positive_int
from marin_assets.train.checkpoints import retention
from marin_assets.train.checkpoints.work_dir import work_dir_lease
from marin_assets.train.compile_cache import ensure_compile_cache


def register_tools(tools) -> None:
    """necromancy, transplant and prune, as sub-commands of ``marin train``."""
    _register_necromancy(tools)
    _register_transplant(tools)
    _register_prune(tools)


def _register_necromancy(tools) -> None:
    parser = tools.add_parser(
        "necromancy",
        help="rebuild a checkpoint's optimizer state from N gradients at its frozen parameters",
        description="Rebuild the optimizer moments of CHECKPOINT from N gradients on the run's next batches, "
        "parameters frozen, into OUT/checkpoints (same step, parameters and data position); then "
        "marin train --resume on OUT continues the run. Prints one JSON line.",
    )
    parser.add_argument("--checkpoint", required=True, help="a checkpoint folder, or an out dir (its newest valid one)")
    parser.add_argument(
        "--cache",
        dest="necro_cache",
        action="append",
        required=True,
        metavar="[NAME=]DIR",
        help="the run's data, as marin train takes it (repeat for a mixture)",
    )
    parser.add_argument(
        "--steps", dest="necro_steps", type=positive_int, required=True, metavar="N", help="gradients to rebuild the moments from"
    )
    parser.add_argument("--out", dest="necro_out", required=True, help="a new out dir for the rebuilt checkpoint")
    parser.add_argument(
        "--allow-tokenizer-change",
        dest="necro_allow_tokenizer_change",
        action="store_true",
        help="rebuild even though the cache's tokenizer differs from the checkpoint's",
    )
    parser.set_defaults(handler=run_necromancy)


def _register_transplant(tools) -> None:
    parser = tools.add_parser(
        "transplant",
        help="carry a checkpoint's weights into another architecture (QK-norm, dense -> MoE)",
        description="Write CHECKPOINT's parameters, mapped by MAPPING, as a checkpoint of the TARGET config "
        "into OUT/checkpoints; then marin train --warm-start OUT. Prints one JSON line.",
    )
    parser.add_argument(
        "--checkpoint", dest="tp_checkpoint", required=True, help="a checkpoint folder, or an out dir (its newest valid one)"
    )
    parser.add_argument(
        "--config",
        dest="tp_config",
        required=True,
        help="YAML TrainConfig of the target model (model.vocab_size unset: the source's)",
    )
    parser.add_argument(
        "--mapping",
        required=True,
        help="qk_norm: add QK-norm (gains start at ones); upcycle: dense -> MoE (experts copy the MLP)",
    )
    parser.add_argument("--out", dest="tp_out", required=True, help="a new out dir for the target checkpoint")
    parser.set_defaults(handler=run_transplant)


def _register_prune(tools) -> None:
    parser = tools.add_parser(
        "prune",
        help="delete a run's old checkpoints, keeping the last N, each phase's final and pinned ones",
        description="Delete the checkpoints of OUT that nothing needs: kept are the newest N valid ones, the newest "
        "valid one, each phase's final, the --keep-step ones, and any folder that is not a valid "
        "committed checkpoint. Holds OUT's lease (refused while a run writes OUT). Prints what it kept, "
        "with reasons, and what it deleted, with the bytes freed.",
    )
    parser.add_argument("--out", dest="prune_out", required=True, help="the run dir (a marin train --out) to prune")
    parser.add_argument(
        "--keep-last", dest="keep_last", type=positive_int, required=True, metavar="N", help="keep the newest N valid checkpoints"
    )
    parser.add_argument(
        "--keep-step",
        dest="keep_step",
        type=int,
        action="append",
        default=[],
        metavar="S",
        help="also keep step S (a checkpoint another asset read); repeat for more",
    )
    parser.add_argument(
        "--dry-run",
        dest="dry_run",
        action="store_true",
        help="say what would be kept and deleted, delete nothing (takes no lease)",
    )
    parser.add_argument("--json", dest="prune_json", action="store_true", help="print one JSON line")
    parser.set_defaults(handler=run_prune)


def run_necromancy(args: argparse.Namespace) -> int:
    """``marin train necromancy``: 0 rebuilt (one JSON line), 2 bad input (one line naming it)."""
    import json

    ensure_compile_cache()
    from marin_assets.train.checkpoints.necromancy import necromancy  # deferred (import cost): jax, optax

    show_library_log()
    try:
        with work_dir_lease(args.necro_out, "marin train necromancy"):
            rebuilt = necromancy(
                args.checkpoint,
                named_caches(args.necro_cache),
                args.necro_steps,
                args.necro_out,
                allow_tokenizer_change=args.necro_allow_tokenizer_change,
            )
    except (ValueError, FileNotFoundError) as e:
        print(f"marin train necromancy: {e}", file=sys.stderr)
        return 2
    print(
        json.dumps(
            json_safe(
                {
                    "checkpoint": str(rebuilt.checkpoint),
                    "step": rebuilt.step,
                    "gradients": rebuilt.gradients,
                    "skipped": rebuilt.skipped,
                    "batch_steps": list(rebuilt.steps),
                    "mean_loss": rebuilt.mean_loss,
                }
            ),
            allow_nan=False,
        )
    )
    return 0


def run_transplant(args: argparse.Namespace) -> int:
    """``marin train transplant``: 0 written (one JSON line), 2 bad input (one line naming it)."""
    import json

    from marin_assets.train.checkpoints.transplant import transplant  # deferred (import cost): jax, optax

    show_library_log()
    try:
        with work_dir_lease(args.tp_out, "marin train transplant"):
            done = transplant(args.tp_checkpoint, args.tp_config, args.mapping, args.tp_out)
    except (ValueError, FileNotFoundError) as e:
        print(f"marin train transplant: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"checkpoint": str(done.checkpoint), "step": done.step, "mapping": done.mapping}))
    return 0


def run_prune(args: argparse.Namespace) -> int:
    """``marin train prune``: 0 pruned (or planned, --dry-run), 2 bad input or OUT busy (one line naming it)."""
    import contextlib

    try:
        retention.check_run_dir(args.prune_out)  # before the lease, which would make the folder
        # A dry run only reads: it may look at a run in flight (whose unfinished save shows as not committed).
        lease = contextlib.nullcontext() if args.dry_run else work_dir_lease(args.prune_out, "marin train prune")
        with lease:  # planned under the lease: no trainer commits between the plan and the deletes
            plan = retention.plan_retention(args.prune_out, args.keep_last, args.keep_step)
            deleted = (
                retention.sizes(args.prune_out, plan.delete) if args.dry_run else retention.apply_retention(args.prune_out, plan)
            )
    except (ValueError, FileNotFoundError) as e:
        print(f"marin train prune: {e}", file=sys.stderr)
        return 2
    _print_prune(args, plan, deleted)
    return 0


def _print_prune(args: argparse.Namespace, plan, deleted: list[dict]) -> None:
    """What was kept (with reasons) and deleted (with bytes): one JSON line with --json, else a line each."""
    import json

    kept = [
        {"step": step, "reason": reason, **({"problem": plan.problems[step]} if step in plan.problems else {})}
        for step, reason in plan.keep
    ]
    freed = sum(d["bytes"] for d in deleted)
    verb = "would delete" if args.dry_run else "deleted"
    if args.prune_json:
        print(
            json.dumps(
                {
                    "run_dir": str(args.prune_out),
                    "dry_run": args.dry_run,
                    "kept": kept,
                    verb.replace(" ", "_"): deleted,
                    "bytes_freed": 0 if args.dry_run else freed,
                }
            )
        )
        return
    for k in kept:
        print(f"keep    step {k['step']}: {k['reason']}" + (f" ({k['problem']})" if "problem" in k else ""))
    for d in deleted:
        print(f"{'would ' if args.dry_run else ''}delete  step {d['step']}: {d['bytes']} bytes ({d['folder']})")
    print(f"marin train prune: {verb} {len(deleted)} checkpoint(s), {freed} bytes; kept {len(kept)}")
