"""``marin train --cache DIR --config FILE --out DIR [--resume] [--processes P --devices-per-process D]``.

``--processes P`` runs the ``processes`` training backend: P worker processes
(``python -m marin_assets.cli._train_worker``: ``marin_assets.train.worker`` that reads an
``hf:PATH`` warm start) forming one ``jax.distributed`` job on this host, the batch split
over all P x D devices of the ("data", "expert") mesh; process 0 writes
OUT. ``--devices-per-process D`` gives each process D devices (on CPU: forced host devices).
Worker logs go to OUT/workers/process-<i>.log.

``--cache`` takes the dataset index ``marin datakit run`` reports (``<prefix>/cache``: the
shard caches it lists are read in place, their train splits trained on, their validation
splits giving the held-out loss), a DataKit cache folder (``train/`` + ``validation/``) or one
Levanter split. When the config leaves ``model.vocab_size`` unset it is taken from the cache's
tokenizer. A resume (or warm start) onto tokens of another tokenizer than the checkpoint's is
refused unless ``--allow-tokenizer-change``. Exit codes: 0 trained, 1 the run skipped most of
its steps, 2 bad config/input.

Recovery tools (``marin_assets/train/necromancy.py``, ``transplant.py``), each writing a new out dir:

  marin train necromancy --checkpoint CKPT --cache [NAME=]DIR --steps N --out NEW
      the optimizer state rebuilt from N gradients at CKPT's frozen parameters; then
      ``marin train --cache ... --config ... --out NEW --resume`` continues the run.
  marin train transplant --checkpoint CKPT --config TARGET.yaml --mapping qk_norm|upcycle --out NEW
      CKPT's weights carried into another architecture; then ``--warm-start NEW``.

Retention (``marin_assets/train/retention.py``), in place, under OUT's lease:

  marin train prune --out OUT --keep-last N [--keep-step S ...] [--dry-run] [--json]
      delete OUT's checkpoints but the newest N valid ones, each phase's final, the --keep-step
      ones and any folder that is not a valid committed checkpoint; says what it kept and why,
      and what it deleted. ``--resume`` on OUT still continues from its newest checkpoint.
"""

from __future__ import annotations

import argparse
import logging
import sys


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train on a Levanter token cache",
        description="Train on Levanter-format token cache(s) with a YAML TrainConfig; checkpoints into OUT and "
        "appends one JSON line per step to OUT/metrics.jsonl.",
    )
    parser.add_argument(
        "--cache",
        action="append",
        metavar="[NAME=]DIR",
        help="what marin datakit run reports as cache (a dataset index), a DataKit cache folder "
        "(train/ + validation/) or one Levanter split; repeat for a mixture (NAME=DIR names the source)",
    )
    parser.add_argument("--config", help="YAML with TrainConfig fields (see examples/tiny_moe.yaml)")
    parser.add_argument("--out", help="output dir: checkpoints/, metrics.jsonl, loss_curve.png")
    parser.add_argument("--resume", action="store_true", help="continue from the newest valid checkpoint in OUT")
    parser.add_argument("--warm-start", default=None, help="start this phase from another run's checkpoint")
    parser.add_argument("--steps", type=int, default=None, help="override num_steps")
    parser.add_argument(
        "--allow-tokenizer-change",
        action="store_true",
        help="resume or warm start even though the cache's tokenizer differs from the checkpoint's",
    )
    parser.add_argument(
        "--processes",
        type=_positive,
        default=None,
        metavar="P",
        help="run P worker processes as one jax.distributed job (the processes backend)",
    )
    parser.add_argument(
        "--devices-per-process",
        type=_positive,
        default=None,
        metavar="D",
        help="devices per process (CPU: forced host devices); with --processes",
    )
    parser.set_defaults(handler=run)
    # --cache, --config and --out are required of a training run (checked in run), not of the tools below.
    tools = parser.add_subparsers(dest="tool", metavar="TOOL", required=False)
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
        "--steps", dest="necro_steps", type=_positive, required=True, metavar="N", help="gradients to rebuild the moments from"
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
        "--keep-last", dest="keep_last", type=_positive, required=True, metavar="N", help="keep the newest N valid checkpoints"
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


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return int(text)


def _caches(specs: list[str]) -> dict[str, str]:
    out = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            path = spec
            name = "train" if len(specs) == 1 else path.rstrip("/").split("/")[-1]
        if name in out:
            raise ValueError(f"--cache: source name {name!r} given twice")
        out[name] = path
    return out


def _vocab_of(sources: dict) -> int | None:
    """The largest tokenizer vocabulary the caches declare (None when none does)."""
    sizes = [s.vocab_size for s in sources.values() if s.vocab_size is not None]
    return max(sizes) if sizes else None


