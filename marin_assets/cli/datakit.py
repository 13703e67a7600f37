"""`marin datakit run`: the sharded DataKit asset graph materialised on your own files.

The flags and paths are checked here, before any work; then the graph driver, which lives
in the definition layer (assets/shards/run.py, which the library never imports), runs as
``python -m assets.shards.run --spec JSON`` (an argv list), on an ephemeral Dagster instance
with its artifact store under --prefix. Its stderr (progress) and stdout (the summary line)
are passed through; its exit status is the command's.
"""

from __future__ import annotations

import argparse
import codecs
import subprocess
import sys
import threading


def register(subparsers) -> None:
    parser = subparsers.add_parser("datakit", help="data pipeline: normalize, filter, dedup, decontaminate, tokenize")
    sub = parser.add_subparsers(dest="datakit_command", metavar="COMMAND")
    parser.set_defaults(handler=lambda args: (parser.print_help(), 0)[1])

    run = sub.add_parser("run", help="materialise the sharded DataKit graph on --input paths and print one JSON summary line")
    run.add_argument("--input", action="append", required=True, metavar="PATH",
                     help="file or directory (any fsspec URL) of .jsonl/.jsonl.gz/.jsonl.zst/.parquet/.txt; repeatable")
    run.add_argument("--eval", action="append", default=[], metavar="PATH",
                     help="eval set: a jsonl file with a 'text' field or a packaged set name; repeatable")
    run.add_argument("--prefix", required=True, metavar="DIR", help="where every stage writes its output")
    run.add_argument("--quality-threshold", type=float, default=0.0,
                     help="drop documents whose quality score is below this (0 keeps everything)")
    run.add_argument("--quality-model", default=None, metavar="DIR",
                     help="a trained quality model dir (default: train one on the demo sources when threshold > 0)")
    run.add_argument("--tokenizer", default=None, metavar="PATH", help="tokenizer.json to use (default: train a BPE)")
    run.add_argument("--vocab-size", type=int, default=4096, help="vocabulary of the trained BPE")
    run.add_argument("--validation-fraction", type=float, default=0.01)
    run.add_argument("--shard-docs", type=int, default=10_000, help="documents per Parquet shard")
    run.add_argument("--max-doc-bytes", type=int, default=16 * 1024 * 1024,
                     help="documents larger than this are quarantined")
    run.add_argument("--cache-dir", default=None, help="download cache for demo-source artifacts")
    run.add_argument("--shard-bytes", type=int, default=1024 * 1024,
                     help="raw input bytes per shard partition (the unit of parallel work)")
    run.add_argument("--workers", type=int, default=None, metavar="N",
                     help="local processes that compute shard partitions (default: $MARIN_LOCAL_WORKERS, else the core count)")
    run.add_argument("--json", action="store_true", help="print only the JSON line (no progress lines)")
    run.set_defaults(handler=run_handler)


# PipelineConfig / RunSpec field -> the flag that sets it, so a bad value is reported as the user typed it.
FLAGS = {
    "quality_threshold": "--quality-threshold",
    "quality_model": "--quality-model",
    "source_cache_dir": "--cache-dir",
    "tokenizer": "--tokenizer",
    "vocab_size": "--vocab-size",
    "validation_fraction": "--validation-fraction",
    "shard_docs": "--shard-docs",
    "max_doc_bytes": "--max-doc-bytes",
    "workers": "--workers",
    "shard_bytes": "--shard-bytes",
}
DRIVER = "assets.shards.run"


def run_handler(args: argparse.Namespace) -> int:
    """Exit 0 with the summary; 2 for a bad flag, 1 for a failed run or one that kept nothing.

    Every flag and path is checked before any work starts (PipelineConfig and RunSpec on
    construction, check_run_inputs, every eval item read).
    """
    from marin_assets.datakit.pipeline import ConfigFieldError, PipelineConfig, RunSpec, check_eval_sets, check_run_inputs
    from marin_assets.orchestration.fanout import local_workers

    try:
        config = PipelineConfig(
            quality_threshold=args.quality_threshold,
            quality_model=args.quality_model,
            source_cache_dir=args.cache_dir,
            tokenizer=args.tokenizer,
            vocab_size=args.vocab_size,
            validation_fraction=args.validation_fraction,
            shard_docs=args.shard_docs,
            max_doc_bytes=args.max_doc_bytes,
        )
        workers = args.workers if args.workers is not None else local_workers()
        spec = RunSpec(tuple(args.input), tuple(args.eval), args.prefix, config, workers=workers,
                       shard_bytes=args.shard_bytes, quiet=args.json)
    except ConfigFieldError as e:
        print(f"marin datakit run: {FLAGS.get(e.field, e.field)}: {e.reason}", file=sys.stderr)
        return 2
    except ValueError as e:  # $MARIN_LOCAL_WORKERS
        print(f"marin datakit run: {e}", file=sys.stderr)
        return 2
    try:
        check_run_inputs(spec.inputs, spec.evals, spec.prefix, config)
        check_eval_sets(spec.evals)
    except (FileNotFoundError, ValueError) as e:
        print(f"marin datakit run: {e}", file=sys.stderr)
        return 1
    return run_driver([sys.executable, "-m", DRIVER, "--spec", spec.to_json()])


def run_driver(argv: list[str]) -> int:
    """Run the driver; relay its stderr as it comes and its stdout (the summary) to ours."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def relay(stream, out) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")  # a chunk may end inside a character
        for chunk in iter(lambda: stream.read1(65536), b""):
            out.write(decoder.decode(chunk))
            out.flush()
        out.write(decoder.decode(b"", final=True))

    errors = threading.Thread(target=relay, args=(proc.stderr, sys.stderr), daemon=True)
    errors.start()
    relay(proc.stdout, sys.stdout)
    errors.join()
    return proc.wait()
