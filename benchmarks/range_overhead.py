"""Per-partition overhead of a versioned asset's range run vs one Dagster run per partition.

The body is trivial (one small file), so the figures are the orchestration's own cost:
planning the version, the store's lease/commit or cache check, the Dagster events, and for
the range path the pool's fork and pipe traffic.

    python benchmarks/range_overhead.py [--partitions 64] [--single 12] [--workers 2]

One JSON line per figure (ms per partition; ratio > 1: the range path is cheaper):
  range_overhead_computed   range run, every partition computed vs single runs computing
  range_overhead_cache_hit  range rerun (all cache hits) vs single runs that are cache hits
  range_overhead_computed_pool  the same range on --workers processes (forks + pipes)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import dagster as dg

sys.path.insert(0, os.path.dirname(__file__))
from _common import emit, timed  # noqa: E402

from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource, StageContext, versioned_asset  # noqa: E402
from marin_assets.orchestration.fanout import WORKERS_ENV  # noqa: E402
from marin_assets.orchestration.waves import RANGE_END_TAG, RANGE_START_TAG  # noqa: E402

SHARDS = dg.DynamicPartitionsDefinition(name="bench_shards")


@versioned_asset(key="bench/shard", code_version="1", partitions_def=SHARDS, backfill_policy=dg.BackfillPolicy.single_run())
def shard(ctx: StageContext):
    Path(ctx.out_dir, "x.txt").write_text(ctx.partition_key)
    return {"docs": 1}


def _setup(root: str, keys: list[str]):
    store = ArtifactStoreResource(prefix=root)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(SHARDS.name, keys)
    return {"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)}, instance


def _range(keys: list[str], resources, instance) -> None:
    tags = {RANGE_START_TAG: keys[0], RANGE_END_TAG: keys[-1]}
    assert dg.materialize([shard], resources=resources, instance=instance, tags=tags).success


def _singles(keys: list[str], resources, instance) -> None:
    for key in keys:
        assert dg.materialize([shard], partition_key=key, resources=resources, instance=instance).success


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--single", type=int, default=12, help="single-partition runs to time (each is a whole run)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    keys = [f"s{i:05d}" for i in range(args.partitions)]
    singles = keys[: args.single]
    with tempfile.TemporaryDirectory() as tmp:
        os.environ[WORKERS_ENV] = "1"
        resources, instance = _setup(os.path.join(tmp, "single"), keys)
        single_computed, _ = timed(lambda: _singles(singles, resources, instance))
        single_hit, _ = timed(lambda: _singles(singles, resources, instance))

        resources, instance = _setup(os.path.join(tmp, "range"), keys)
        range_computed, _ = timed(lambda: _range(keys, resources, instance))
        range_hit, _ = timed(lambda: _range(keys, resources, instance))

        os.environ[WORKERS_ENV] = str(args.workers)
        resources, instance = _setup(os.path.join(tmp, "pool"), keys)
        pool_computed, _ = timed(lambda: _range(keys, resources, instance))

    per = lambda seconds, n: 1000 * seconds / n  # noqa: E731
    common = {"partitions": args.partitions, "single_runs": len(singles)}
    emit(
        "range_overhead_computed",
        "ms/partition",
        per(range_computed, len(keys)),
        per(single_computed, len(singles)),
        False,
        **common,
    )
    emit("range_overhead_cache_hit", "ms/partition", per(range_hit, len(keys)), per(single_hit, len(singles)), False, **common)
    emit(
        "range_overhead_computed_pool",
        "ms/partition",
        per(pool_computed, len(keys)),
        per(single_computed, len(singles)),
        False,
        workers=args.workers,
        **common,
    )


if __name__ == "__main__":
    main()
