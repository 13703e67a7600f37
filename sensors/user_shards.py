"""Users' files into the sharded DataKit graph: new files -> shard partitions -> materialised.

Two steps, because the shard keys exist only once shards/index has split the files:

1. Files in $MARIN_USER_DATA_DIR new, changed or gone (cursor {file: sha256}): one run of
   the watched source (sources/user) + shards/index, whose on_ref registers the new
   datakit_shards keys. Its run_key is the directory digest and the number of the request,
   so a replayed tick requests nothing twice and a directory reverted to old content still
   reruns; its tag carries the digest.
2. On a later tick, once shards/index has a materialisation from the run of the digest
   last requested: one asset backfill of every step after the index over every registered
   partition. Dagster's backfill daemon runs it in waves (per-shard maps, then the bucket
   and band reduces, the removal lists, ...) with each asset's backfill policy; versioned
   assets make unchanged shards cache hits, so only new shards and the reduces compute.

While a step-1 run is pending nothing is backfilled (the index it reads is about to
change). Entries the scan skips (a symlink out of the directory, an unknown extension)
are logged and named in the skip reason.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import dagster as dg

from marin_assets.datakit.watched_dir import WATCH_ENV, directory_digest, scan
from marin_assets.orchestration.compat import AssetGraphSubset
from marin_assets.settings import setting

DIGEST_TAG = "marin/user_files_digest"  # the directory_digest a run or backfill is for
REQUEST_TAG = "marin/user_files_request"  # the run_key of the source + index run it follows


def _skipped_text(skipped: dict[str, str]) -> str:
    return "".join(f"; skipped {file}: {why}" for file, why in sorted(skipped.items()))


def every_partition(steps: Sequence[dg.AssetsDefinition], instance: dg.DagsterInstance) -> AssetGraphSubset:
    """Every registered partition of every step (unpartitioned steps whole): what a backfill covers."""
    partitioned, whole = {}, set()
    for asset in steps:
        definition = asset.partitions_def
        if definition is None:
            whole.add(asset.key)
            continue
        keys = definition.get_partition_keys(dynamic_partitions_store=instance)
        partitioned[asset.key] = definition.empty_subset().with_partition_keys(keys)
    return AssetGraphSubset(partitions_subsets_by_asset_key=partitioned, non_partitioned_asset_keys=whole)


def _index_run_of(instance: dg.DagsterInstance, index: dg.AssetKey, run_key: str) -> str | None:
    """The id of the run of `run_key` if it is the one that last materialised the index, else None."""
    event = instance.get_latest_materialization_event(index)
    run = instance.get_run_by_id(event.run_id) if event is not None else None
    return run.run_id if run is not None and run.tags.get(REQUEST_TAG) == run_key else None


def user_shards_sensor(
    source: dg.AssetsDefinition,
    index: dg.AssetsDefinition,
    steps: Sequence[dg.AssetsDefinition],
    *,
    name: str = "new_user_shards",
    watch_env: str = WATCH_ENV,
    minimum_interval_seconds: int = 30,
) -> dg.SensorDefinition:
    """The sensor of the module docstring: ``source`` takes {"directory", "expected"} config
    (user_inputs.watched_source_asset), ``index`` registers the shards, ``steps`` follow it."""
    source_op, what = source.op.name, f"{source.key.to_user_string()} + {index.key.to_user_string()}"

    def files_request(directory: str, usable: dict[str, str], state: dict) -> tuple[dg.RunRequest, dict]:
        digest, count = directory_digest(usable), state["requests"] + 1
        run_key = f"user-files-{count}@{digest[:16]}"  # the count: a directory reverted to old content reruns
        request = dg.RunRequest(
            run_key=run_key,
            asset_selection=[source.key, index.key],
            tags={DIGEST_TAG: digest, REQUEST_TAG: run_key},
            run_config={"ops": {source_op: {"config": {"directory": directory, "expected": digest}}}},
        )
        return request, {**state, "files": usable, "requests": count, "run_key": run_key, "digest": digest}

    @dg.sensor(
        name=name,
        asset_selection=[source, index, *steps],
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description=f"New files in ${watch_env} -> {what} (registers the shards), then a backfill of every shard step",
    )
    def _user_shards(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        directory = setting(watch_env)
        if not directory or not os.path.isdir(directory):
            return dg.SkipReason(f"set {watch_env} to a directory of .jsonl/.parquet/.txt files to watch (now {directory!r})")
        state = (
            json.loads(context.cursor)
            if context.cursor
            else {"files": {}, "requests": 0, "run_key": None, "digest": None, "backfilled": None}
        )
        usable, skipped = scan(directory)
        for file, why in skipped.items():
            context.log.warning(f"not ingesting {file}: {why}")
        if not usable:
            return dg.SkipReason(f"no usable files in {directory} (want .jsonl/.parquet/.txt){_skipped_text(skipped)}")
        if usable != state["files"]:
            request, state = files_request(directory, usable, state)
            context.log.info(f"{len(usable)} files in {directory}: requesting {what} ({request.run_key}){_skipped_text(skipped)}")
            return dg.SensorResult(run_requests=[request], cursor=json.dumps(state, sort_keys=True))
        run_key = state["run_key"]
        if state["backfilled"] == run_key:
            return dg.SkipReason(
                f"no new files in {directory} ({len(usable)} known); the shards of {run_key} are "
                f"requested{_skipped_text(skipped)}"
            )
        run_id = _index_run_of(context.instance, index.key, run_key)
        if run_id is None:  # pending, running or failed (rerun it from the UI): its index is about to change
            return dg.SkipReason(f"waiting for {what} of {run_key}{_skipped_text(skipped)}")
        subset = every_partition(steps, context.instance)
        context.log.info(
            f"{index.key.to_user_string()} of {run_key} done (run {run_id[:8]}): backfilling "
            f"{subset.num_partitions_and_non_partitioned_assets} partitions of {len(steps)} steps"
        )
        backfill = dg.RunRequest.for_asset_graph_subset(subset, tags={DIGEST_TAG: state["digest"], REQUEST_TAG: run_key})
        return dg.SensorResult(run_requests=[backfill], cursor=json.dumps({**state, "backfilled": run_key}, sort_keys=True))

    return _user_shards
