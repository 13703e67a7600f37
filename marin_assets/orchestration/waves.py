"""Materialise a graph whose assets have different partitions, one Dagster run per wave.

A Dagster run covers a range of one partitions definition's keys; the sharded DataKit graph
has four (shards, hash buckets, LSH bands, none), so "materialise everything" is a sequence
of runs. On a cluster Dagster's asset backfill plans and launches them (its daemon starts a
wave's runs once their parents are done, one per N partitions under `multi_run`). Locally,
without a daemon, `materialize_waves` runs the same waves in this process, in order: each
wave is `dg.materialize` over the keys of one partitions definition, and a wave starts
only after every earlier wave succeeded. A wave runs only the partitions that are not up
to date in the artifact store (uptodate.py), so an increment starts runs over what changed
instead of logging a cache hit for every partition. It plans and sequences; the runs themselves,
their executors and the in-run fan-out over partitions are Dagster's and versioned_asset's.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dagster as dg

from marin_assets.orchestration.uptodate import stale_partitions
from marin_assets.orchestration.versioned import STORE_RESOURCE_KEY

RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
MAX_GAP = 32


@dataclass(frozen=True)
class Wave:
    """Assets that one run materialises: same partitions definition, parents all earlier."""

    keys: tuple[dg.AssetKey, ...]
    partitions_def: dg.PartitionsDefinition | None

    def label(self) -> str:
        names = ", ".join(k.to_user_string() for k in self.keys)
        return f"[{names}]" + (f" over {_def_name(self.partitions_def)}" if self.partitions_def else "")


def _def_name(partitions_def: dg.PartitionsDefinition) -> str:
    return getattr(partitions_def, "name", None) or type(partitions_def).__name__


def plan_waves(assets: Sequence[dg.AssetsDefinition], selection: Collection[dg.AssetKey] | None = None) -> list[Wave]:
    """The selected assets in runs: topological order, each run as large as it can be.

    A wave starts from the first ready asset (parents done; ties broken by key, so the plan
    is stable) and grows with every other asset of the same partitions definition whose
    parents are done or in the wave: same-partition chains share one run.
    """
    specs = {spec.key: (spec, a.partitions_def) for a in assets for spec in a.specs}
    targets = set(specs) if selection is None else set(selection)
    unknown = targets - set(specs)
    if unknown:
        raise ValueError(f"selection names assets that are not in the graph: {sorted(k.to_user_string() for k in unknown)}")
    parents = {k: {d.asset_key for d in specs[k][0].deps} & targets for k in targets}
    done: set[dg.AssetKey] = set()
    waves: list[Wave] = []
    while len(done) < len(targets):
        ready = sorted((k for k in targets - done if parents[k] <= done), key=lambda k: k.to_user_string())
        if not ready:
            raise ValueError(f"the selection has a dependency cycle among {sorted(k.to_user_string() for k in targets - done)}")
        partitions_def = specs[ready[0]][1]
        wave: list[dg.AssetKey] = []
        grew = True
        while grew:
            grew = False
            for k in sorted(targets - done - set(wave), key=lambda k: k.to_user_string()):
                if specs[k][1] == partitions_def and parents[k] <= done | set(wave):
                    wave.append(k)
                    grew = True
        waves.append(Wave(tuple(wave), partitions_def))
        done |= set(wave)
    return waves


def wave_partitions(wave: Wave, instance: dg.DagsterInstance) -> list[str | None]:
    """Every key of the wave's partitions, in Dagster's order ([None] for an unpartitioned wave)."""
    if wave.partitions_def is None:
        return [None]
    keys = wave.partitions_def.get_partition_keys(dynamic_partitions_store=instance)
    if not keys:
        raise ValueError(
            f"wave {wave.label()} has no partitions yet (nothing registered the keys of {_def_name(wave.partitions_def)})"
        )
    return list(keys)


def spans(keys: Sequence[str | None], todo: Collection[str | None], max_gap: int | None = None) -> list[tuple[str, str] | None]:
    """The (first, last) ranges of `keys` that cover `todo`, in order; [None] for an
    unpartitioned wave. Ranges closer than max_gap up-to-date keys merge into one run:
    a run costs about what the events of ~30 up-to-date partitions cost."""
    if keys == [None]:
        return [None] if todo else []
    named = [k for k in keys if k is not None]
    if len(named) != len(keys):
        raise ValueError("None is the one key of an unpartitioned wave, not a partition key")
    max_gap = MAX_GAP if max_gap is None else max_gap
    index = [i for i, k in enumerate(named) if k in todo]
    groups: list[list[int]] = []
    for i in index:
        if groups and i - groups[-1][1] - 1 <= max_gap:
            groups[-1][1] = i
        else:
            groups.append([i, i])
    return [(named[lo], named[hi]) for lo, hi in groups]


def materialize_waves(
    assets: Sequence[dg.AssetsDefinition],
    instance: dg.DagsterInstance,
    resources: Mapping[str, Any],
    selection: Collection[dg.AssetKey] | None = None,
    tags: Mapping[str, str] | None = None,
    log: Callable[[str], None] = print,
    run_config: Mapping[str, Any] | None = None,
    skip_up_to_date: bool = True,
) -> list[dg.ExecuteInProcessResult]:
    """Run every wave of `selection` in order; stop at the first failed run (its result last).

    Each wave runs over the partitions that are not up to date in the artifact store
    (uptodate.py; every partition with skip_up_to_date=False or without an artifact_store
    resource), one run per range of them; a wave with none starts no run.
    run_config: one for the whole graph; each wave's run gets its "ops" entries for the
    assets of that wave (Dagster rejects config for ops a run does not execute).
    """
    store_resource = resources.get(STORE_RESOURCE_KEY) if skip_up_to_date else None
    results = []
    waves = plan_waves(assets, selection)
    op_names = {spec.key: a.op.name for a in assets for spec in a.specs}
    for i, wave in enumerate(waves, 1):
        keys = wave_partitions(wave, instance)
        config = dict(run_config or {})
        if "ops" in config:
            wave_ops = {op_names[k] for k in wave.keys}
            config["ops"] = {op: c for op, c in config["ops"].items() if op in wave_ops}
        todo = (
            None if store_resource is None else stale_partitions(assets, wave.keys, keys, instance, store_resource.store, config)
        )
        todo = keys if todo is None else todo
        if not todo:
            log(f"wave {i}/{len(waves)}: {wave.label()}: all {len(keys)} partition(s) up to date, no run")
            continue
        for span in spans(keys, set(todo)):
            run_tags = {**(tags or {}), **({RANGE_START_TAG: span[0], RANGE_END_TAG: span[1]} if span else {})}
            where = f" ({span[0]} .. {span[1]})" if span else ""
            log(f"wave {i}/{len(waves)}: {wave.label()}{where}: {len(todo)} of {len(keys)} partition(s) to run")
            with _planned_events_per_range(instance):
                result = dg.materialize(
                    assets,
                    selection=list(wave.keys),
                    instance=instance,
                    resources=resources,
                    tags=run_tags,
                    raise_on_error=False,
                    run_config=config or None,
                )
            results.append(result)
            if not result.success:
                log(f"wave {i}/{len(waves)} failed (run {result.run_id}); later waves not started")
                return results
    return results


PLANNED_SUBSET_ENV = "DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS"


@contextlib.contextmanager
def _planned_events_per_range(instance: dg.DagsterInstance) -> Iterator[None]:
    """On an ephemeral instance, one ASSET_MATERIALIZATION_PLANNED event per asset and run
    instead of one per partition (Dagster's own switch, read when it creates the run).

    SQLite event storage writes each event in its own transaction, ~1 ms, and a range run
    writes the planned ones before any step starts: 688 for the 64-shard graph, ~0.7 s while
    the workers wait. Dagster's cost for the switch: a failed run's partitions are not marked
    failed in the event log, which only the UI reads, and nothing shows an ephemeral
    instance's (`marin datakit run`: the run result and the error say what failed). A
    persistent instance keeps one event per partition."""
    if not instance.is_ephemeral or PLANNED_SUBSET_ENV in os.environ:
        yield
        return
    # Dagster's event log storage reads this switch with os.getenv (no instance or run setting
    # carries it), so our environment, around the in-process run only, is the one way to set it.
    os.environ[PLANNED_SUBSET_ENV] = "true"
    try:
        yield
    finally:
        os.environ.pop(PLANNED_SUBSET_ENV, None)
