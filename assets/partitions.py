"""Partitions of the code location, in one module that assets, sensors and schedules import.

Sensors never import an asset module: what they share with the assets (a dynamic partition
set) lives here, and the asset itself is handed to the sensor factory in definitions.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import dagster as dg

from marin_assets.orchestration.checkpoint_assets import split_checkpoint_key
from marin_assets.phases.branches import is_branch_partition
from marin_assets.settings import setting

# One partition per phase of the demo run (train/demo, eval/demo); the phase controller adds them, and one per
# branch off the main run ("<phase>+<branch>", marin_assets/phases/branches.py).
demo_phases = dg.DynamicPartitionsDefinition(name="demo_phases")


class NewestMainPhase(dg.PartitionMapping):
    """Every downstream partition reads the newest phase of the main run: the last-added partition of a phase set
    that is not a branch (of a checkpoint set too: a checkpoint's key starts with its phase's, so the last-added
    main checkpoint is the newest main phase's final one). ``LastPartitionMapping`` reads the last-added partition
    of any kind, so a branch added after the main run's newest phase (an early cooldown off it) would silently
    become what is scored.

    With ``materialised`` (the upstream asset's key), the newest main phase *that asset has materialised*: the
    controller adds a phase's partition when it requests its run, so a phase the plan named but the run never
    reached (a failed or cancelled run) is passed over rather than read as missing.

    Dagster has no built-in mapping for this and calls one of ours unsupported: it works in runs and in-process
    planning (both call these methods), but the code location's snapshot leaves it out, so the UI and the
    automation daemon infer Dagster's default mapping for the dependency. Its users are scored on request, never
    by automation (tests/evaluation/test_eval_assets.py). Each method delegates to the built-in
    ``SpecificPartitionsPartitionMapping`` of the one key it picks, so no private Dagster name is needed."""

    def __init__(self, materialised: dg.AssetKey | None = None) -> None:
        self.materialised = materialised

    def _pick(self, upstream: dg.PartitionsDefinition, current_time, store) -> dg.SpecificPartitionsPartitionMapping:
        keys = upstream.get_partition_keys(current_time=current_time, dynamic_partitions_store=store)
        newest = newest_main_partition(keys, _instance_of(store), self.materialised)
        return dg.SpecificPartitionsPartitionMapping([newest] if newest is not None else [])

    def validate_partition_mapping(self, upstream_partitions_def, downstream_partitions_def) -> None:
        if not isinstance(upstream_partitions_def, dg.DynamicPartitionsDefinition):
            raise ValueError(
                f"NewestMainPhase maps from a phase set (a DynamicPartitionsDefinition), "
                f"got {type(upstream_partitions_def).__name__}"
            )

    def get_upstream_mapped_partitions_result_for_partitions(
        self,
        downstream_partitions_subset,
        downstream_partitions_def,
        upstream_partitions_def,
        current_time=None,
        dynamic_partitions_store=None,
    ):
        picked = self._pick(upstream_partitions_def, current_time, dynamic_partitions_store)
        return picked.get_upstream_mapped_partitions_result_for_partitions(
            downstream_partitions_subset,
            downstream_partitions_def,
            upstream_partitions_def,
            current_time,
            dynamic_partitions_store,
        )

    def get_downstream_partitions_for_partitions(
        self,
        upstream_partitions_subset,
        upstream_partitions_def,
        downstream_partitions_def,
        current_time=None,
        dynamic_partitions_store=None,
    ):
        picked = self._pick(upstream_partitions_def, current_time, dynamic_partitions_store)
        return picked.get_downstream_partitions_for_partitions(
            upstream_partitions_subset, upstream_partitions_def, downstream_partitions_def, current_time, dynamic_partitions_store
        )

    @property
    def description(self) -> str:
        return "Each downstream partition depends on the newest partition of the main run (not a branch) upstream."

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.materialised == self.materialised

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.materialised))


def _instance_of(store) -> dg.DagsterInstance | None:
    """The instance behind a dynamic-partitions store: the instance itself in a run, the instance of Dagster's
    caching queryer in planning; None for a store that is neither (then every added phase counts)."""
    instance = store if isinstance(store, dg.DagsterInstance) else getattr(store, "instance", None)
    return instance if isinstance(instance, dg.DagsterInstance) else None


def newest_main_partition(keys, instance: dg.DagsterInstance | None = None, materialised: dg.AssetKey | None = None):
    """The last of ``keys`` (a phase set, in the order added) that is no branch and, given an instance and an asset
    key, that the asset has materialised; None when there is none. Add order, not event order: an older phase
    materialised again later (a cache hit) does not become the newest."""
    for key in reversed(list(keys)):
        if is_branch_partition(key):
            continue
        if instance is None or materialised is None or newest_materialisation(instance, materialised, key) is not None:
            return key
    return None


def newest_materialisation(instance: dg.DagsterInstance, key: dg.AssetKey, partition: str) -> dg.AssetMaterialization | None:
    records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition]), limit=1)
    return records.records[0].asset_materialization if records.records else None


# One partition per committed checkpoint of the demo run ("<phase>.<step:09d>", orchestration/checkpoint_assets.py);
# train/demo adds them as its checkpoints commit.
CHECKPOINT_PARTITIONS = "demo_checkpoints"
demo_checkpoints = dg.DynamicPartitionsDefinition(name=CHECKPOINT_PARTITIONS)


class _PhaseCheckpoints(dg.PartitionMapping):
    """Between a phase set and its checkpoint set (keys "<phase>.<step>"), by the phase part of the key. Like
    NewestMainPhase it is ours, so the code location's snapshot leaves it out (the UI draws the asset edge and
    infers Dagster's default mapping); in runs and in-process planning it maps partition to partition."""

    checkpoints_upstream: bool  # which side the checkpoints are on

    def validate_partition_mapping(self, upstream_partitions_def, downstream_partitions_def) -> None:
        for side in (upstream_partitions_def, downstream_partitions_def):
            if not isinstance(side, dg.DynamicPartitionsDefinition):
                raise ValueError(f"{type(self).__name__} maps between dynamic partition sets, got {type(side).__name__}")

    def _map(self, keys, phases: set[str]) -> list[str]:
        """The keys (of the checkpoint side) that belong to ``phases``."""
        return [key for key in keys if split_checkpoint_key(key)[0] in phases]

    def get_upstream_mapped_partitions_result_for_partitions(
        self,
        downstream_partitions_subset,
        downstream_partitions_def,
        upstream_partitions_def,
        current_time=None,
        dynamic_partitions_store=None,
    ):
        asked = list(downstream_partitions_subset.get_partition_keys()) if downstream_partitions_subset is not None else []
        if self.checkpoints_upstream:
            keys = upstream_partitions_def.get_partition_keys(
                current_time=current_time, dynamic_partitions_store=dynamic_partitions_store
            )
            picked = self._pick(keys, set(asked))
        else:
            picked = sorted({split_checkpoint_key(key)[0] for key in asked})
        return dg.SpecificPartitionsPartitionMapping(picked).get_upstream_mapped_partitions_result_for_partitions(
            downstream_partitions_subset,
            downstream_partitions_def,
            upstream_partitions_def,
            current_time,
            dynamic_partitions_store,
        )

    def get_downstream_partitions_for_partitions(
        self,
        upstream_partitions_subset,
        upstream_partitions_def,
        downstream_partitions_def,
        current_time=None,
        dynamic_partitions_store=None,
    ):
        given = list(upstream_partitions_subset.get_partition_keys())
        existing = downstream_partitions_def.get_partition_keys(
            current_time=current_time, dynamic_partitions_store=dynamic_partitions_store
        )
        if self.checkpoints_upstream:
            all_checkpoints = upstream_partitions_def.get_partition_keys(
                current_time=current_time, dynamic_partitions_store=dynamic_partitions_store
            )
            finals = set(self._pick(all_checkpoints, {split_checkpoint_key(key)[0] for key in given})) & set(given)
            phases = {split_checkpoint_key(key)[0] for key in finals}  # only a phase's final checkpoint reaches it
            keys = [key for key in existing if key in phases]
        else:
            keys = self._map(existing, set(given))
        return downstream_partitions_def.empty_subset().with_partition_keys(keys)

    def _pick(self, checkpoints, phases: set[str]) -> list[str]:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self).__name__)


