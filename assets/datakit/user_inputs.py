"""The DataKit graph over a user's files: what `marin datakit run` materialises.

make_datakit_graph over one `sources/<name>` asset per --input, plus the three fixed inputs
built from the run's flags, under their real keys:
- quality_model: the user's --quality-model (a model dir, or a fastText .bin scoring
  P(--quality-label)); or, with a threshold above 0 and no model, one trained on the demo's
  pinned sources (the code location's own asset, with its sources);
  or no model (threshold 0: nothing is filtered);
- eval_ngrams: the n-gram index of the --eval sets (empty without any: nothing matches);
- tokenizer: --tokenizer (default: OLMo's pinned BPE; see marin_assets/datakit/tokenize.py).
Each is content-versioned by what it reads (file bytes, not paths or times), so a rerun into
the same --prefix recomputes only what changed.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence

import dagster as dg

from assets.datakit import make_datakit_graph
from assets.datakit.datasets import contamination_check
from assets.datakit.inputs import (
    given_eval_ngrams,
    given_quality_model,
    labelled_quality_model,
    no_quality_model,
    tokenizer_asset,
)
from assets.datakit.sources import input_source, pinned_source
from marin_assets.datakit.run_spec import RunSpec, dataset_names
from marin_assets.datakit.sources import SOURCES


def quality_model_assets(spec: RunSpec) -> list[dg.AssetsDefinition]:
    if spec.quality_model is not None:
        return [given_quality_model(spec.quality_model, spec.quality_label)]
    if spec.quality.threshold > 0:
        sources = [pinned_source(name, spec.source_cache_dir) for name in SOURCES]
        return [*sources, labelled_quality_model({n: s.quality for n, s in SOURCES.items()})]
    return [no_quality_model()]


def shard_partitions(prefix: str) -> dg.DynamicPartitionsDefinition:
    """The run's own shard partitions, named after its prefix: a run recorded in an instance
    ($DAGSTER_HOME) never touches the code location's datakit_shards, nor another prefix's."""
    where = prefix if "://" in prefix else os.path.abspath(prefix)
    return dg.DynamicPartitionsDefinition(name=f"datakit_shards_{hashlib.sha256(where.encode()).hexdigest()[:12]}")


def user_graph(spec: RunSpec) -> tuple[list[dg.AssetsDefinition], list[dg.AssetChecksDefinition], dg.DynamicPartitionsDefinition]:
    """(assets, checks, shard partitions) of the run: one source per --input, the fixed inputs,
    the sharded graph over them."""
    names = dataset_names(spec.inputs)
    sources = [input_source(name, path, spec.reader.max_doc_bytes) for name, path in zip(names, spec.inputs)]
    fixed = [*quality_model_assets(spec), given_eval_ngrams(spec.evals, spec.decontam), tokenizer_asset(spec.tokenizer.tokenizer)]
    shards = shard_partitions(spec.prefix)
    graph = make_datakit_graph({name: f"sources/{name}" for name in names}, shards)
    checks = [contamination_check(name) for name in names] if spec.evals else []
    return [*sources, *fixed, *graph], checks, shards


def run_config(spec: RunSpec, assets: Sequence[dg.AssetsDefinition]) -> dict:
    """The run's knobs as the graph's asset config, by asset key (only what the flags set)."""
    by_key = {a.key.to_user_string(): a.op.name for a in assets}
    ops = {
        "shards/index": {"shard_bytes": spec.sharding.shard_bytes},
        "shards/normalized": {"max_doc_bytes": spec.reader.max_doc_bytes, "extractor": spec.reader.extractor},
        "shards/quality": {"threshold": spec.quality.threshold},
        "shards/language": {"languages": spec.language.languages},
        "shards/fuzzy_edges": {"jaccard_threshold": spec.fuzzy.jaccard_threshold},
        "shards/decontam": {"threshold": spec.decontam.threshold},
        "shards/tokenized": {
            "validation_fraction": spec.tokenize.validation_fraction,
            "min_validation_docs": spec.tokenize.min_validation_docs,
            "batch_docs": spec.tokenize.batch_docs,
        },
    }
    # --json: stderr carries the run's one-line error only, not Dagster's step tracebacks.
    level = "CRITICAL" if spec.quiet else "INFO"
    return {
        "ops": {by_key[k]: {"config": c} for k, c in ops.items() if k in by_key},
        "loggers": {"console": {"config": {"log_level": level}}},
    }


__all__ = ["run_config", "user_graph"]
