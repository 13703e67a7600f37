"""`marin datakit run`: the DataKit asset graph materialised on your own files.

The flags (generated from the library's knobs: marin_assets/knobs.py) and paths are checked
here, before any work; then the graph driver, which lives in the definition layer
(assets/datakit/run.py, which the library never imports), runs as
``python -m assets.datakit.run --spec JSON`` (an argv list: marin_assets/datakit/driver.py), on an ephemeral Dagster instance
with its artifact store under --prefix. Its stderr (progress) and stdout (the summary line)
are passed through; its exit status is the command's. The result is a dataset index,
``PREFIX/cache``, over per-shard Levanter caches: ``marin train --cache PREFIX/cache`` reads it.
"""

from __future__ import annotations

import argparse
import sys

from marin_assets.datakit.driver import run_driver
from marin_assets.datakit.language import LanguageConfig
from marin_assets.datakit.quality import QualityScoreConfig
from marin_assets.datakit.readers import ReaderConfig
from marin_assets.datakit.shard_index import ShardingConfig
from marin_assets.datakit.tokenize import TokenizeConfig, TokenizerChoice
from marin_assets.knobs import add_flags, from_flags
from marin_assets.local_workers import local_workers
from marin_assets.store.fsutil import StoreUnusable, check_bucket


def register(subparsers) -> None:
    from marin_assets.datakit.decontaminate import DecontamConfig  # deferred (import cost): pyarrow
    from marin_assets.datakit.fuzzy_dedup import FuzzyDedupConfig  # deferred (import cost): pyarrow

    parser = subparsers.add_parser(
        "datakit", help="data pipeline: read (JSONL, Parquet, WARC, HTML), mask PII, filter, dedup, decontaminate, tokenize"
    )
    sub = parser.add_subparsers(dest="datakit_command", metavar="COMMAND")
    parser.set_defaults(handler=lambda args: (parser.print_help(), 0)[1])

    run = sub.add_parser(
        "run",
        help="materialise the DataKit graph on --input paths and print one JSON summary line",
        description=(__doc__ or "").split("\n\n")[0],
    )
    run.add_argument(
        "--input",
        action="append",
        required=True,
        metavar="PATH",
        help="file or directory (any fsspec URL) of .jsonl/.jsonl.gz/.jsonl.zst/.parquet/.txt, or web pages: "
        ".warc/.warc.gz (Common Crawl's format)/.html; repeatable",
    )
    run.add_argument(
        "--eval",
        action="append",
        default=[],
        metavar="PATH",
        help="eval set: a jsonl file with a 'text' field or a packaged set name; repeatable",
    )
    run.add_argument(
        "--prefix",
        required=True,
        metavar="DIR",
        help="where the run keeps its store, cache/ and summary.json (nothing else there is touched)",
    )
    add_flags(run, TokenizerChoice, ["tokenizer"])
    add_flags(run, QualityScoreConfig, {"threshold": "quality-threshold"})
    add_flags(run, LanguageConfig, ["languages"])
    run.add_argument(
        "--quality-model",
        default=None,
        metavar="PATH",
        help="a quality model: a model dir (as a run or the demo writes it) or any fastText classifier .bin, "
        "which scores P(--quality-label) (default: train one on the demo sources when threshold > 0)",
    )
    run.add_argument(
        "--quality-label",
        default=None,
        metavar="LABEL",
        help="the label of a fastText .bin --quality-model whose probability is the quality score "
        "(default: __label__hq; only with a .bin)",
    )
    add_flags(run, DecontamConfig, {"threshold": "decontam-threshold"})
    add_flags(run, FuzzyDedupConfig, {"jaccard_threshold": "fuzzy-threshold"})
    add_flags(run, TokenizeConfig, ["validation_fraction", "min_validation_docs"])
    add_flags(run, ReaderConfig, ["max_doc_bytes", "extractor"])
    add_flags(run, ShardingConfig, ["shard_bytes"])
    run.add_argument("--cache-dir", default=None, help="download cache for the demo sources' artifacts")
    run.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="local processes that compute shard partitions (default: $MARIN_LOCAL_WORKERS, else the core count)",
    )
    run.add_argument("--json", action="store_true", help="print only the JSON line (no progress lines)")
    run.set_defaults(handler=run_handler)


def run_handler(args: argparse.Namespace) -> int:
    """Exit 0 with the summary; 2 for a bad flag, 1 for a failed run or one that kept nothing.

    Every flag and path is checked before any work starts (the knobs' configs on
    construction, check_run_inputs, every eval item read).
    """
    from marin_assets.datakit.decontaminate import DecontamConfig  # deferred (import cost): pyarrow
    from marin_assets.datakit.fuzzy_dedup import FuzzyDedupConfig  # deferred (import cost): pyarrow
    from marin_assets.datakit.run_spec import RunSpec, check_eval_sets, check_run_inputs  # deferred (import cost): pyarrow

    configs = {
        "tokenizer": (TokenizerChoice, "--tokenizer"),
        "quality": (QualityScoreConfig, "--quality-threshold"),
        "decontam": (DecontamConfig, "--decontam-threshold"),
        "tokenize": (TokenizeConfig, None),
        "reader": (ReaderConfig, None),
        "sharding": (ShardingConfig, "--shard-bytes"),
        "fuzzy": (FuzzyDedupConfig, "--fuzzy-threshold"),
        "language": (LanguageConfig, "--languages"),
    }
    built = {}
    for field, (cls, flag) in configs.items():
        try:
            built[field] = from_flags(args, cls)
        except ValueError as e:  # "TokenizeConfig.validation_fraction must be ..." -> named as the flag
            name = str(e).split(" ", 1)[0].rsplit(".", 1)[-1]
            print(f"marin datakit run: {flag or '--' + name.replace('_', '-')}: {e}", file=sys.stderr)
            return 2
    try:
        workers = args.workers if args.workers is not None else local_workers()
        spec = RunSpec(
            tuple(args.input),
            tuple(args.eval),
            args.prefix,
            **built,
            quality_model=args.quality_model,
            quality_label=args.quality_label,
            source_cache_dir=args.cache_dir,
            workers=workers,
            quiet=args.json,
        )
    except ValueError as e:  # --workers, $MARIN_LOCAL_WORKERS, a path
        flag = "--workers: " if str(e).startswith("workers ") else ""
        print(f"marin datakit run: {flag}{e}", file=sys.stderr)
        return 2
    try:
        check_bucket(spec.prefix)  # first: a gs:// prefix with no bucket or credentials file fails slowly below
    except StoreUnusable as e:
        print(f"marin datakit run: {e}", file=sys.stderr)
        return 2
    try:
        check_run_inputs(spec)
        check_eval_sets(spec.evals)
    except (FileNotFoundError, ValueError) as e:
        print(f"marin datakit run: {e}", file=sys.stderr)
        return 1
    return run_driver(spec)
