"""The sharded DataKit graph (issue 12): every stage per shard, the global steps as reduces
over hash buckets / LSH bands, per-shard removal lists whose digests version what follows.

shards/index -> normalized -> quality -> exact_map -> exact_reduce[bucket] -> exact_removals
-> filtered_exact -> fuzzy_map -> fuzzy_candidates[band] -> fuzzy_edges -> fuzzy_removals
-> (decontam) -> final -> tokenized. Keys carry the shards/ prefix: the unsharded graph
(demo, training) is untouched.
"""

from __future__ import annotations

from collections.abc import Mapping

import dagster as dg

from assets.shards.exact import shard_exact_map, shard_exact_reduce, shard_exact_removals, shard_filtered_exact
from assets.shards.final import shard_decontam, shard_final, shard_tokenized
from assets.shards.fuzzy import shard_fuzzy_candidates, shard_fuzzy_edges, shard_fuzzy_map, shard_fuzzy_removals
from assets.shards.index import make_index
from assets.shards.normalized import shard_normalized, shard_quality
from marin_assets.datakit.sources import SOURCES

# Everything after the index: the same for the demo sources and for any other corpus.
shard_steps = [shard_normalized, shard_quality, shard_exact_map, shard_exact_reduce, shard_exact_removals,
               shard_filtered_exact, shard_fuzzy_map, shard_fuzzy_candidates, shard_fuzzy_edges, shard_fuzzy_removals,
               shard_decontam, shard_final, shard_tokenized]


def make_shard_assets(sources: Mapping[str, str]) -> list[dg.AssetsDefinition]:
    """The whole sharded graph over `sources` ({source name: asset key of its raw files})."""
    return [make_index(sources), *shard_steps]


# The demo's sources and sources/user: the files of $MARIN_USER_DATA_DIR (empty when unset;
# assets/shards/user_inputs.watched_source_asset), which the new_user_shards sensor feeds.
shard_assets = make_shard_assets({**{name: f"sources/{name}" for name in SOURCES}, "user": "sources/user"})

__all__ = ["make_shard_assets", "shard_assets", "shard_steps"]
