"""A range run of a versioned asset: every partition of the range in one step.

A run over a range of partitions (``backfill_policy=BackfillPolicy.single_run()``) does for
every partition of the range what a single-partition run does: each gets the version a
single-partition run would give it (so the two share cache hits), its own artifact and
its own materialization event with its own metadata. Cache hits are answered here; the
partitions that are not cached are computed on local worker processes (fanout.py).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import dagster as dg

from marin_assets.orchestration.compat import merge_step_metadata
from marin_assets.orchestration.fanout import Failure, fan_out
from marin_assets.orchestration.inputs import Mode, partition_inputs
from marin_assets.orchestration.stage import Plan, Stage, is_number, rate_suffix, versioned_output
from marin_assets.store import ArtifactStore, Materialization, canonical_json, validate_asset_key

if TYPE_CHECKING:
    from marin_assets.orchestration.versioned import StageConfig

Result = tuple[Materialization, float]  # a partition's materialization and the seconds it took here
MAX_NAMED_FAILURES = 20  # partitions a range failure names one by one


def materialize_range(
    context: dg.AssetExecutionContext,
    store: ArtifactStore,
    stage: Stage,
    config: StageConfig | None,
    partitions: list[str],
    loaded: Mapping[str, Any],
    modes: Mapping[str, Mode],
    used_resources: Mapping[str, Any],
    local_workers: int,
) -> Iterator[dg.Output | dg.AssetMaterialization]:
    """Plan every partition here, answer cache hits here, compute the rest on a pool of at most
    ``local_workers`` processes; each partition gets its own materialization event and metadata.
    A generator: a range that fails part-way still yields the partitions it committed, then raises."""
    started = time.monotonic()
    plans = {p: _plan_partition(stage, config, p, loaded, modes, context) for p in partitions}
    results = _cache_hits(store, stage, plans)  # answered here: no worker for a cached partition
    todo = [p for p in partitions if p not in results]
    workers = min(local_workers, max(len(todo), 1))
    progress = _Progress(stage.asset_key, len(partitions), len(results), started, context.log.info)
    context.log.info(
        f"{stage.asset_key}: range of {len(partitions)} partitions ({partitions[0]} .. {partitions[-1]}): "
        f"{len(results)} cache hits, computing {len(todo)} on {workers} local worker(s)"
    )

    def task(partition: str, log: Callable[[str], None]) -> Result:
        t0 = time.monotonic()
        result = stage.materialize(store, plans[partition], config, used_resources, log, context, announce=False)
        return result, time.monotonic() - t0

    def on_done(partition: str, value: Result) -> None:
        results[partition] = value
        progress.done(value[0])

    failures = fan_out(task, todo, workers, context.log.info, on_done)
    committed = {p: results[p] for p in partitions if p in results}
    _add_partition_metadata(context, {p: stage.metadata(*result) for p, result in committed.items()})
    if failures:
        yield from _committed_events(store, stage, committed)
        raise _range_failure(stage.asset_key, len(partitions), len(results), failures)
    yield _range_output(partitions, results, progress.computed, workers, started)


def _range_output(partitions: list[str], results: Mapping[str, Result], computed: int, workers: int, started: float) -> dg.Output:
    """The step's one Output: {partition: ref}, with the range's summary as its metadata."""
    summary = {
        "range/partitions": len(partitions),
        "range/computed": computed,
        "range/cache_hits": len(partitions) - computed,
        "range/workers": workers,
        "range/duration_s": round(time.monotonic() - started, 3),
    }
    versions = {p: results[p][0].ref.version for p in partitions}
    # Dagster takes one data version per output; each partition's own is its `version` metadata.
    range_version = hashlib.sha256(canonical_json(versions).encode()).hexdigest()
    return versioned_output({p: results[p][0].ref for p in partitions}, range_version, summary)


def _plan_partition(
    stage: Stage,
    config: StageConfig | None,
    partition: str,
    loaded: Mapping[str, Any],
    modes: Mapping[str, Mode],
    context: dg.AssetExecutionContext,
) -> Plan:
    """One partition's inputs and version; an error names the partition (the range has many)."""
    try:
        return stage.plan(config, partition, partition_inputs(loaded, modes, partition, context, in_range=True))
    except Exception as err:
        raise ValueError(
            f"{stage.asset_key} partition {partition!r}: its version could not be planned: {type(err).__name__}: {err}"
        ) from err


