"""The demo's sharded DataKit graph (group datakit_shards), after the data job.

The demo sources are split into shard partitions (shards/index registers them); every
per-shard step then fans out over local worker processes, one Dagster run per wave
(marin_assets/orchestration/waves.py). The UI shows each shard's partitions and lineage.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import dagster as dg

from marin_assets.orchestration.waves import materialize_waves

SHARD_GROUP = "datakit_shards"


def shard_graph_keys(defs: dg.Definitions) -> list[dg.AssetKey]:
    graph = defs.resolve_asset_graph()
    return sorted((k for k in graph.get_all_asset_keys() if graph.get(k).group_name == SHARD_GROUP), key=lambda k: k.to_user_string())


def run_shard_graph(defs: dg.Definitions, instance: dg.DagsterInstance, *, tags: Mapping[str, str],
                    log: Callable[[str], None] = print) -> dict:
    """Materialise every wave of the sharded graph (the partitions that are not up to date);
    {"success", "shards", "runs", "up_to_date_waves", "partitions", "cache_hits", "seconds"}."""
    started = time.monotonic()
    assets = [a for a in defs.assets or [] if isinstance(a, dg.AssetsDefinition)]
    lines: list[str] = []

    def note(line: str) -> None:
        lines.append(line)
        log(line)

    results = materialize_waves(assets, instance, defs.resources, selection=shard_graph_keys(defs), tags=tags, log=note)
    materializations = [e.materialization for r in results for e in r.get_asset_materialization_events()]
    hits = sum(1 for m in materializations if m.metadata.get("cache_hit") and m.metadata["cache_hit"].value)
    shards = instance.get_dynamic_partitions("datakit_shards")
    summary = {"success": all(r.success for r in results), "shards": len(shards), "runs": len(results),
               "up_to_date_waves": sum(line.endswith("no run") for line in lines),
               "partitions": len(materializations), "cache_hits": hits, "seconds": round(time.monotonic() - started, 1)}
    log(f"sharded graph: {summary['shards']} shards, {summary['partitions']} partitions materialised "
        f"({hits} cache hits) in {summary['runs']} run(s), {summary['up_to_date_waves']} wave(s) up to date, {summary['seconds']}s")
    return summary
