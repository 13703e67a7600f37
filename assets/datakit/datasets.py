"""datasets/<source> (one source's shard caches, indexed) and mixture (weights over datasets).

    shards/tokenized[every shard] + shards/final + shards/index -> datasets/<source> -> mixture

A dataset is versioned by the versions of its own source's shards only (version_inputs),
so a file added to one source re-versions that dataset and no other; nothing is copied or
re-tokenized (the index names the shard caches in the store). Each dataset has a blocking
check: every document it trains on is re-scanned against the eval n-grams.

The mixture names, for every dataset, where its index is and what it holds, so the trainer,
the evals and the ladder read their data from it (the Dagster lineage of a training phase
runs mixture -> datasets -> shards/tokenized -> ... -> sources).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import dagster as dg

from assets.datakit.common import GROUP, every, shard_file
from assets.datakit.index import INDEX_KEY, index_sources
from marin_assets.datakit.datasets import INDEX_FILE, Dataset, ShardCache, combine, read_dataset, relative, write_dataset
from marin_assets.datakit.decontaminate import SCORE_BATCH_DOCS, DecontamConfig, EvalNgramIndex, leaked_tasks, score_texts
from marin_assets.datakit.mixture import MIXTURE_FILE, Mixture, read_mixture_file
from marin_assets.datakit.shards import join, read_table, write_json
from marin_assets.orchestration import ArtifactStoreResource, StageConfig, StageContext, versioned, versioned_asset
from marin_assets.orchestration.automation import rerun_on_change
from marin_assets.store import ArtifactRef, compute_version

MIXTURE_KEY = "mixture"


def dataset_key(source: str) -> str:
    return f"datasets/{source}"


def _source_keys(index: ArtifactRef, source: str) -> list[str]:
    return [key for key, owner in index_sources(index).items() if owner == source]


def dataset_asset(source: str) -> dg.AssetsDefinition:
    """datasets/<source>: the index of the source's shards/tokenized partitions (paths, token
    counts, in key order), versioned by theirs."""

    def _version(config, partition, inputs: Mapping) -> dict[str, str]:
        caches, keys = inputs["caches"], _source_keys(inputs["index"], source)
        missing = [k for k in keys if k not in caches]
        if missing:
            raise ValueError(f"{dataset_key(source)}: shards/tokenized has no partition {missing[0]!r} ({len(missing)} missing)")
        return {f"shards/tokenized[{k}]": caches[k].version for k in keys} or {"shards": "none"}

    @versioned_asset(
        key=dataset_key(source),
        code_version="1",
        group_name=GROUP,
        version_inputs=_version,
        ins={"caches": every("shards/tokenized"), "docs": every("shards/final"), "index": INDEX_KEY},
        automation_condition=rerun_on_change(),
        description=f"The {source} dataset: its shard caches, indexed in place (no copy, no re-tokenize).",
    )
    def _dataset(ctx: StageContext, caches: dict[str, ArtifactRef], docs: dict[str, ArtifactRef], index: ArtifactRef):
        shards = []
        for key in _source_keys(index, source):
            counts = caches[key].counts
            shards.append(
                ShardCache(
                    key,
                    caches[key].version,
                    caches[key].data_path,
                    counts["train_tokens"],
                    counts["validation_tokens"],
                    counts["train_docs"],
                    counts["validation_docs"],
                    documents=shard_file(docs[key]),
                )
            )
        tokenizers = {json.dumps(caches[s.key].counts["tokenizer"], sort_keys=True) for s in shards}
        if len(tokenizers) > 1:
            raise ValueError(f"{dataset_key(source)}: its shards were tokenized by {len(tokenizers)} tokenizers")
        dataset = Dataset(source, tuple(shards), json.loads(tokenizers.pop()) if tokenizers else {})
        write_dataset(dataset, ctx.out_dir)
        ctx.log(
            f"{dataset_key(source)}: {len(shards)} shards, {dataset.train_tokens:,} train and "
            f"{dataset.validation_tokens:,} validation tokens"
        )
        return {
            "shards": len(shards),
            "train_tokens": dataset.train_tokens,
            "validation_tokens": dataset.validation_tokens,
            "train_docs": sum(s.train_docs for s in shards),
            "validation_docs": sum(s.validation_docs for s in shards),
            "vocab_size": dataset.vocab_size or 0,
        }

    return _dataset


def contamination_check(source: str) -> dg.AssetChecksDefinition:
    """Blocking: re-scan every document datasets/<source> trains on against the eval n-grams
    (independently of shards/decontam); none may be contaminated. The scan is itself
    content-versioned, so re-checking unchanged data is a cache hit, not another pass."""

    @dg.asset_check(
        asset=dg.AssetKey(dataset_key(source).split("/")),
        name="no_contaminated_documents",
        blocking=True,
        additional_ins={"index": dg.AssetIn(key="eval_ngrams")},
    )
    def _check(artifact_store: ArtifactStoreResource, index: ArtifactRef) -> dg.AssetCheckResult:
        # The dataset just materialised, by its pointer (loading it as an input would need a
        # parameter named after the source, which need not be a Python identifier).
        ref = artifact_store.store.read_pointer(dataset_key(source), None)
        if ref is None:
            raise FileNotFoundError(f"{dataset_key(source)} has not been materialised")
        threshold = DecontamConfig().threshold
        key = f"checks/no_contaminated_documents/{source}"
        version = compute_version(
            key, "2", {"threshold": threshold}, None, {"dataset": ref.version, "eval_ngrams": index.version}
        )

        def scan(out_dir: str) -> dict:
            ngrams, bad, docs = EvalNgramIndex.load(index.data_path), [], 0
            for shard in read_dataset(ref.data_path).shards:
                table = read_table(shard.documents, columns=["id", "text"])
                docs += table.num_rows
                ids, texts = table.column("id").to_pylist(), table.column("text").to_pylist()
                for start in range(0, len(texts), SCORE_BATCH_DOCS):  # scored a batch at a time, as shards/decontam does
                    overlaps, matched = score_texts(ngrams, texts[start : start + SCORE_BATCH_DOCS])
                    for doc_id, overlap, evals in zip(ids[start:], overlaps, matched):
                        if overlap >= threshold:
                            bad.append(
                                {
                                    "shard": shard.key,
                                    "id": doc_id,
                                    "overlap": round(overlap, 3),
                                    "tasks": leaked_tasks(evals),
                                    "evals": evals[:3],
                                }
                            )
            write_json(bad, join(out_dir, "contaminated.json"))
            tasks = sorted({t for doc in bad for t in doc["tasks"]})
            return {"documents": docs, "contaminated": len(bad), "leaked_tasks": tasks, "examples": bad[:10]}

        counts = artifact_store.store.materialize(key, None, version, scan, {"checks": dataset_key(source)}).ref.counts
        leaked = counts["leaked_tasks"]
        description = (
            f"{counts['contaminated']} of {counts['documents']} documents contain eval items of: {', '.join(leaked)}"
            if leaked
            else f"none of {counts['documents']} documents contains an eval item"
        )
        return dg.AssetCheckResult(
            passed=counts["contaminated"] == 0,
            description=description,
            metadata={
                "documents": counts["documents"],
                "contaminated": counts["contaminated"],
                "leaked_tasks": dg.MetadataValue.json(leaked),
                "examples": dg.MetadataValue.json(counts["examples"]),
            },
        )

    return _check


class MixtureStageConfig(dg.Config):
    step: int = 0
    weights: dict[str, float]


def _stages_as_json(stages: list[dict]) -> str:
    """The schedule as JSON text (how it enters the version)."""
    return json.dumps([[s["step"], s["weights"]] for s in stages])


class MixtureConfig(StageConfig):
    schedule: list[MixtureStageConfig] = versioned(
        [{"step": 0, "weights": {"sotu": 0.5, "shakespeare": 0.3, "spam_assassin": 0.2}}],
        validate_default=True,
        description="weight stages by start step (datasets by source name); weights renormalised per stage",
    )

    version_as = {"schedule": _stages_as_json}


def mixture_asset(sources: Sequence[str]) -> dg.AssetsDefinition:
    """mixture: a weight schedule over datasets/<source>, with where each dataset's index is."""
    ins = {f"ds_{s}": dataset_key(s) for s in sources}

    @versioned_asset(
        key=MIXTURE_KEY,
        code_version="3",
        config_cls=MixtureConfig,
        ins=ins,
        group_name=GROUP,
        automation_condition=rerun_on_change(),
    )
    def _mixture(ctx: StageContext, config: MixtureConfig, **datasets: ArtifactRef):
        """The training data: a weight schedule over the datasets (each a source's shard caches)."""
        schedule = Mixture([(stage.step, dict(stage.weights)) for stage in config.schedule])
        by_source = {name.removeprefix("ds_"): ref for name, ref in datasets.items()}
        schedule.check_sources(list(by_source), where="mixture schedule")
        used = schedule.weighted
        empty = sorted(s for s in used if by_source[s].counts["train_tokens"] == 0)
        if empty:
            raise ValueError(f"mixture gives weight to {empty}, whose datasets hold no training tokens (no files yet?)")
        index = {s: join(ref.data_path, INDEX_FILE) for s, ref in sorted(by_source.items())}
        combine("mixture", [read_dataset(index[s]) for s in sorted(used)])  # one tokenizer, or a clear error
        spec = {
            "schedule": schedule.to_json(),
            "datasets": {
                s: {
                    "index": relative(path, ctx.out_dir),
                    "version": by_source[s].version,
                    **{k: by_source[s].counts[k] for k in ("train_tokens", "validation_tokens", "vocab_size")},
                }
                for s, path in index.items()
            },
        }
        write_json(spec, join(ctx.out_dir, MIXTURE_FILE))
        return {
            "sources": len(schedule.sources),
            "stages": len(config.schedule),
            "datasets": {s: {"version": d["version"], "train_tokens": d["train_tokens"]} for s, d in spec["datasets"].items()},
            "vocab_size": max((d["vocab_size"] for s, d in spec["datasets"].items() if s in used), default=0),
        }

    return _mixture


def dataset_versions(mixture: ArtifactRef, sources: Sequence[str]) -> dict[str, str]:
    """{"datasets/<source>": version} of ``sources`` as the mixture records them: what a consumer
    that reads only those datasets is versioned by (not the schedule, not the other datasets)."""
    datasets = mixture.counts["datasets"]
    missing = sorted(set(sources) - set(datasets))
    if missing:
        raise ValueError(f"no dataset for {missing} in the mixture (it has {sorted(datasets)})")
    return {dataset_key(s): datasets[s]["version"] for s in sorted(sources)}


def weighted_sources(mixture: ArtifactRef) -> list[str]:
    """The sources the mixture's schedule gives weight at some stage."""
    schedule, _ = read_mixture_file(mixture.data_path)
    return list(schedule.weighted)


def read_mixture(mixture: ArtifactRef) -> tuple[Mixture, dict[str, dict]]:
    """(schedule, {source: {"index": absolute dataset.json path, train_tokens, ...}}) of a mixture."""
    return read_mixture_file(mixture.data_path)
