"""Exact dedup over shards: map per shard, reduce per hash bucket, a removal list per shard,
and the first filter (low quality, off-language, exact duplicates).

Early cutoff twice: shards/exact_removals follows the digest of its shard's duplicate rows
in every bucket (each reduce writes one per shard), not the buckets' versions, and
shards/filtered_exact follows the DIGEST of its shard's removal list. A new shard reruns
every bucket reduce, but only the shards it shares documents with get a new list, and only
those whose removed rows changed recompute anything after it.
"""

from __future__ import annotations

import dagster as dg

from assets.datakit.common import (
    checked_accounting,
    every,
    per_shard,
    per_slice,
    record_reduce,
    reusable_reduce,
    roots,
    shard_file,
)
from assets.datakit.normalized import attribute_removals
from assets.partitions import EXACT_BUCKETS, exact_buckets, partition_index
from marin_assets.datakit.dedup_exact import ExactDedupConfig, duplicates_digest, exact_map, exact_reduce, exact_removals
from marin_assets.datakit.removals import apply_removals, removal_list_path
from marin_assets.datakit.shards import join, shard_name
from marin_assets.orchestration import StageContext, versioned_asset
from marin_assets.store import ArtifactRef

EXACT = ExactDedupConfig(num_buckets=EXACT_BUCKETS)  # one reduce partition per bucket


MARKS_FORMAT = 1  # bump when exact_reduce's marks change shape: older ones are then not reused


def exact_list(removals: ArtifactRef) -> str:
    if removals.partition is None:
        raise ValueError(f"{removals.asset_key} is per shard: its artifact must name its shard")
    return removal_list_path(removals.data_path, removals.partition)


def _removals_version(config, partition: str, inputs) -> dict[str, str]:
    """This shard's duplicate rows in every bucket, not every bucket's version: a new shard
    reruns every bucket, but only the shards whose documents it copies get a new list."""
    return {"duplicates": duplicates_digest(partition, roots(inputs["reduces"]))}


def _filtered_version(config, partition: str, inputs) -> dict[str, str]:
    return {
        "pii": inputs["docs"].version,
        "quality": inputs["quality"].version,
        "language": inputs["language"].counts["language_digest"],
        "exact_list": inputs["exact"].counts["digest"],
    }


def steps(shards: dg.DynamicPartitionsDefinition) -> list[dg.AssetsDefinition]:
    """The exact-dedup steps over the shard partitions ``shards`` (the reduce over hash buckets)."""

    @versioned_asset(key="shards/exact_map", code_version="1", ins={"docs": "shards/pii"}, **per_shard(shards))
    def shard_exact_map(ctx: StageContext, docs: ArtifactRef):
        """(id, source, source_id, row) of one shard, one row group per hash bucket."""
        return exact_map(ctx.partition, shard_file(docs), ctx.out_dir, EXACT)

    @versioned_asset(
        key="shards/exact_reduce", code_version="3", ins={"maps": every("shards/exact_map")}, **per_slice(exact_buckets)
    )
    def shard_exact_reduce(ctx: StageContext, maps: dict[str, ArtifactRef]):
        """One hash bucket of every shard's map: the copies of an id, the lowest one kept. After
        new shards it reads this bucket's earlier marks plus the new shards' maps only."""
        bucket = partition_index(ctx.partition, "bucket-", EXACT_BUCKETS)
        how = {"format": MARKS_FORMAT}
        reuse, reused = reusable_reduce(ctx, maps, how)
        new = roots({k: ref for k, ref in maps.items() if k not in reused})
        counts = exact_reduce(bucket, new, ctx.out_dir, EXACT, reuse=reuse)
        record_reduce(ctx, maps, how)
        return {**counts, "shards": len(maps), "shards_reused": len(reused)}

    @versioned_asset(
        key="shards/exact_removals",
        code_version="2",
        ins={"reduces": every("shards/exact_reduce")},
        version_inputs=_removals_version,
        **per_shard(shards),
    )
    def shard_exact_removals(ctx: StageContext, reduces: dict[str, ArtifactRef]):
        """This shard's exact-duplicate removal list (its row group of every bucket), with its digest."""
        return exact_removals(ctx.partition, roots(reduces), removal_list_path(ctx.out_dir, ctx.partition))

    @versioned_asset(
        key="shards/filtered_exact",
        code_version="1",
        ins={"docs": "shards/pii", "quality": "shards/quality", "language": "shards/language", "exact": "shards/exact_removals"},
        version_inputs=_filtered_version,
        **per_shard(shards),
    )
    def shard_filtered_exact(
        ctx: StageContext, docs: ArtifactRef, quality: ArtifactRef, language: ArtifactRef, exact: ArtifactRef
    ):
        """The shard minus its low-quality rows, rows off the language keep-list and exact duplicates
        (a row on several lists counts under the first: low_quality, language, exact_duplicate)."""
        lists = [attribute_removals(quality), attribute_removals(language), exact_list(exact)]
        counts = apply_removals(shard_file(docs), lists, join(ctx.out_dir, shard_name(0, 1)))
        summary = {
            "docs_in": docs.counts["docs_in"],
            "docs_out": counts["docs_out"],
            "removed": counts["removed"],
            "quarantined": docs.counts["quarantined"],
        }
        return checked_accounting(f"shards/filtered_exact[{ctx.partition}]", summary)

    return [shard_exact_map, shard_exact_reduce, shard_exact_removals, shard_filtered_exact]
