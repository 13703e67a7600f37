"""Which partitions a step covers, and how each loaded input is split over them.

A range run loads every input once for the whole range; each partition's body then gets
the part its partition mapping names: identity -> that partition's ref, All -> every ref,
another mapping (static, time window, ...) -> the upstream keys Dagster maps it to.
uptodate.py plans with the same modes outside a run.
"""

from __future__ import annotations

import enum
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import dagster as dg


class InputMode(enum.Enum):
    """How an input is split over a step's partitions (`Mapped` carries any other mapping)."""

    WHOLE = "whole"  # every partition gets the whole input: an unpartitioned upstream, or an All mapping
    IDENTITY = "identity"  # each partition gets the upstream partition of the same key


@dataclass(frozen=True)
class Mapped:
    """An input under another partition mapping (static, time window, ...): each partition
    gets the upstream keys Dagster maps it to."""

    mapping: dg.PartitionMapping
    partitions_def: dg.PartitionsDefinition
    upstream_partitions_def: dg.PartitionsDefinition


Mode = InputMode | Mapped


def step_partitions(context: dg.AssetExecutionContext) -> list[str]:
    """[] unpartitioned, [key] for one partition, the range's keys (in order) for a range run."""
    if context.assets_def.partitions_def is None:
        return []
    if context.has_partition_key_range:
        return list(context.partition_keys)
    return [context.partition_key] if context.has_partition_key else []


def loaded_input_mode(context: dg.AssetExecutionContext, upstream_key: dg.AssetKey, value: Any) -> Mode:
    """How a loaded input is split over the step's partitions, from the asset's partition
    mapping (never from the keys loaded: an All mapping over the same partitions loads the
    same keys as a range run's identity input when the range covers every partition)."""
    if not isinstance(value, Mapping):
        return InputMode.WHOLE  # an unpartitioned upstream (one ref)
    return input_mode(context.assets_def, upstream_key, context.job_def.asset_layer.get(upstream_key).partitions_def)


def input_mode(assets_def: dg.AssetsDefinition, upstream_key: dg.AssetKey, upstream_def: dg.PartitionsDefinition | None) -> Mode:
    """How `assets_def` maps the partitions of `upstream_key` (also what uptodate.py plans
    with, outside a run)."""
    if assets_def.partitions_def is None or upstream_def is None:
        return InputMode.WHOLE  # an unpartitioned asset, or an unpartitioned upstream
    explicit = assets_def.get_partition_mapping(upstream_key)
    if isinstance(explicit, dg.AllPartitionMapping):
        return InputMode.WHOLE
    mapping = assets_def.infer_partition_mapping(assets_def.key, upstream_key, upstream_def)
    if isinstance(mapping, dg.AllPartitionMapping):
        return InputMode.WHOLE
    if isinstance(mapping, dg.IdentityPartitionMapping):
        return InputMode.IDENTITY
    return Mapped(mapping, assets_def.partitions_def, upstream_def)


def mapped_keys(mode: Mapped, partition: str, instance: dg.DagsterInstance) -> list[str]:
    """The upstream keys Dagster maps `partition` to under `mode`'s mapping."""
    subset = mode.partitions_def.subset_with_partition_keys([partition])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mapped = mode.mapping.get_upstream_mapped_partitions_result_for_partitions(
            subset, mode.partitions_def, mode.upstream_partitions_def, dynamic_partitions_store=instance
        )
    return list(mapped.partitions_subset.get_partition_keys())


def partition_inputs(
    loaded: Mapping[str, Any], modes: Mapping[str, Mode], partition: str | None, context: dg.AssetExecutionContext, in_range: bool
) -> dict[str, Any]:
    """{input name: what `partition`'s body sees} for every loaded input (see partition_input)."""
    return {name: partition_input(value, modes[name], partition, context, in_range) for name, value in loaded.items()}


def partition_input(value: Any, mode: Mode, partition: str | None, context: dg.AssetExecutionContext, in_range: bool) -> Any:
    """The input one partition's body sees: the single ref of a co-partitioned input, the
    whole {key: ref} of an All-mapped one, the mapped keys under another mapping."""
    if mode is InputMode.WHOLE or partition is None:
        return value
    if mode is InputMode.IDENTITY:
        if partition not in value:
            raise KeyError(f"partition {partition!r} of an identity-mapped input was not loaded (got {sorted(value)[:5]})")
        return value[partition]
    if not in_range:
        return value  # Dagster loaded exactly this partition's mapped keys
    return {key: value[key] for key in mapped_keys(mode, partition, context.instance)}
