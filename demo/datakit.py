"""The demo's DataKit: the whole `datakit` group, one Dagster run per wave.

The pinned sources, the fixed inputs and the shard index run first; the index registers the
shard partitions; every per-shard step then fans out over local worker processes; the bucket
and band reduces, the datasets (one per source, with their blocking contamination checks)
and the mixture follow (marin_assets/orchestration/waves.py). A wave whose partitions are all
up to date in the store starts no run. The UI shows each shard's partitions and lineage.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import dagster as dg

from marin_assets.orchestration.fanout import run_forked
from marin_assets.orchestration.waves import materialize_waves

DATAKIT_GROUP = "datakit"


def datakit_keys(defs: dg.Definitions) -> list[dg.AssetKey]:
    graph = defs.resolve_asset_graph()
    return sorted(
        (k for k in graph.get_all_asset_keys() if graph.get(k).group_name == DATAKIT_GROUP), key=lambda k: k.to_user_string()
    )


def run_datakit_in_child(defs: dg.Definitions, *, tags: Mapping[str, str], log: Callable[[str], None] = print) -> dict:
    """``run_datakit`` in a forked child with its own instance (from $DAGSTER_HOME): the datasets' steps
    write Levanter caches with tensorstore, which a later fork of this process could not use, and
    the scaling sweep forks its workers from here (run in this process, its runs went one at a time)."""

    def datakit() -> dict:
        with dg.DagsterInstance.get() as instance:
            return run_datakit(defs, instance, tags=tags, log=log)

    return run_forked(datakit, log)


def run_datakit(
    defs: dg.Definitions, instance: dg.DagsterInstance, *, tags: Mapping[str, str], log: Callable[[str], None] = print
) -> dict:
    """Materialise every wave of the DataKit (the partitions that are not up to date);
    {"success", "shards", "runs", "up_to_date_waves", "partitions", "cache_hits", "seconds", "datasets"}."""
    started = time.monotonic()
    assets = [a for a in defs.assets or [] if isinstance(a, dg.AssetsDefinition)] + list(defs.asset_checks or [])
    lines: list[str] = []

    def note(line: str) -> None:
        lines.append(line)
        log(line)

    results = materialize_waves(assets, instance, defs.resources or {}, selection=datakit_keys(defs), tags=tags, log=note)
    events = [e for r in results for e in r.get_asset_materialization_events()]
    hits = sum(1 for e in events if "cache_hit" in e.materialization.metadata and e.materialization.metadata["cache_hit"].value)
    datasets = {
        e.materialization.asset_key.path[-1]: e.materialization.metadata["count/train_tokens"].value
        for e in events
        if e.materialization.asset_key.path[0] == "datasets"
    }
    failed_checks = [
        f"{c.asset_key.to_user_string()}:{c.check_name}" for r in results for c in r.get_asset_check_evaluations() if not c.passed
    ]
    summary = {
        "success": all(r.success for r in results) and not failed_checks,
        "shards": len(instance.get_dynamic_partitions("datakit_shards")),
        "runs": len(results),
        "up_to_date_waves": sum(line.endswith("no run") for line in lines),
        "partitions": len(events),
        "cache_hits": hits,
        "datasets_train_tokens": datasets,
        "failed_checks": failed_checks,
        "seconds": round(time.monotonic() - started, 1),
    }
    log(
        f"DataKit: {summary['shards']} shards, {summary['partitions']} partitions materialised ({hits} cache hits) in "
        f"{summary['runs']} run(s), {summary['up_to_date_waves']} wave(s) up to date, {summary['seconds']}s"
        + (f"; FAILED checks {failed_checks}" if failed_checks else "")
    )
    return summary