def held_out_note(sources: dict) -> str | None:
    """One line saying why there will be no held-out loss when no --cache has a validation
    split (a single Levanter split was given); None when one has. Said before training
    starts, so a missing number is never a surprise at the end."""
    if any(s.validation is not None for s in sources.values()):
        return None
    given = ", ".join(s.where for s in sources.values())
    return (
        f"marin train: no held-out loss: no validation split in {given} (pass what marin datakit run "
        f"reports as cache, <prefix>/cache, for train and validation splits)"
    )


class _StderrLines(logging.Handler):
    """The training library's INFO lines and warnings as ``marin train: ...`` on the current
    sys.stderr (looked up per line, so in-process callers that swap it still see them)."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"marin train: {record.getMessage()}", file=sys.stderr)


def show_library_log() -> None:
    # Without a handler, INFO lines such as "resumed from .../step-000000100 at step 100"
    # were dropped, and warnings came out with no prefix through logging's last resort.
    logger = logging.getLogger("marin_assets.train")
    if not any(isinstance(h, _StderrLines) for h in logger.handlers):
        logger.addHandler(_StderrLines())
    logger.setLevel(logging.INFO)


def _json_safe(value):
    """JSON has no NaN/inf: print null for them (``json.dumps`` would print bare NaN)."""
    import math

    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    return value


def _summary(result) -> dict:
    summary = {
        "final_step": result.final_step,
        "tokens": result.tokens,
        "last_loss": result.last_loss,
        "validation_loss": result.validation_loss,
        "counts": result.counts,
        "checkpoint": str(result.checkpoint_dir),
        "metrics": str(result.metrics_path),
        "loss_curve": str(result.loss_curve_png),
    }
    return {k: _json_safe(v) for k, v in summary.items()}


def run(args: argparse.Namespace) -> int:
    import json

    from marin_assets.train.compile_cache import ensure_compile_cache

    ensure_compile_cache()

    from marin_assets.hf import warm_start_weights
    from marin_assets.store.fsutil import check_bucket, child
    from marin_assets.train.config import load_config, replace
    from marin_assets.train.loop import TooManySkippedSteps, open_sources, train
    from marin_assets.train.sharded_checkpoint import CheckpointNotWritten
    from marin_assets.train.work_dir import check_is_folder

    missing = [flag for flag, value in (("--cache", args.cache), ("--config", args.config), ("--out", args.out)) if value is None]
    if missing:
        print(f"marin train: the following arguments are required: {', '.join(missing)}", file=sys.stderr)
        return 2
    show_library_log()
    out = child(args.out)  # a local Path, or the URL as given (gs://...): never Path("gs://b") = "gs:/b"
    try:
        check_bucket(args.out)  # gs://no-such-bucket: named now, not as an upload URL after the first steps
        caches = _caches(args.cache)
        sources = open_sources(caches)  # a missing or unfinished cache fails here
        config = load_config(args.config, vocab_size=_vocab_of(sources))
        if args.steps is not None:
            config = replace(config, num_steps=args.steps)
        check_is_folder(out)
        note = held_out_note(sources)
        if not args.resume and _has_checkpoints(out):
            print(f"marin train: {out} already has checkpoints; pass --resume to continue", file=sys.stderr)
            return 2
        if note:
            print(note, file=sys.stderr)
        if args.processes is not None or args.devices_per_process is not None:
            return _run_processes(args, config, caches, out)
        result = train(
            config,
            caches,
            out,
            resume=args.resume,
            warm_start=args.warm_start,
            allow_tokenizer_change=args.allow_tokenizer_change,
            read_weights=warm_start_weights,
        )
    except (ValueError, FileNotFoundError) as e:
        print(f"marin train: {e}", file=sys.stderr)
        return 2
    except TooManySkippedSteps as e:
        print(json.dumps(_summary(e.result), allow_nan=False))
        print(f"marin train: {e}", file=sys.stderr)
        return 1
    except (OSError, CheckpointNotWritten) as e:  # a full disk or a lost mount mid-run: the committed checkpoints stand
        print(f"marin train: {storage_failure(e, out)}", file=sys.stderr)
        return 1
    print(json.dumps(_summary(result), allow_nan=False))
    if result.stopped_by:  # a clean, resumable stop (SIGTERM/SIGINT) at a checkpoint, not a failure
        print(f"marin train: {result.stop_message}; --resume continues from there", file=sys.stderr)
    return 0


def storage_failure(error: Exception, out) -> str:
    """One line for a write that failed mid-run (a full disk, say): the error, and where --resume would
    continue from (a checkpoint commits only once every file is written, so a failed save is never used)."""
    from marin_assets.store.fsutil import child
    from marin_assets.train import checkpoint as ckpt

    latest = ckpt.latest_valid(child(out, "checkpoints"))
    then = f"--resume continues from {latest}" if latest is not None else "no checkpoint had committed yet"
    return f"writing {out} failed: {error}; {then} once the cause is fixed"


def _has_checkpoints(out) -> bool:
    """Whether OUT (a local Path or a URL) holds a checkpoint folder of any kind."""
    from marin_assets.store.fsutil import filesystem, join

    fs, root = filesystem(str(out))
    folder = join(root, "checkpoints")
    return fs.isdir(folder) and bool(fs.ls(folder, detail=False))


def _run_processes(args: argparse.Namespace, config, caches: dict[str, str], out) -> int:
    """The processes backend from the command line: the same launcher and worker as the
    ``processes`` resource, without Dagster (the plain worker: no Pipes reports); the
    summary is read back from what process 0 wrote."""
    import json
    import sys
    import types

    from marin_assets.orchestration.training_backends import TrainingFailed, TrainSpec, launch_workers
    from marin_assets.train import checkpoint as ckpt
    from marin_assets.train import mesh as meshlib
    from marin_assets.train.metrics import read_metrics
    from marin_assets.train.work_dir import work_dir_lease

    if isinstance(out, str):
        raise ValueError(f"--processes keeps the workers' logs next to --out: give a local --out, not {out}")
    processes, per_process = args.processes or 1, args.devices_per_process
    devices = processes * (per_process or 1)
    # What the workers would reject after starting, said now (the expert axis divides anything
    # the batch shards do: it is chosen inside one process).
    meshlib.check_fits(
        types.SimpleNamespace(shape={"data": devices, "expert": 1}),
        config.model,
        config.batch_size,
        config.seq_len,
        config.microbatches,
    )
    spec = TrainSpec(
        config,
        caches,
        str(out),
        resume=args.resume,
        warm_start=args.warm_start,
        allow_tokenizer_change=args.allow_tokenizer_change,
    )
    logs = out / "workers"
    # Worker 0 leases OUT itself; this lease keeps a second launcher from rewriting the first's worker logs.
    with work_dir_lease(logs, "marin train --processes"):
        (logs / "spec.json").write_text(json.dumps(spec.to_json_dict()))
        argv = [sys.executable, "-m", "marin_assets.cli._train_worker", "--spec", str(logs / "spec.json")]
        try:
            launch_workers(argv, processes, per_process, logs, log=lambda line: print(line, file=sys.stderr))
        except TrainingFailed as e:
            print(f"marin train: {e}", file=sys.stderr)
            return 1
    result = json.loads((out / "train_result.json").read_text())
    rows = read_metrics(out / "metrics.jsonl")
    png = out / "loss_curve.png"
    print(
        json.dumps(
            _json_safe(
                {
                    "final_step": result["final_step"],
                    "tokens": rows[-1]["tokens"] if rows else 0,
                    "last_loss": rows[-1]["loss"] if rows else None,
                    "validation_loss": result["validation_loss"],
                    "counts": result["counts"],
                    "checkpoint": str(ckpt.latest_valid(out / "checkpoints")),
                    "metrics": str(out / "metrics.jsonl"),
                    "loss_curve": str(png) if png.exists() else None,
                    "processes": processes,
                    "devices": devices,
                }
            ),
            allow_nan=False,
        )
    )
    return 0


def run_necromancy(args: argparse.Namespace) -> int:
    """``marin train necromancy``: 0 rebuilt (one JSON line), 2 bad input (one line naming it)."""
    import json

    from marin_assets.train.compile_cache import ensure_compile_cache

    ensure_compile_cache()
    from marin_assets.train.necromancy import necromancy
    from marin_assets.train.work_dir import work_dir_lease

    show_library_log()
    try:
        with work_dir_lease(args.necro_out, "marin train necromancy"):
            rebuilt = necromancy(
                args.checkpoint,
                _caches(args.necro_cache),
                args.necro_steps,
                args.necro_out,
                allow_tokenizer_change=args.necro_allow_tokenizer_change,
            )
    except (ValueError, FileNotFoundError) as e:
        print(f"marin train necromancy: {e}", file=sys.stderr)
        return 2
    print(
        json.dumps(
            _json_safe(
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

    from marin_assets.train.transplant import transplant
    from marin_assets.train.work_dir import work_dir_lease

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

    from marin_assets.train import retention
    from marin_assets.train.work_dir import work_dir_lease

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
