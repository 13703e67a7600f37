"""Per-shard decontamination scan, final documents and tokenized caches.

shards/final follows {filtered_exact version, fuzzy list DIGEST, decontam version}, so a
resolve that reruns without changing this shard's list leaves final and tokenized cached.
shards/tokenized uses the pinned `tokenizer` asset (one trained on every shard would
re-version every shard whenever one is added), so a new shard never re-tokenizes another.
"""

from __future__ import annotations

import dagster as dg

from assets.datakit.common import checked_accounting, merge_counts, per_shard, shard_file
from assets.datakit.configs import DecontamAssetConfig, TokenizedConfig
from assets.datakit.fuzzy import fuzzy_list, fuzzy_list_digest
from marin_assets.datakit.decontaminate import DecontamConfig, EvalNgramIndex, decontaminate
from marin_assets.datakit.removals import apply_removals, flag_removals, removal_list_path
from marin_assets.datakit.shards import join, shard_name
from marin_assets.datakit.tokenize import TokenizeConfig, tokenize
from marin_assets.orchestration import StageContext, versioned_asset
from marin_assets.orchestration.knob_configs import library_config
from marin_assets.store import ArtifactRef


def _final_version(config, partition: str, inputs) -> dict[str, str]:
    return {
        "filtered_exact": inputs["docs"].version,
        "fuzzy_list": fuzzy_list_digest(inputs["fuzzy"], partition),
        "decontam": inputs["decon"].version,
    }


def steps(shards: dg.DynamicPartitionsDefinition) -> list[dg.AssetsDefinition]:
    """shards/decontam, shards/final and shards/tokenized over the shard partitions ``shards``."""

    @versioned_asset(
        key="shards/decontam",
        code_version="1",
        config_cls=DecontamAssetConfig,
        ins={"docs": "shards/filtered_exact", "index": "eval_ngrams"},
        **per_shard(shards),
    )
    def shard_decontam(ctx: StageContext, config: DecontamAssetConfig, docs: ArtifactRef, index: ArtifactRef):
        """Eval 13-gram overlap of every document of one shard, and the contaminated removal list."""
        counts = decontaminate(
            [shard_file(docs)], EvalNgramIndex.load(index.data_path), ctx.out_dir, library_config(config, DecontamConfig)
        )
        flagged = flag_removals(
            join(ctx.out_dir, shard_name(0, 1)),
            "contaminated",
            "contaminated",
            ctx.partition,
            removal_list_path(join(ctx.out_dir, "removals"), ctx.partition),
        )
        return {**counts, "digest": flagged["digest"]}

    @versioned_asset(
        key="shards/final",
        code_version="1",
        ins={"docs": "shards/filtered_exact", "fuzzy": "shards/fuzzy_removals", "decon": "shards/decontam"},
        version_inputs=_final_version,
        **per_shard(shards),
    )
    def shard_final(ctx: StageContext, docs: ArtifactRef, fuzzy: ArtifactRef, decon: ArtifactRef):
        """What goes to tokenization, with this shard's whole accounting:
        docs_in = docs_out + removed (per reason) + quarantined."""
        key = ctx.partition
        contaminated = removal_list_path(join(decon.data_path, "removals"), key)
        counts = apply_removals(shard_file(docs), [fuzzy_list(fuzzy, key), contaminated], join(ctx.out_dir, shard_name(0, 1)))
        summary = {
            "docs_in": docs.counts["docs_in"],
            "docs_out": counts["docs_out"],
            "removed": merge_counts(docs.counts["removed"], counts["removed"]),
            "quarantined": docs.counts["quarantined"],
        }
        return checked_accounting(f"shards/final[{key}]", summary)

    @versioned_asset(
        key="shards/tokenized",
        code_version="2",
        config_cls=TokenizedConfig,
        ins={"docs": "shards/final", "tok": "tokenizer"},
        **per_shard(shards),
    )
    def shard_tokenized(ctx: StageContext, config: TokenizedConfig, docs: ArtifactRef, tok: ArtifactRef):
        """One Levanter cache per shard: {train, validation}, the held-out documents' text, token stats."""

        stats = tokenize(
            [shard_file(docs)], join(tok.data_path, "tokenizer.json"), ctx.out_dir, library_config(config, TokenizeConfig)
        )
        return {
            "docs": sum(stats[s]["documents"] for s in ("train", "validation")),
            "train_docs": stats["train"]["documents"],
            "validation_docs": stats["validation"]["documents"],
            "train_tokens": stats["train"]["tokens"],
            "validation_tokens": stats["validation"]["tokens"],
            "tokenizer": stats["tokenizer"],
        }

    return [shard_decontam, shard_final, shard_tokenized]