def _cache_hits(store: ArtifactStore, stage: Stage, plans: Mapping[str, Plan]) -> dict[str, Result]:
    """The planned partitions whose version the store already holds, as cache-hit results."""
    hits = {}
    for partition, plan in plans.items():
        started = time.monotonic()
        ref = store.load(stage.asset_key, partition, plan.version)
        if ref is not None:
            elapsed = time.monotonic() - started
            hits[partition] = (Materialization(ref, True, elapsed), elapsed)
    return hits


def _add_partition_metadata(context: dg.AssetExecutionContext, metadata: Mapping[str, Mapping[str, Any]]) -> None:
    """Each partition's own metadata on its materialization event.

    ``context.add_asset_metadata(partition_key=...)`` is the public way, but each call lists
    the partitions definition's keys (a storage query for dynamic partitions) and copies the
    accumulated dict: quadratic in the range, minutes at 10,000 partitions. So the entries go
    into Dagster's accumulator in one update; the public call is the fallback."""
    if merge_step_metadata(context, metadata):
        return
    for partition, values in metadata.items():
        context.add_asset_metadata(values, partition_key=partition)


class _Progress:
    """'k/n partitions' lines with rates, at most every few seconds (ranges can be long), and
    the last; not one per partition (a log line is an event-log row, like a materialization)."""

    EVERY_S = 5.0

    def __init__(self, asset_key: str, total: int, hits: int, started: float, log: Callable[[str], None]):
        self.asset_key, self.total, self.finished, self.started, self.log = asset_key, total, hits, started, log
        self.computed = 0
        self.counts: dict[str, float] = {}
        self.last_logged = started

    def done(self, result: Materialization) -> None:
        """Count one finished partition (a computed one's counts too); log if it is time."""
        self.finished += 1
        if not result.cache_hit:  # another run committed it while we waited: a hit
            self.computed += 1
            for key, value in result.ref.counts.items():
                if is_number(value):
                    self.counts[key] = self.counts.get(key, 0) + value
        now = time.monotonic()
        if self.finished == self.total or now - self.last_logged >= self.EVERY_S:  # each partition has its event
            self.last_logged = now
            elapsed = max(now - self.started, 1e-9)
            self.log(
                f"{self.asset_key}: {self.finished}/{self.total} partitions done ({self.computed} computed) in "
                f"{elapsed:.1f}s, {self.computed / elapsed:.2f} partitions/s{rate_suffix(self.counts, elapsed, False)}"
            )


def _committed_events(store: ArtifactStore, stage: Stage, committed: Mapping[str, Result]) -> Iterator[dg.AssetMaterialization]:
    """A range that failed part-way: the committed partitions still become current (pointer
    and a materialization event), so Dagster and downstream runs see what exists."""
    asset = dg.AssetKey(list(validate_asset_key(stage.asset_key)))
    for p, (result, elapsed) in committed.items():
        store.write_pointer(result.ref)
        yield dg.AssetMaterialization(asset_key=asset, partition=p, metadata=stage.metadata(result, elapsed))


def _range_failure(asset_key: str, total: int, committed: int, failures: list[Failure]) -> RuntimeError:
    """One error naming the failed partitions (the first few, each with its message) and the
    first one's traceback, caused by the first failure's exception."""
    named = failures[:MAX_NAMED_FAILURES]
    names = ", ".join(repr(f.key) for f in named) + (" ..." if len(failures) > MAX_NAMED_FAILURES else "")
    lines = [
        f"{asset_key}: {len(failures)} of {total} partitions failed ({names}); {committed} committed "
        f"(a rerun recomputes only the missing ones)"
    ]
    lines += [f"  partition {f.key!r}: {f.message}" for f in named]
    if failures[0].detail:
        lines.append(f"first failure ({failures[0].key!r}):\n{failures[0].detail}")
    error = RuntimeError("\n".join(lines))
    error.__cause__ = failures[0].error
    return error
