"""Fuzzy dedup over shards: MinHash band keys per shard, LSH candidates per band (its key
ranges one at a time), exact-Jaccard verification per shard, one resolve over the edges.

No step holds every signature: a band partition holds one key range of one band, a verify
partition one shard's pairs, and the resolve only the verified edges (one per near pair).
The resolve writes a removal list per shard; shards/final follows each list's digest.
"""

from __future__ import annotations

import dagster as dg

from assets.datakit.common import (
    GROUP,
    REDUCE_TAGS,
    every,
    per_shard,
    per_slice,
    record_reduce,
    reusable_reduce,
    roots,
    shard_file,
)
from assets.datakit.configs import CandidatesConfig, FuzzyConfig
from assets.partitions import FUZZY_BANDS, fuzzy_bands, partition_index
from marin_assets.datakit.fuzzy_candidates import candidate_digest
from marin_assets.datakit.fuzzy_dedup import (
    FuzzyDedupConfig,
    band_reduce_ranges,
    fuzzy_band_reduce,
    fuzzy_map,
    fuzzy_resolve,
    fuzzy_verify,
)
from marin_assets.datakit.removals import removal_list_digest, removal_list_path
from marin_assets.datakit.shards import join
from marin_assets.orchestration import StageContext, versioned_asset
from marin_assets.store import ArtifactRef

MINHASH = FuzzyDedupConfig()  # 286 permutations = 26 bands x 11 rows (one partition per band)
assert MINHASH.bands == FUZZY_BANDS, "fuzzy_bands partitions must match FuzzyDedupConfig.bands"
EDGES_FILE = "edges.parquet"


KEYS_FORMAT = 2  # bump when fuzzy_band_reduce's keys files change shape or place


def _edges_version(config, partition: str, inputs) -> dict[str, str]:
    """The pairs this shard owns and the documents they compare (the ids and shingle keys of
    its own and its partners', which sort before it): not every band's and shard's version. A new shard reruns every band, but
    a pair belongs to the shard of its later document, so a shard appended last owns every
    pair it brings and the old owners' digests stay as they were."""
    digest, partners = candidate_digest(partition, roots(inputs["candidates"]))
    named = sorted({partition, *partners})
    for name in ("docs", "maps"):
        missing = [k for k in named if k not in inputs[name]]
        if missing:
            raise ValueError(f"shards/fuzzy_edges[{partition}]: candidate pairs name shards with no {name}: {missing}")
    return {"candidates": digest, **{f"{name}[{k}]": inputs[name][k].version for name in ("docs", "maps") for k in named}}


def fuzzy_list(removals: ArtifactRef, shard: str) -> str:
    return removal_list_path(removals.data_path, shard)


def fuzzy_list_digest(removals: ArtifactRef, shard: str) -> str:
    """The digest of one shard's list (read from the list: the resolve's counts stay small)."""
    return removal_list_digest(fuzzy_list(removals, shard))


def steps(shards: dg.DynamicPartitionsDefinition) -> list[dg.AssetsDefinition]:
    """The fuzzy-dedup steps over the shard partitions ``shards`` (the reduce over LSH bands, one resolve)."""

    @versioned_asset(key="shards/fuzzy_map", code_version="2", ins={"docs": "shards/filtered_exact"}, **per_shard(shards))
    def shard_fuzzy_map(ctx: StageContext, docs: ArtifactRef):
        """MinHash band keys of one shard's documents, one sorted file per band, and their shingle keys."""
        return fuzzy_map(ctx.partition, shard_file(docs), ctx.out_dir, MINHASH)

    @versioned_asset(
        key="shards/fuzzy_candidates",
        code_version="5",
        config_cls=CandidatesConfig,
        ins={"maps": every("shards/fuzzy_map")},
        **per_slice(fuzzy_bands),
    )
    def shard_fuzzy_candidates(ctx: StageContext, config: CandidatesConfig, maps: dict[str, ArtifactRef]):
        """Candidate pairs of one LSH band across every shard, its key ranges one at a time."""
        band = partition_index(ctx.partition, "band-", FUZZY_BANDS)
        docs = sum(ref.counts["docs"] for ref in maps.values())
        ranges = band_reduce_ranges(docs, config.docs_per_reduce)
        how = {"format": KEYS_FORMAT, "ranges": ranges}
        reuse, reused = reusable_reduce(ctx, maps, how)  # shards only added: their keys are in our keys files
        new = roots({k: ref for k, ref in maps.items() if k not in reused})
        totals = {"keys": 0, "pairs": 0, "row_groups_read": 0}
        for r in range(ranges):
            counts = fuzzy_band_reduce(band, (r, ranges), new, ctx.out_dir, MINHASH, reuse=reuse)
            totals = {k: totals[k] + counts[k] for k in totals}
        record_reduce(ctx, maps, how)
        return {**totals, "ranges": ranges, "shards": len(maps), "shards_reused": len(reused), "docs": docs}

    @versioned_asset(
        key="shards/fuzzy_edges",
        code_version="4",
        config_cls=FuzzyConfig,
        ins={
            "candidates": every("shards/fuzzy_candidates"),
            "docs": every("shards/filtered_exact"),
            "maps": every("shards/fuzzy_map"),
        },
        version_inputs=_edges_version,
        **per_shard(shards),
    )
    def shard_fuzzy_edges(
        ctx: StageContext,
        config: FuzzyConfig,
        candidates: dict[str, ArtifactRef],
        docs: dict[str, ArtifactRef],
        maps: dict[str, ArtifactRef],
    ):
        """The candidate pairs this shard owns, kept where the exact Jaccard reaches the threshold
        and the pair is not already joined by the edges kept before it (a spanning forest)."""
        verify = FuzzyDedupConfig(jaccard_threshold=config.jaccard_threshold)
        shard_paths = {key: shard_file(ref) for key, ref in docs.items()}
        map_roots = {key: ref.data_path for key, ref in maps.items()}
        return fuzzy_verify(ctx.partition, roots(candidates), shard_paths, map_roots, join(ctx.out_dir, EDGES_FILE), verify)

    @versioned_asset(
        key="shards/fuzzy_removals",
        code_version="2",
        ins={"edges": every("shards/fuzzy_edges")},
        group_name=GROUP,
        tags=REDUCE_TAGS,
    )
    def shard_fuzzy_removals(ctx: StageContext, edges: dict[str, ArtifactRef]):
        """Connected components over every verified edge: one removal list per shard."""
        resolved = fuzzy_resolve({key: join(ref.data_path, EDGES_FILE) for key, ref in edges.items()}, ctx.out_dir)
        lists = resolved.pop("lists")
        return {**resolved, "shards": len(lists), "removed": sum(v["removed"] for v in lists.values())}

    return [shard_fuzzy_map, shard_fuzzy_candidates, shard_fuzzy_edges, shard_fuzzy_removals]