class FinalCheckpointOfPhase(_PhaseCheckpoints):
    """A phase partition (eval, export) reads its phase's final checkpoint: the highest step of that phase.
    Dagster's built-in mappings pair equal keys, the last key, or a fixed set; none maps "kestrel" to
    "kestrel.000000048"."""

    checkpoints_upstream = True

    def _pick(self, checkpoints, phases: set[str]) -> list[str]:
        finals: dict[str, tuple[int, str]] = {}
        for key in self._map(checkpoints, phases):
            phase, step = split_checkpoint_key(key)
            finals[phase] = max(finals.get(phase, (-1, "")), (step, key))
        return sorted(key for _, key in finals.values())

    @property
    def description(self) -> str:
        return "Each phase partition depends on its phase's final (highest-step) checkpoint partition."


class CheckpointsOfPhase(_PhaseCheckpoints):
    """A checkpoint partition comes from its phase's partition (the phase that wrote it)."""

    checkpoints_upstream = False

    @property
    def description(self) -> str:
        return "Each checkpoint partition <phase>.<step> depends on the partition of its phase."


# One partition per DataKit shard, keys "<source>-<file label>-<nnnnn>"; shards/index registers them.
datakit_shards = dg.DynamicPartitionsDefinition(name="datakit_shards")

# The exact-dedup shuffle: one reduce per hash bucket (ExactDedupConfig.num_buckets = their number).
EXACT_BUCKETS = 16
exact_buckets = dg.StaticPartitionsDefinition([f"bucket-{i:03d}" for i in range(EXACT_BUCKETS)])

