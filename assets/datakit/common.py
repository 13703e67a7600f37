"""What every asset of the DataKit graph shares: group, tags, partitions, helpers.

Per-shard assets carry the Kubernetes tags a pod is sized from (marin/cpu, marin/memory)
and the pool whose run-concurrency limit queues them (marin/pool), and the backfill
policy chosen at definitions load ($MARIN_SHARDS_PER_RUN, assets/partitions.py).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import dagster as dg

from assets.partitions import shard_backfill_policy
from marin_assets.datakit.shards import join, read_committed_json, write_json
from marin_assets.orchestration import StageContext
from marin_assets.store import ArtifactRef

GROUP = "datakit"
# The fleet's pool of CPU nodes for data work (examples/fleet.yaml): its marin/pool run limit
# (dagster.cluster.yaml) queues shard runs; the launcher refuses a pool the fleet lacks.
POOL = "cpu"
SHARD_TAGS = {"marin/pool": POOL, "marin/cpu": "1", "marin/memory": "2Gi"}
REDUCE_TAGS = {"marin/pool": POOL, "marin/cpu": "1", "marin/memory": "4Gi"}
ALL = dg.AllPartitionMapping()
# backfill_policy on an asset is "beta" in Dagster 1.13 (stable in practice, and what fan-out is).
warnings.filterwarnings("ignore", message="Parameter `backfill_policy`", category=dg.BetaWarning)


def per_shard(shards: dg.DynamicPartitionsDefinition, **kwargs) -> dict:
    """versioned_asset arguments of a per-shard asset (partitioned by the graph's ``shards``)."""
    return {
        "partitions_def": shards,
        "group_name": GROUP,
        "tags": SHARD_TAGS,
        "backfill_policy": shard_backfill_policy(),
        **kwargs,
    }


def per_slice(partitions_def: dg.PartitionsDefinition, **kwargs) -> dict:
    """versioned_asset arguments of a reduce over one bucket / band of every shard."""
    return {
        "partitions_def": partitions_def,
        "group_name": GROUP,
        "tags": REDUCE_TAGS,
        "backfill_policy": shard_backfill_policy(),
        **kwargs,
    }


def every(key: str) -> dg.AssetIn:
    """An input that reads every partition of `key` (a reduce's view of the map side)."""
    return dg.AssetIn(key=dg.AssetKey(key.split("/")), partition_mapping=ALL)


def shard_file(ref: ArtifactRef) -> str:
    """The one Parquet file of a per-shard artifact (from its manifest: no listing)."""
    files = ref.files(".parquet")
    if len(files) != 1:
        raise ValueError(f"{ref.asset_key}[{ref.partition}] should hold one Parquet shard, has {len(files)}")
    return files[0]


def roots(refs: Mapping[str, ArtifactRef]) -> list[str]:
    """The data directories of every partition of an upstream, in partition-key order."""
    return [refs[k].data_path for k in sorted(refs)]


def merge_counts(*dicts: Mapping[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in dicts:
        for reason, n in d.items():
            out[reason] = out.get(reason, 0) + n
    return dict(sorted(out.items()))


def checked_accounting(where: str, counts: dict) -> dict:
    """counts if docs_in = docs_out + removed (every reason) + quarantined, else an error."""
    if counts["docs_in"] != counts["docs_out"] + sum(counts["removed"].values()) + counts["quarantined"]:
        raise AssertionError(f"{where}: document accounting broken: {counts}")
    return counts


REDUCE_READ = "maps.json"  # {**how, "maps": {shard: version}}: what one reduce partition read


def reusable_reduce(ctx: StageContext, maps: Mapping[str, ArtifactRef], how: Mapping) -> tuple[str | None, set[str]]:
    """(data path, shards) of this reduce partition's current artifact when it was written
    the same way (`how`: output format, key ranges) and every shard it read is still here
    with the same map version (shards were only added), so its output can stand in for
    those shards' map files; else (None, empty). See exact_reduce / fuzzy_band_reduce `reuse`."""
    earlier = ctx.store.read_pointer(ctx.asset_key, ctx.partition_key)
    if earlier is None:
        return None, set()
    try:
        read = read_committed_json(join(earlier.data_path, REDUCE_READ))
    except FileNotFoundError:
        return None, set()
    if {k: v for k, v in read.items() if k != "maps"} != dict(how):
        return None, set()
    if any(k not in maps or maps[k].version != v for k, v in read["maps"].items()):
        return None, set()
    return earlier.data_path, set(read["maps"])


def record_reduce(ctx: StageContext, maps: Mapping[str, ArtifactRef], how: Mapping) -> None:
    """What reusable_reduce checks the next time: how this partition was written, from which maps."""
    write_json({**how, "maps": {k: ref.version for k, ref in sorted(maps.items())}}, join(ctx.out_dir, REDUCE_READ))
