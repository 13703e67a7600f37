"""A tiny sharded code location for tests/cluster/test_shard_fanout.py (loaded by path).

Two chains of three per-shard assets over one dynamic shard partition set, tagged like the
DataKit shard assets (pool, CPU, memory). ``fan1/*`` backfills one shard per run,
``fan8/*`` eight shards per run (BackfillPolicy.multi_run); ``mixed/*`` is a tagging mistake.
The bodies never run here: the
Kubernetes API is a fake that only records the Jobs.
"""

import dagster as dg

SHARDS = dg.DynamicPartitionsDefinition(name="fanout_shards")
POOL = "datakit"
# The chain's largest asks (2 CPUs, 3Gi) size its run pod: one pod runs all three steps.
TAGS = {
    "normalized": {"marin/pool": POOL, "marin/cpu": "1", "marin/memory": "2Gi"},
    "filtered": {"marin/pool": POOL, "marin/cpu": "2", "marin/memory": "1Gi"},
    "tokenized": {"marin/pool": POOL, "marin/cpu": "500m", "marin/memory": "3Gi"},
}


# A mistake: two assets of one run in different pools (the run cannot sit in both queues).
MIXED_TAGS = {"normalized": {"marin/pool": POOL}, "filtered": {"marin/pool": "other"}}


def chain(prefix: str, shards_per_run: int, tags_by_step=TAGS) -> list[dg.AssetsDefinition]:
    policy = dg.BackfillPolicy.multi_run(max_partitions_per_run=shards_per_run)
    assets, upstream = [], None
    for name, tags in tags_by_step.items():
        deps = [dg.AssetKey([prefix, upstream])] if upstream else []

        @dg.asset(key=[prefix, name], partitions_def=SHARDS, backfill_policy=policy, tags=tags, deps=deps)
        def shard_step(context: dg.AssetExecutionContext) -> None:
            context.log.info(f"shard {context.partition_key}")

        assets.append(shard_step)
        upstream = name
    return assets


defs = dg.Definitions(assets=[*chain("fan1", 1), *chain("fan8", 8), *chain("mixed", 64, MIXED_TAGS)])