# Fuzzy dedup: one candidate reduce per LSH band (FuzzyDedupConfig.bands); a band partition
# walks its key ranges one at a time, so its memory is one range's.
FUZZY_BANDS = 26
fuzzy_bands = dg.StaticPartitionsDefinition([f"band-{b:02d}" for b in range(FUZZY_BANDS)])

SHARDS_PER_RUN_ENV = "MARIN_SHARDS_PER_RUN"
_COUNT_RE = re.compile(r"[1-9][0-9]{0,5}")


def partition_index(key: str, prefix: str, count: int) -> int:
    """3 for ("bucket-003", "bucket-", 16): the number a static partition key stands for."""
    number = key[len(prefix) :] if key.startswith(prefix) else ""
    if not number.isdigit() or not 0 <= int(number) < count:
        raise ValueError(f"partition key {key!r} is not {prefix}<n> with n in [0, {count - 1}]")
    return int(number)


def shard_backfill_policy(env: Mapping[str, str] | None = None) -> dg.BackfillPolicy:
    """How a backfill of shard partitions becomes runs.

    Locally one run covers the whole range (its partitions computed by a pool of worker
    processes); on a cluster $MARIN_SHARDS_PER_RUN=N makes one run (one pod) per N shards.
    Read when the code location loads, like the training backend.
    """
    text = setting(SHARDS_PER_RUN_ENV, env)
    if text is None:
        return dg.BackfillPolicy.single_run()
    if not _COUNT_RE.fullmatch(text):
        raise ValueError(f"{SHARDS_PER_RUN_ENV}={text[:40]!r} is not a positive integer (at most 999999)")
    return dg.BackfillPolicy.multi_run(max_partitions_per_run=int(text))
