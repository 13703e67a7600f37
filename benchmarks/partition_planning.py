"""partition_planning: how Dagster handles 10,000 dynamic shard partitions (issue 12).

Definitions: a chain of three per-shard assets (normalized -> filtered -> tokenized, tagged
like the DataKit shard assets) over one DynamicPartitionsDefinition, with
BackfillPolicy.single_run() (local: one run covers the range) or multi_run(64) (cluster: a
run pod per 64 shards). Three figures per size, each the best of --repeats:

* ``partition_planning/add_dynamic_partitions``: ``instance.add_dynamic_partitions`` of all
  keys at once into a fresh SQLite instance (what ``shards/index`` does when it registers).
* ``partition_planning/load``: load the code location in process (import, Definitions, the
  workspace's RemoteWorkspaceAssetGraph, as the daemon and webserver build it) and read
  every partition key back from the instance (definitions hold no dynamic keys: reading
  them from the instance is what the daemon and UI pay per tick or page).
* ``partition_planning/plan_<policy>``: plan a materialisation of every partition of the
  chain: the asset backfill's target (AssetBackfillData over all partitions) and its first
  daemon iteration (``execute_asset_backfill_iteration_inner``, Dagster's side-effect-free
  planner) down to the run requests, each with its partition range. No run is created.

``ours`` is the time at --partitions (10,000); ``reference`` is the same operation at
--reference-partitions (1,000) scaled linearly: ratio = (partitions/reference) x t(ref) /
t(ours), so ratio > 1 means better than linear in the partition count, 1 exactly linear.

    python benchmarks/partition_planning.py [--partitions 10000] [--reference-partitions 1000]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import tempfile
import warnings

sys.path.insert(0, os.path.dirname(__file__))
from _common import emit, timed  # noqa: E402

warnings.filterwarnings("ignore", message=".*backfill_policy.*beta")  # a beta parameter; noise here

import dagster as dg  # noqa: E402
from dagster._core.asset_graph_view.asset_graph_view import AssetGraphView, TemporalContext  # noqa: E402
from dagster._core.execution.asset_backfill import (  # noqa: E402
    AssetBackfillData,
    execute_asset_backfill_iteration_inner,
)
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG  # noqa: E402
from dagster._core.test_utils import in_process_test_workspace  # noqa: E402
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin  # noqa: E402
from dagster._time import get_current_datetime  # noqa: E402

SHARDS = "bench_shards"
TAGS = {"marin/pool": "datakit", "marin/cpu": "1", "marin/memory": "2Gi"}
POLICIES = {"single_run": dg.BackfillPolicy.single_run(), "multi_run_64": dg.BackfillPolicy.multi_run(64)}
STEPS = ("normalized", "filtered", "tokenized")


def shard_keys(n: int) -> list[str]:
    return [f"web-{i:05d}" for i in range(n)]


def definitions(policy: dg.BackfillPolicy) -> dg.Definitions:
    shards = dg.DynamicPartitionsDefinition(name=SHARDS)
    assets, upstream = [], None
    for name in STEPS:
        deps = [dg.AssetKey(["shards", upstream])] if upstream else []

        @dg.asset(key=["shards", name], partitions_def=shards, backfill_policy=policy, tags=TAGS, deps=deps)
        def step(context) -> None:
            context.log.info(context.partition_key_range)

        assets.append(step)
        upstream = name
    return dg.Definitions(assets=assets)


# The code locations the benchmark loads (this file, by attribute), one per backfill policy.
defs_single_run = definitions(POLICIES["single_run"])
defs_multi_run_64 = definitions(POLICIES["multi_run_64"])


def load(stack, instance, policy_name: str):
    """Load the code location in process; return its asset graph and how many keys it reads."""
    origin = LoadableTargetOrigin(python_file=os.path.abspath(__file__), attribute=f"defs_{policy_name}")
    workspace = stack.enter_context(in_process_test_workspace(instance, origin))
    graph = workspace.asset_graph
    partitions_def = graph.get(dg.AssetKey(["shards", "normalized"])).partitions_def
    return graph, len(partitions_def.get_partition_keys(dynamic_partitions_store=instance))


def plan(instance, graph) -> list:
    """The run requests of the first backfill iteration over all partitions of the chain."""
    view = AssetGraphView(
        temporal_context=TemporalContext(effective_dt=get_current_datetime(), last_event_id=None),
        instance=instance,
        asset_graph=graph,
    )
    keys = [dg.AssetKey(["shards", name]) for name in STEPS]
    data = AssetBackfillData.from_asset_partitions(
        asset_graph=view.asset_graph,
        partition_names=None,
        asset_selection=keys,
        dynamic_partitions_store=instance,
        backfill_start_timestamp=0.0,
        all_partitions=True,
    )
    result = execute_asset_backfill_iteration_inner("bench", data, view, 0.0, logging.getLogger("plan"), None)
    return result.run_requests


def check_plan(requests, keys: list[str], per_run: int) -> None:
    """Every shard in exactly one run, each run for the whole chain and at most per_run shards."""
    covered = []
    for request in requests:
        start, end = request.tags[ASSET_PARTITION_RANGE_START_TAG], request.tags[ASSET_PARTITION_RANGE_END_TAG]
        span = keys[keys.index(start) : keys.index(end) + 1]
        if len(span) > per_run or len(request.asset_selection) != len(STEPS):
            raise SystemExit(f"plan: run {start}..{end} has {len(span)} shards, {len(request.asset_selection)} assets")
        covered += span
    if sorted(covered) != keys:
        raise SystemExit(f"plan: the runs cover {len(covered)} shard slots, expected each of {len(keys)} once")


def measure(n: int, repeats: int) -> dict[str, tuple[float, dict]]:
    keys = shard_keys(n)
    best: dict[str, tuple[float, dict]] = {}

    def keep(name: str, seconds: float, **info) -> None:
        if name not in best or seconds < best[name][0]:
            best[name] = (seconds, info)

    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as home:
            instance = dg.DagsterInstance.local_temp(home)
            seconds, _ = timed(lambda: instance.add_dynamic_partitions(SHARDS, keys))
            keep("add_dynamic_partitions", seconds)
            with contextlib.ExitStack() as stack:
                for policy_name in POLICIES:
                    seconds, (graph, loaded) = timed(lambda: load(stack, instance, policy_name))
                    if loaded != n:
                        raise SystemExit(f"load: read {loaded} partition keys, expected {n}")
                    if policy_name == "multi_run_64":
                        keep("load", seconds)
                    seconds, requests = timed(lambda: plan(instance, graph))
                    per_run = n if policy_name == "single_run" else 64
                    check_plan(requests, keys, per_run)
                    keep(f"plan_{policy_name}", seconds, runs=len(requests), max_partitions_per_run=per_run)
            instance.dispose()
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--reference-partitions", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="100 vs 50 partitions, one repeat: checks the script runs")
    args = parser.parse_args(argv)
    if args.quick:
        args.partitions, args.reference_partitions, args.repeats = 100, 50, 1
    if not 0 < args.reference_partitions < args.partitions:
        raise SystemExit("need 0 < --reference-partitions < --partitions")
    # Untimed warm-up: the first load imports this file as the code location and the first
    # instance warms SQLite; both sizes below then measure the same steady state.
    cold, _ = timed(lambda: measure(10, 1))
    scale = args.partitions / args.reference_partitions
    reference = measure(args.reference_partitions, args.repeats)
    ours = measure(args.partitions, args.repeats)
    for name, (seconds, info) in ours.items():
        ref_seconds, ref_info = reference[name]
        emit(
            f"partition_planning/{name}",
            "s",
            seconds,
            scale * ref_seconds,
            higher_is_better=False,
            partitions=args.partitions,
            reference_partitions=args.reference_partitions,
            reference_seconds=round(ref_seconds, 6),
            reference_is=f"{scale:g} x time at {args.reference_partitions}",
            warm_up_seconds=round(cold, 3),
            **info,
            **{f"reference_{k}": v for k, v in ref_info.items() if k == "runs"},
        )


if __name__ == "__main__":
    main()
