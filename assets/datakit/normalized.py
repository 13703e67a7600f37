"""Per-shard normalize, PII masking, and the language and quality attributes.

shards/normalized follows the sha256 of its own raw shard file, not the index's version:
a new shard re-versions the index but must not re-normalize the others. shards/pii is the
shard with e-mail addresses, phone numbers and IP addresses replaced (Dolma's rules), and
everything after reads it. shards/language and shards/quality write attributes and the
removal lists they imply (language: off the --languages keep-list; low_quality); quality
scores with the fixed `quality_model` asset (a model trained on every shard would
re-version every shard whenever one is added).
"""

from __future__ import annotations

import dagster as dg

from assets.datakit.common import per_shard, shard_file
from assets.datakit.configs import LanguageAssetConfig, QualityConfig, ShardNormalizeConfig
from assets.datakit.index import INDEX_KEY, index_entry
from marin_assets.datakit.language import LanguageConfig, identify_languages
from marin_assets.datakit.normalize import NormalizeConfig as LibNormalizeConfig
from marin_assets.datakit.normalize import normalize, schema
from marin_assets.datakit.pii import mask_shard
from marin_assets.datakit.quality import QualityScoreConfig, score_quality
from marin_assets.datakit.readers import ReaderConfig
from marin_assets.datakit.removals import flag_removals, removal_list_path
from marin_assets.datakit.shards import join, list_shards, shard_name, write_table
from marin_assets.datakit.web import HTML_SUFFIXES, WARC_SUFFIXES
from marin_assets.orchestration import StageContext, versioned_asset
from marin_assets.orchestration.knob_configs import library_config
from marin_assets.store import ArtifactRef

# One raw shard becomes one Parquet shard: its size is bounded by the index's shard_bytes.
ONE_PART = {"shard_docs": 2**31 - 1, "shard_bytes": 2**62}


def _raw_version(config, partition: str, inputs) -> dict[str, str]:
    """The raw shard's bytes, and for a shard of web pages the extractor that makes their text
    (it does not touch other formats, so choosing one leaves their versions as they were)."""
    entry = index_entry(inputs["index"], partition)
    web = entry["file"].lower().endswith(WARC_SUFFIXES + HTML_SUFFIXES)
    return {"raw": entry["sha256"], **({"extractor": config.extractor} if web else {})}


REMOVALS = "removals"  # where a per-shard attribute step keeps its removal list: removals/<shard>.jsonl


def attribute_removals(attributes: ArtifactRef) -> str:
    """The removal list a per-shard attribute step (shards/quality, shards/language) wrote."""
    if attributes.partition is None:
        raise ValueError(f"{attributes.asset_key} is per shard: its artifact must name its shard")
    return removal_list_path(join(attributes.data_path, REMOVALS), attributes.partition)


def _flag_attribute(ctx: StageContext, column: str, reason: str) -> str:
    """The removal list of this shard's rows whose attribute `column` is true (as `reason`), written
    where attribute_removals finds it; returns its digest."""
    attrs = join(ctx.out_dir, shard_name(0, 1))
    removals = removal_list_path(join(ctx.out_dir, REMOVALS), ctx.partition)
    return flag_removals(attrs, column, reason, ctx.partition, removals)["digest"]


def steps(shards: dg.DynamicPartitionsDefinition) -> list[dg.AssetsDefinition]:
    """shards/normalized and shards/quality over the shard partitions ``shards``."""

    @versioned_asset(
        key="shards/normalized",
        code_version="2",
        config_cls=ShardNormalizeConfig,
        ins={"index": INDEX_KEY},
        version_inputs=_raw_version,
        **per_shard(shards),
    )
    def shard_normalized(ctx: StageContext, config: ShardNormalizeConfig, index: ArtifactRef):
        """normalize() of one raw shard: one Parquet shard in line order, plus its quarantine."""
        entry = index_entry(index, ctx.partition)
        reader = library_config(config, ReaderConfig)
        counts = normalize([entry["file"]], ctx.out_dir, LibNormalizeConfig(source=entry["source"], reader=reader, **ONE_PART))
        if not list_shards(ctx.out_dir):  # every record quarantined: an empty shard keeps the graph uniform
            write_table(schema().empty_table(), join(ctx.out_dir, shard_name(0, 1)))
        return counts

    @versioned_asset(key="shards/pii", code_version="1", ins={"docs": "shards/normalized"}, **per_shard(shards))
    def shard_pii(ctx: StageContext, docs: ArtifactRef):
        """The shard with its PII masked (ids follow the masked text), and the count of each kind."""
        counts = mask_shard(shard_file(docs), join(ctx.out_dir, shard_name(0, 1)))
        return {**counts, "docs_in": docs.counts["docs_in"], "quarantined": docs.counts["quarantined"]}

    @versioned_asset(
        key="shards/language", code_version="1", config_cls=LanguageAssetConfig, ins={"docs": "shards/pii"}, **per_shard(shards)
    )
    def shard_language(ctx: StageContext, config: LanguageAssetConfig, docs: ArtifactRef):
        """Each document's language and its score (lingua), and the removal list of those off the
        keep-list."""
        counts = identify_languages([shard_file(docs)], ctx.out_dir, library_config(config, LanguageConfig))
        return {**counts, "language_digest": _flag_attribute(ctx, "off_language", "language")}

    @versioned_asset(
        key="shards/quality",
        code_version="1",
        config_cls=QualityConfig,
        ins={"docs": "shards/pii", "model": "quality_model"},
        **per_shard(shards),
    )
    def shard_quality(ctx: StageContext, config: QualityConfig, docs: ArtifactRef, model: ArtifactRef):
        """Quality attributes of one shard, and the low_quality removal list they imply."""
        # A graph without a model (`marin datakit run` at threshold 0) gives an empty model artifact.
        model_dir = model.data_path if model.files("quality_model.json") else None
        counts = score_quality([shard_file(docs)], model_dir, ctx.out_dir, library_config(config, QualityScoreConfig))
        return {**counts, "low_quality_digest": _flag_attribute(ctx, "low_quality", "low_quality")}

    return [shard_normalized, shard_pii, shard_language, shard_quality]
