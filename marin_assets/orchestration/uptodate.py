"""Which partitions of a wave are already up to date in the artifact store.

A partition of a versioned asset is up to date when the version its inputs plan today is
the version its store pointer names: a run would find it a cache hit and change nothing.
`materialize_waves` starts runs over the other partitions only, so adding one shard to a
graph of 10,000 runs that shard and the reduces, not 10,000 cache hits, each of which is a
materialization event in Dagster's log (about 5 ms in memory, 40 ms in SQLite) and in
the UI's history.

The version is planned exactly as the run plans it (stage.py's Stage.plan on the refs
the IO manager would load), so "up to date" here and "cache hit" in the run cannot
disagree. Anything that cannot be planned (an asset that is not a versioned_asset, one
with on_ref, config that does not validate, a missing upstream pointer, a version_inputs
that raises) counts as not up to date: the run then reports it properly. Nor is a current
version whose files no longer match its manifest (ArtifactStore.damage): its run recomputes it.

What Dagster is told: a persistent instance skips a partition only if it has already
recorded a materialization of it, so its UI never shows as missing what the store holds;
an ephemeral instance (`marin datakit run`) is discarded with its events, so there the
store alone decides.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg

from marin_assets.orchestration.inputs import InputMode, input_mode, mapped_keys
from marin_assets.orchestration.versioned import Planner, planner_of
from marin_assets.store import ArtifactRef, ArtifactStore


class _Pointers:
    """store.read_pointer, each (asset, partition) read once per wave plan."""

    def __init__(self, store: ArtifactStore):
        self.store, self.seen = store, {}

    def __call__(self, key: dg.AssetKey, partition: str | None) -> ArtifactRef | None:
        at = (key, partition)
        if at not in self.seen:
            self.seen[at] = self.store.read_pointer("/".join(key.path), partition)
        return self.seen[at]


def stale_partitions(
    assets: Sequence[dg.AssetsDefinition],
    wave_keys: Sequence[dg.AssetKey],
    partitions: Sequence[str | None],
    instance: dg.DagsterInstance,
    store: ArtifactStore,
    run_config: Mapping[str, Any] | None = None,
) -> list[str | None] | None:
    """The partitions (in the order given) a run of `wave_keys` must cover, or None when the
    wave cannot be planned here (then every partition runs). `wave_keys` in topological
    order; `partitions` are the wave's keys ([None] for an unpartitioned wave)."""
    by_key = {k: a for a in assets for k in a.keys}
    defs = {k: a.partitions_def for a in assets for k in a.keys}
    pointers = _Pointers(store)
    stale: set[str | None] = set()
    for key in wave_keys:
        assets_def = by_key[key]
        planner = planner_of(assets_def)
        if planner is None or not planner.skippable:
            return None
        config = _config(planner, assets_def, run_config)
        if config is _INVALID:
            return None
        recorded = _recorded(instance, key, assets_def.partitions_def is not None)
        modes = {name: input_mode(assets_def, up, defs.get(up)) for name, up in planner.in_keys.items()}
        every_key = {
            name: list(up_def.get_partition_keys(dynamic_partitions_store=instance))  # one listing, not one per partition
            for name, up in planner.in_keys.items()
            if (up_def := defs.get(up)) is not None and modes[name] == InputMode.WHOLE
        }
        for partition in partitions:
            if partition in stale:
                continue  # the run covers it for every asset of the wave anyway
            if recorded is not None and partition not in recorded:
                stale.add(partition)
                continue
            inputs = _inputs(planner, modes, every_key, defs, partition, pointers, instance)
            pointer = pointers(key, partition)
            # a current version whose files no longer match its manifest is recomputed (store.load refuses it too)
            outdated = inputs is None or not _current(planner, config, partition, inputs, pointer)
            if outdated or (pointer is not None and store.damage(pointer) is not None):
                stale.add(partition)
    return [p for p in partitions if p in stale]


_INVALID = object()


def _config(planner: Planner, assets_def: dg.AssetsDefinition, run_config: Mapping[str, Any] | None) -> Any:
    if planner.config_cls is None:
        return None
    values = ((run_config or {}).get("ops", {}).get(assets_def.op.name) or {}).get("config") or {}
    try:
        return planner.config_cls(**values)
    except Exception:  # the run reports the invalid config
        return _INVALID


def _recorded(instance: dg.DagsterInstance, key: dg.AssetKey, partitioned: bool) -> set[str | None] | None:
    """The partitions a persistent instance has materialised; None (no constraint) when ephemeral."""
    if instance.is_ephemeral:
        return None
    if partitioned:
        return set(instance.get_materialized_partitions(key))
    return {None} if instance.get_latest_materialization_event(key) is not None else set()


def _inputs(
    planner: Planner,
    modes: Mapping[str, Any],
    every_key: Mapping[str, list[str]],
    defs: Mapping[dg.AssetKey, Any],
    partition: str | None,
    pointers: _Pointers,
    instance: dg.DagsterInstance,
) -> dict[str, Any] | None:
    """What the body of `partition` would get, from the store pointers; None if one is missing."""
    inputs: dict[str, Any] = {}
    for name, up in planner.in_keys.items():
        upstream_def, mode = defs.get(up), modes[name]
        if upstream_def is None:
            keys: Sequence[str | None] = [None]
        elif mode == InputMode.IDENTITY:
            keys = [partition]
        elif mode == InputMode.WHOLE:
            keys = every_key[name]
        elif partition is None:  # input_mode gives an unpartitioned asset's inputs WHOLE
            raise ValueError(f"input {name} of an unpartitioned asset is partition-mapped")
        else:
            keys = mapped_keys(mode, partition, instance)
        refs = {k: pointers(up, k) for k in keys}
        if any(ref is None for ref in refs.values()):
            return None
        inputs[name] = refs[None] if upstream_def is None else refs[partition] if mode == InputMode.IDENTITY else refs
    return inputs


def _current(
    planner: Planner, config: Any, partition: str | None, inputs: Mapping[str, Any], pointer: ArtifactRef | None
) -> bool:
    if pointer is None:
        return False
    try:
        return planner.stage.plan(config, partition, inputs).version == pointer.version
    except Exception:  # e.g. a version_inputs that cannot read what it digests: the run reports it
        return False
