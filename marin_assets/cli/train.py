"""``marin train --cache DIR --config FILE --out DIR [--resume] [--processes P --devices-per-process D]``.

``--processes P`` runs the ``processes`` training backend: P worker processes
(``python -m marin_assets.cli._train_worker``: ``marin_assets.train.distributed.worker`` that reads an
``hf:PATH`` warm start) forming one ``jax.distributed`` job on this host, the batch split
over all P x D devices of the ("data", "sequence", "expert") mesh; process 0 writes
OUT. ``--devices-per-process D`` gives each process D devices (on CPU: forced host devices).
Worker logs go to OUT/workers/process-<i>.log.

``--cache`` takes the dataset index ``marin datakit run`` reports (``<prefix>/cache``: the
shard caches it lists are read in place, their train splits trained on, their validation
splits giving the held-out loss), a DataKit cache folder (``train/`` + ``validation/``) or one
Levanter split. When the config leaves ``model.vocab_size`` unset it is taken from the cache's
tokenizer. A resume (or warm start) onto tokens of another tokenizer than the checkpoint's is
refused unless ``--allow-tokenizer-change``. Exit codes: 0 trained, 1 the run skipped most of
its steps, 2 bad config/input.

Checkpoint tools (necromancy, transplant, prune): ``cli/train_tools.py``.
"""

from __future__ import annotations

import argparse
import sys

from marin_assets.cli._train_shared import json_safe, named_caches, show_library_log
from marin_assets.cli._types import positive_int
from marin_assets.cli.train_tools import register_tools
from marin_assets.store.fsutil import check_bucket, child, filesystem, join
from marin_assets.train.checkpoints.work_dir import check_is_folder, work_dir_lease
from marin_assets.train.compile_cache import ensure_compile_cache
from marin_assets.train.config import load_config, replace
from marin_assets.train.distributed import mesh as meshlib
from marin_assets.train.metrics import read_metrics


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
        type=positive_int,
        default=None,
        metavar="P",
        help="run P worker processes as one jax.distributed job (the processes backend)",
    )
    parser.add_argument(
        "--devices-per-process",
        type=positive_int,
        default=None,
        metavar="D",
        help="devices per process (CPU: forced host devices); with --processes",
    )
    parser.set_defaults(handler=run)
    # --cache, --config and --out are required of a training run (checked in run), not of the tools below.
    tools = parser.add_subparsers(dest="tool", metavar="TOOL", required=False)

    register_tools(tools)


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
    return {k: json_safe(v) for k, v in summary.items()}


def run(args: argparse.Namespace) -> int:
    import json

    ensure_compile_cache()

    from marin_assets.hf import warm_start_weights  # deferred (import cost): jax, optax
    from marin_assets.train.checkpoints.sharded_checkpoint import CheckpointNotWritten  # deferred (import cost): jax

    # deferred (import cost): jax, optax, polars, pyarrow
    from marin_assets.train.loop import TooManySkippedSteps, open_sources, train

    missing = [flag for flag, value in (("--cache", args.cache), ("--config", args.config), ("--out", args.out)) if value is None]
    if missing:
        print(f"marin train: the following arguments are required: {', '.join(missing)}", file=sys.stderr)
        return 2
    show_library_log()
    out = child(args.out)  # a local Path, or the URL as given (gs://...): never Path("gs://b") = "gs:/b"
    try:
        check_bucket(args.out)  # gs://no-such-bucket: named now, not as an upload URL after the first steps
        caches = named_caches(args.cache)
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
    from marin_assets.train.checkpoints import checkpoint as ckpt  # deferred (import cost): jax

    latest = ckpt.latest_valid(child(out, "checkpoints"))
    then = f"--resume continues from {latest}" if latest is not None else "no checkpoint had committed yet"
    return f"writing {out} failed: {error}; {then} once the cause is fixed"


def _has_checkpoints(out) -> bool:
    """Whether OUT (a local Path or a URL) holds a checkpoint folder of any kind."""
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

    # deferred (import cost): dagster
    from marin_assets.orchestration.training_backends import TrainingFailed, TrainSpec, launch_workers
    from marin_assets.train.checkpoints import checkpoint as ckpt  # deferred (import cost): jax

    if isinstance(out, str):
        raise ValueError(f"--processes keeps the workers' logs next to --out: give a local --out, not {out}")
    processes, per_process = args.processes or 1, args.devices_per_process
    devices = processes * (per_process or 1)
    # What the workers would reject after starting, said now (the expert axis divides anything
    # the batch shards do: it is chosen inside one process).
    sequence = config.sequence_parallel
    if devices % sequence:
        raise ValueError(
            f"sequence_parallel {sequence} does not divide the {devices} devices (--processes x --devices-per-process)"
        )
    meshlib.check_fits(
        types.SimpleNamespace(shape={"data": devices // sequence, "sequence": sequence, "expert": 1}),
        config.model,
        config.batch_size,
        config.seq_len,
        config.microbatches,
        config.sequence_parallel,
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
            json_safe(
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
