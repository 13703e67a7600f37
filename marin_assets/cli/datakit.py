"""`marin datakit run`: the whole DataKit graph, in-process, on your own files."""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers) -> None:
    parser = subparsers.add_parser("datakit", help="data pipeline: normalize, filter, dedup, decontaminate, tokenize")
    sub = parser.add_subparsers(dest="datakit_command", metavar="COMMAND")
    parser.set_defaults(handler=lambda args: (parser.print_help(), 0)[1])

    run = sub.add_parser("run", help="run every stage on --input paths and print one JSON summary line")
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
    run.add_argument("--json", action="store_true", help="print only the JSON line (no progress bar)")
    run.set_defaults(handler=run_handler)


# PipelineConfig field -> the flag that sets it, so a bad value is reported as the user typed it.
FLAGS = {
    "quality_threshold": "--quality-threshold",
    "quality_model": "--quality-model",
    "source_cache_dir": "--cache-dir",
    "tokenizer": "--tokenizer",
    "vocab_size": "--vocab-size",
    "validation_fraction": "--validation-fraction",
    "shard_docs": "--shard-docs",
    "max_doc_bytes": "--max-doc-bytes",
}


def run_handler(args: argparse.Namespace) -> int:
    """Exit 0 with the summary; 2 for a bad flag, 1 for a failed run or one that kept nothing.

    Every flag and path is checked before any stage runs (PipelineConfig on construction,
    check_run_inputs at the start of run_pipeline).
    """
    from tqdm import tqdm

    from marin_assets.datakit.pipeline import STAGES, ConfigFieldError, PipelineConfig, run_pipeline

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
    except ConfigFieldError as e:
        print(f"marin datakit run: {FLAGS.get(e.field, e.field)}: {e.reason}", file=sys.stderr)
        return 2
    bar = tqdm(total=len(STAGES), desc="datakit", unit="stage", file=sys.stderr, disable=args.json)

    def on_stage(stage: str, counts: dict) -> None:
        bar.set_postfix_str(stage)
        bar.update(1)

    try:
        summary = run_pipeline(args.input, args.eval, args.prefix, config, on_stage=on_stage)
    except (FileNotFoundError, ValueError) as e:
        bar.close()
        print(f"marin datakit run: {e}", file=sys.stderr)
        return 1
    bar.close()
    print(json.dumps(summary, sort_keys=True))
    if summary["docs_out"] == 0:
        print(
            f"marin datakit run: no documents left ({summary['docs_in']} read, {summary['quarantined']} quarantined, "
            f"removed {summary['removed']}); the cache is empty",
            file=sys.stderr,
        )
        return 1
    return 0
