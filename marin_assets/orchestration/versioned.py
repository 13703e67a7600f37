"""Turn a library function into a content-versioned Dagster asset.

    @versioned_asset(key="datakit/normalized", code_version="1", ins={"raw": "sources/sotu"})
    def normalized(ctx: StageContext, config: NormalizeConfig, raw: ArtifactRef) -> dict:
        return normalize(raw.files(".jsonl"), ctx.out_dir, config.to_library())

The wrapper computes the version from {asset key, code_version, versioned config fields,
partition, upstream versions}; on a version that already has SUCCESS the body does not
run and the same ``DataVersion`` is reported with ``cache_hit=true``. Otherwise the body
writes into a staging URL that the store commits atomically.

A run over a range of partitions (``backfill_policy=BackfillPolicy.single_run()``) is one
step that does the same for every partition of the range: each gets the version a
single-partition run would give it (so the two share cache hits), its own artifact and
its own materialization event with its own metadata; the partitions that are not cached
are computed on local worker processes (fanout.py). Inputs are split per partition by the
asset's partition mappings: identity -> that partition's ref, All -> every ref.
"""

from __future__ import annotations

import hashlib
import inspect
import time
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import dagster as dg
from pydantic import Field

from marin_assets.store import ArtifactRef, ArtifactStore, Materialization, canonical_json, validate_asset_key
from marin_assets.orchestration.resources import ArtifactStoreResource

STORE_RESOURCE_KEY = "artifact_store"
IO_MANAGER_KEY = "artifact_io"


def versioned(default: Any = ..., *, description: str | None = None, **kwargs: Any) -> Any:
    """A config field that is part of the artifact's version (changing it recomputes)."""
    return Field(default, description=description, json_schema_extra={"versioned": True}, **kwargs)


class StageConfig(dg.Config):
    """Base for asset configs: only fields declared with ``versioned()`` enter the version."""

    # field name -> how its (dumped) value enters the version; default: the value itself.
    # Lets a field change shape (a JSON string became a nested Config) and keep its versions.
    version_as: ClassVar[Mapping[str, Callable[[Any], Any]]] = {}

    def versioned_fields(self) -> dict[str, Any]:
        dumped = self.model_dump()  # nested Config values become plain dicts/lists
        out = {}
        for name, info in type(self).model_fields.items():
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            if extra.get("versioned"):
                encode = self.version_as.get(name)
                out[name] = encode(dumped[name]) if encode else dumped[name]
        return out


@dataclass
class StageContext:
    """What a stage body sees: where to write, which partition, how to log."""

    out_dir: str
    partition_key: str | None
    log: Callable[[str], None]
    asset_key: str
    version: str
    scratch_dir: str  # survives a killed attempt of this version (resumable work)
    store: ArtifactStore  # to resolve artifacts that are not Dagster inputs (e.g. warm starts)
    # Run tags, resources, Pipes sessions. In a range run's worker process it is a forked
    # copy: read from it, but log through `log` (it reaches the run's event log via the pool).
    dagster_context: dg.AssetExecutionContext | None = None


def _config_fingerprint(config_cls: type[StageConfig] | None) -> str:
    """Hash of the default versioned config, folded into Dagster's code_version so that
    editing a default in code marks the asset unsynced (run-time config is hashed anyway)."""
    if config_cls is None:
        return "noconfig"
    try:
        defaults = config_cls().versioned_fields()
    except Exception:  # a config with required fields has no defaults to fingerprint
        return "required"
    return hashlib.sha256(canonical_json(defaults).encode()).hexdigest()[:8]


def _metadata_value(value: Any) -> Any:
    if isinstance(value, bool):
        return dg.MetadataValue.bool(value)
    if isinstance(value, int):
        return dg.MetadataValue.int(value)
    if isinstance(value, float):
        return dg.MetadataValue.float(value)
    if isinstance(value, (dict, list)):
        return dg.MetadataValue.json(value)
    return dg.MetadataValue.text(str(value))


def png_markdown(title: str, png: bytes) -> dg.MetadataValue:
    """A PNG shown inline in the asset's metadata (markdown with a data URL)."""
    import base64

    return dg.MetadataValue.md(f"**{title}**\n\n![{title}](data:image/png;base64,{base64.b64encode(png).decode()})")


RATE_KEYS = ("docs_in", "docs", "train_tokens", "tokens_trained", "rows")


def _rate(counts: Mapping[str, Any], elapsed: float, cache_hit: bool) -> str:
    """', 1234 docs/s' for the first throughput-like count, so long stages show a rate."""
    if cache_hit or elapsed <= 0:
        return ""
    for key in RATE_KEYS:
        if isinstance(counts.get(key), (int, float)) and not isinstance(counts.get(key), bool):
            return f" ({counts[key] / elapsed:,.0f} {key}/s)"
    return ""


def _upstream_versions(inputs: Mapping[str, Any]) -> dict[str, str]:
    versions: dict[str, str] = {}
    for ref in _iter_refs(inputs):
        label = ref.asset_key if ref.partition is None else f"{ref.asset_key}[{ref.partition}]"
        versions[label] = ref.version
    return versions


def _iter_refs(inputs: Mapping[str, Any]):
    for value in inputs.values():
        if isinstance(value, ArtifactRef):
            yield value
        elif isinstance(value, Mapping):
            yield from (v for v in value.values() if isinstance(v, ArtifactRef))


def versioned_asset(
    *,
    key: str,
    code_version: str,
    config_cls: type[StageConfig] | None = None,
    ins: Mapping[str, str | dg.AssetIn] | None = None,
    partitions_def: dg.PartitionsDefinition | None = None,
    group_name: str | None = None,
    description: str | None = None,
    automation_condition: dg.AutomationCondition | None = None,
    tags: Mapping[str, str] | None = None,
    extra_metadata: Callable[[ArtifactRef], Mapping[str, Any]] | None = None,
    resources: Mapping[str, type] | None = None,
    versioned_ins: Callable[[Any], Collection[str]] | None = None,
    version_inputs: Callable[[Any, str | None, Mapping[str, Any]], Mapping[str, str]] | None = None,
    backfill_policy: dg.BackfillPolicy | None = None,
    on_ref: Callable[[ArtifactRef, dg.AssetExecutionContext], None] | None = None,
) -> Callable[[Callable[..., Mapping[str, Any] | None]], dg.AssetsDefinition]:
    """Decorator: ``fn(ctx, config, **input_refs) -> counts`` becomes a versioned asset.

    resources: ``{name: ConfigurableResource class}`` handed to the body as keyword arguments.
    versioned_ins: ``config -> input names`` whose versions enter the version (default: every
      input). For an input the body reads only under some configs: its version must not
      re-version the artifacts of the configs that ignore it.
    version_inputs: ``(config, partition, inputs) -> {label: version}`` that replaces the
      upstream versions entering the version. Early cutoff: a shard's filtered artifact names
      the digest of its own removal list, not the version of the global reduce that wrote it,
      so a reduce rerun that changes nothing about this shard leaves its artifacts cached.
    backfill_policy: ``BackfillPolicy.single_run()`` lets one run cover a range of partitions;
      the wrapper then computes each partition of the range (its own version, artifact,
      cache hit and materialization) on $MARIN_LOCAL_WORKERS local processes (fanout.py).
      The body stays per-partition (``ctx.partition_key``).
    on_ref: ``(ref, context)`` called in the run after every materialisation, computed or a
      cache hit (unpartitioned assets only). For what the instance must learn from the
      artifact even when the body does not run: shards/index registers its shard partitions
      on a fresh instance over an existing store.
    """
    asset_path = validate_asset_key(key)
    asset_key = "/".join(asset_path)
    asset_ins = {
        name: (spec if isinstance(spec, dg.AssetIn) else dg.AssetIn(key=dg.AssetKey(validate_asset_key(spec))))
        for name, spec in (ins or {}).items()
    }
    if on_ref is not None and partitions_def is not None:
        raise ValueError(f"{asset_key}: on_ref is for unpartitioned assets")
    in_keys = {name: spec.key or dg.AssetKey([*(spec.key_prefix or []), name]) for name, spec in asset_ins.items()}
    effective_code_version = f"{code_version}+cfg.{_config_fingerprint(config_cls)}"

    def decorator(body: Callable[..., Mapping[str, Any] | None]) -> dg.AssetsDefinition:
        stage = _Stage(asset_key, code_version, body, versioned_ins, version_inputs, extra_metadata)

        def compute(context: dg.AssetExecutionContext, **kwargs: Any) -> Iterator[dg.Output | dg.AssetMaterialization]:
            config: StageConfig | None = kwargs.pop("config", None)
            store = kwargs.pop(STORE_RESOURCE_KEY).store
            used_resources = {name: kwargs.pop(name) for name in resources or {}}
            partitions = _step_partitions(context)
            modes = {name: _input_mode(context, in_keys[name], value) for name, value in kwargs.items()}
            if len(partitions) > 1:  # a generator: a failed range still yields its committed partitions
                yield from _materialize_range(context, store, stage, config, partitions, kwargs, modes, used_resources)
                return
            partition = partitions[0] if partitions else None
            inputs = {name: _input_for(value, modes[name], partition, context, False) for name, value in kwargs.items()}
            plan = stage.plan(config, partition, inputs)
            started = time.monotonic()
            result = stage.materialize(store, plan, config, used_resources, context.log.info, context)
            if on_ref is not None:
                on_ref(result.ref, context)
            elapsed = time.monotonic() - started
            context.log.info(stage.summary_line(result, elapsed))
            with warnings.catch_warnings():  # data_version on Output is "beta" but stable in practice
                warnings.simplefilter("ignore", dg.BetaWarning)
                yield dg.Output(result.ref, data_version=dg.DataVersion(plan.version),
                                metadata=stage.metadata(result, elapsed))

        params = [inspect.Parameter("context", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=dg.AssetExecutionContext)]
        if config_cls is not None:
            params.append(inspect.Parameter("config", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=config_cls))
        params.append(inspect.Parameter(STORE_RESOURCE_KEY, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=ArtifactStoreResource))
        params += [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=cls) for name, cls in (resources or {}).items()]
        params += [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in asset_ins]
        compute.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        compute.__name__ = asset_path[-1].replace("-", "_").replace(".", "_")
        compute.__doc__ = body.__doc__
        compute.marin_planner = Planner(stage, config_cls, in_keys, on_ref is None)  # type: ignore[attr-defined]

        return dg.asset(
            key=dg.AssetKey(list(asset_path)),
            ins=asset_ins,
            code_version=effective_code_version,
            partitions_def=partitions_def,
            group_name=group_name,
            description=description or body.__doc__,
            io_manager_key=IO_MANAGER_KEY,
            automation_condition=automation_condition,
            tags=dict(tags or {}),
            backfill_policy=backfill_policy,
            kinds={"marin"},
        )(compute)

    return decorator


def _checked_versions(asset_key: str, versions: dict[str, str]) -> dict[str, str]:
    for label, version in versions.items():
        if not isinstance(label, str) or not isinstance(version, str) or not label or not version:
            raise ValueError(f"{asset_key}: version_inputs must map non-empty labels to non-empty version strings, got {label!r}: {version!r}")
    return versions


# ---- one partition: plan its version, compute or reuse it, describe it -------------------

@dataclass(frozen=True)
class _Plan:
    partition: str | None
    version: str
    inputs: Mapping[str, Any]  # what the body gets: one ref per co-partitioned input
    provenance: Mapping[str, Any]


@dataclass(frozen=True)
class _Stage:
    """What the decorator knows about one asset; the same for single and range runs, so a
    partition gets the same version (and cache hit) whichever way it is run."""

    asset_key: str
    code_version: str
    body: Callable[..., Mapping[str, Any] | None]
    versioned_ins: Callable[[Any], Collection[str]] | None
    version_inputs: Callable[[Any, str | None, Mapping[str, Any]], Mapping[str, str]] | None
    extra_metadata: Callable[[ArtifactRef], Mapping[str, Any]] | None

    def plan(self, config: StageConfig | None, partition: str | None, inputs: Mapping[str, Any]) -> _Plan:
        from marin_assets.store import compute_version, version_payload

        versioned_config = config.versioned_fields() if config is not None else {}
        used = set(inputs) if self.versioned_ins is None else set(self.versioned_ins(config))
        unknown = used - set(inputs)
        if unknown:
            raise ValueError(f"{self.asset_key}: versioned_ins names {sorted(unknown)}, not inputs of the asset")
        if self.version_inputs is not None:
            upstream = _checked_versions(self.asset_key, dict(self.version_inputs(config, partition, inputs)))
        else:
            upstream = _upstream_versions({name: value for name, value in inputs.items() if name in used})
        version = compute_version(self.asset_key, self.code_version, versioned_config, partition, upstream)
        provenance = {
            "version_payload": version_payload(self.asset_key, self.code_version, versioned_config, partition, upstream),
            "config": config.model_dump() if config is not None else {},
        }
        return _Plan(partition, version, inputs, provenance)

    def materialize(self, store: ArtifactStore, plan: _Plan, config: StageConfig | None, used_resources: Mapping[str, Any],
                    log: Callable[[str], None], context: dg.AssetExecutionContext, announce: bool = True) -> Materialization:
        def run_body(out_dir: str) -> Mapping[str, Any] | None:
            stage = StageContext(out_dir, plan.partition, log, self.asset_key, plan.version,
                                 store.scratch_dir(self.asset_key, plan.partition, plan.version), store, context)
            if announce:  # a range logs progress lines instead (each log line is a stored event)
                log(f"computing {self.asset_key} version {plan.version[:16]}" + (f" partition {plan.partition}" if plan.partition else ""))
            arguments = {**plan.inputs, **used_resources}
            return self.body(stage, config, **arguments) if config is not None else self.body(stage, **arguments)

        return store.materialize(self.asset_key, plan.partition, plan.version, run_body, plan.provenance)

    def summary_line(self, result: Materialization, elapsed: float) -> str:
        counts = dict(result.ref.counts)
        where = f" partition {result.ref.partition}" if result.ref.partition is not None else ""
        return (f"{self.asset_key}{where}: {'cache hit' if result.cache_hit else 'computed'} in {elapsed:.2f}s"
                f"{_rate(counts, elapsed, result.cache_hit)}; counts {counts}")

    def metadata(self, result: Materialization, elapsed: float) -> dict[str, Any]:
        ref = result.ref
        return {
            "path": dg.MetadataValue.path(ref.path),
            "version": ref.version,
            "cache_hit": result.cache_hit,
            "total_bytes": int(ref.manifest.get("total_bytes", 0)),
            "files": len(ref.manifest.get("files", [])),
            "duration_s": round(elapsed, 3),
            **{f"count/{k}": _metadata_value(v) for k, v in ref.counts.items()},
            **(self.extra_metadata(ref) if self.extra_metadata else {}),
        }


@dataclass(frozen=True)
class Planner:
    """What planning a versioned asset's partitions outside a run needs (uptodate.py)."""

    stage: _Stage
    config_cls: type[StageConfig] | None
    in_keys: Mapping[str, dg.AssetKey]  # input name -> upstream asset
    skippable: bool  # False with on_ref: the run must call it even when nothing is computed


def planner_of(assets_def: dg.AssetsDefinition) -> Planner | None:
    """The Planner of a versioned_asset, None for any other asset."""
    return getattr(getattr(assets_def.op.compute_fn, "decorated_fn", None), "marin_planner", None)


# ---- which partitions a step covers, and what each partition's body gets --------------

_WHOLE, _IDENTITY = "whole", "identity"


@dataclass(frozen=True)
class _Mapped:
    """An input under another partition mapping (static, time window, ...): each partition
    gets the upstream keys Dagster maps it to."""

    mapping: dg.PartitionMapping
    partitions_def: dg.PartitionsDefinition
    upstream_partitions_def: dg.PartitionsDefinition


def _step_partitions(context: dg.AssetExecutionContext) -> list[str]:
    """[] unpartitioned, [key] for one partition, the range's keys (in order) for a range run."""
    if context.assets_def.partitions_def is None:
        return []
    if context.has_partition_key_range:
        return list(context.partition_keys)
    return [context.partition_key] if context.has_partition_key else []


def _input_mode(context: dg.AssetExecutionContext, upstream_key: dg.AssetKey, value: Any) -> Any:
    """How a loaded input is split over the step's partitions, from the asset's partition
    mapping (never from the keys loaded: an All mapping over the same partitions loads the
    same keys as a range run's identity input when the range covers every partition)."""
    if not isinstance(value, Mapping):
        return _WHOLE  # an unpartitioned upstream (one ref)
    return input_mode(context.assets_def, upstream_key, context.job_def.asset_layer.get(upstream_key).partitions_def)


def input_mode(assets_def: dg.AssetsDefinition, upstream_key: dg.AssetKey,
               upstream_def: dg.PartitionsDefinition | None) -> Any:
    """_WHOLE, _IDENTITY or _Mapped: how `assets_def` maps the partitions of `upstream_key`
    (also what uptodate.py plans with, outside a run)."""
    if assets_def.partitions_def is None or upstream_def is None:
        return _WHOLE  # an unpartitioned asset, or an unpartitioned upstream
    explicit = assets_def.get_partition_mapping(upstream_key)
    if isinstance(explicit, dg.AllPartitionMapping):
        return _WHOLE
    mapping = assets_def.infer_partition_mapping(assets_def.key, upstream_key, upstream_def)
    if isinstance(mapping, dg.AllPartitionMapping):
        return _WHOLE
    if isinstance(mapping, dg.IdentityPartitionMapping):
        return _IDENTITY
    return _Mapped(mapping, assets_def.partitions_def, upstream_def)


def mapped_keys(mode: _Mapped, partition: str, instance: dg.DagsterInstance) -> list[str]:
    """The upstream keys Dagster maps `partition` to under `mode`'s mapping."""
    subset = mode.partitions_def.subset_with_partition_keys([partition])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mapped = mode.mapping.get_upstream_mapped_partitions_result_for_partitions(
            subset, mode.partitions_def, mode.upstream_partitions_def, dynamic_partitions_store=instance)
    return list(mapped.partitions_subset.get_partition_keys())


def _input_for(value: Any, mode: Any, partition: str | None, context: dg.AssetExecutionContext, in_range: bool) -> Any:
    """The input one partition's body sees: the single ref of a co-partitioned input, the
    whole {key: ref} of an All-mapped one, the mapped keys under another mapping."""
    if mode == _WHOLE or partition is None:
        return value
    if mode == _IDENTITY:
        if partition not in value:
            raise KeyError(f"partition {partition!r} of an identity-mapped input was not loaded (got {sorted(value)[:5]})")
        return value[partition]
    if not in_range:
        return value  # Dagster loaded exactly this partition's mapped keys
    return {key: value[key] for key in mapped_keys(mode, partition, context.instance)}


# ---- a range run: every partition of the range, on local workers ----------------------

def _materialize_range(context: dg.AssetExecutionContext, store: ArtifactStore, stage: _Stage, config: StageConfig | None,
                       partitions: list[str], loaded: Mapping[str, Any], modes: Mapping[str, Any],
                       used_resources: Mapping[str, Any]) -> Iterator[dg.Output | dg.AssetMaterialization]:
    """Plan every partition here, answer cache hits here, compute the rest on the pool; each
    partition gets its own materialization event and metadata."""
    from marin_assets.orchestration.fanout import fan_out, local_workers

    started = time.monotonic()
    plans = {p: _plan_partition(stage, config, p, loaded, modes, context) for p in partitions}
    results = _cache_hits(store, stage, plans)  # answered here: no worker for a cached partition
    todo = [p for p in partitions if p not in results]
    workers = min(local_workers(), max(len(todo), 1))
    progress = _Progress(stage.asset_key, len(partitions), len(results), started, context.log.info)
    context.log.info(f"{stage.asset_key}: range of {len(partitions)} partitions ({partitions[0]} .. {partitions[-1]}): "
                     f"{len(results)} cache hits, computing {len(todo)} on {workers} local worker(s)")

    def task(partition: str, log: Callable[[str], None]) -> tuple[Materialization, float]:
        t0 = time.monotonic()
        result = stage.materialize(store, plans[partition], config, used_resources, log, context, announce=False)
        return result, time.monotonic() - t0

    def on_done(partition: str, value: tuple[Materialization, float]) -> None:
        results[partition] = value
        progress.done(value[0])

    failures = fan_out(task, todo, workers, context.log.info, on_done)
    _add_partition_metadata(context, {p: stage.metadata(*results[p]) for p in partitions if p in results})
    if failures:
        yield from _committed_events(store, stage, {p: results[p] for p in partitions if p in results})
        raise _range_failure(stage.asset_key, len(partitions), len(results), failures)
    summary = {"range/partitions": len(partitions), "range/computed": progress.computed,
               "range/cache_hits": len(partitions) - progress.computed, "range/workers": workers,
               "range/duration_s": round(time.monotonic() - started, 3)}
    versions = {p: results[p][0].ref.version for p in partitions}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        # Dagster takes one data version per output; each partition's own is its `version` metadata.
        yield dg.Output({p: results[p][0].ref for p in partitions}, metadata=summary,
                         data_version=dg.DataVersion(hashlib.sha256(canonical_json(versions).encode()).hexdigest()))


def _plan_partition(stage: _Stage, config: StageConfig | None, partition: str, loaded: Mapping[str, Any],
                    modes: Mapping[str, Any], context: dg.AssetExecutionContext) -> _Plan:
    """One partition's inputs and version; an error names the partition (the range has many)."""
    try:
        inputs = {name: _input_for(value, modes[name], partition, context, True) for name, value in loaded.items()}
        return stage.plan(config, partition, inputs)
    except Exception as err:
        raise ValueError(f"{stage.asset_key} partition {partition!r}: its version could not be planned: "
                         f"{type(err).__name__}: {err}") from err


def _cache_hits(store: ArtifactStore, stage: _Stage, plans: Mapping[str, _Plan]) -> dict[str, tuple[Materialization, float]]:
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
    accumulated dict: quadratic in the range, minutes at 10,000 partitions. So the entries
    go into the same accumulator in one update (Dagster 1.13's internals, checked by
    tests/orchestration/test_partition_ranges.py); the public call is the fallback."""
    from dagster._core.execution.context.metadata_logging import AssetMetadataHandle, OutputMetadataAccumulator

    step = getattr(context.op_execution_context, "_step_execution_context", None)
    accumulator = getattr(step, "_metadata_accumulator", None)
    if not isinstance(accumulator, OutputMetadataAccumulator):
        for partition, values in metadata.items():
            context.add_asset_metadata(values, partition_key=partition)
        return
    key = context.assets_def.key
    added = {AssetMetadataHandle(asset_key=key, partition_key=p): {**accumulator.get_asset_metadata(key, p), **values}
             for p, values in metadata.items()}
    step._metadata_accumulator = OutputMetadataAccumulator(per_output_metadata={**accumulator.per_output_metadata, **added})


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
        self.finished += 1
        if not result.cache_hit:  # another run committed it while we waited: a hit
            self.computed += 1
            for key, value in result.ref.counts.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.counts[key] = self.counts.get(key, 0) + value
        now = time.monotonic()
        if self.finished == self.total or now - self.last_logged >= self.EVERY_S:  # each partition has its event
            self.last_logged = now
            elapsed = max(now - self.started, 1e-9)
            self.log(f"{self.asset_key}: {self.finished}/{self.total} partitions done ({self.computed} computed) in "
                     f"{elapsed:.1f}s, {self.computed / elapsed:.2f} partitions/s{_rate(self.counts, elapsed, False)}")


def _committed_events(store: ArtifactStore, stage: _Stage,
                      committed: Mapping[str, tuple[Materialization, float]]) -> Iterator[dg.AssetMaterialization]:
    """A range that failed part-way: the committed partitions still become current (pointer
    and a materialization event), so Dagster and downstream runs see what exists."""
    asset = dg.AssetKey(list(validate_asset_key(stage.asset_key)))
    for p, (result, elapsed) in committed.items():
        store.write_pointer(result.ref)
        yield dg.AssetMaterialization(asset_key=asset, partition=p, metadata=stage.metadata(result, elapsed))


def _range_failure(asset_key: str, total: int, committed: int, failures: list) -> RuntimeError:
    names = ", ".join(repr(f.key) for f in failures[:20]) + (" ..." if len(failures) > 20 else "")
    lines = [f"{asset_key}: {len(failures)} of {total} partitions failed ({names}); {committed} committed "
             f"(a rerun recomputes only the missing ones)"]
    lines += [f"  partition {f.key!r}: {f.message}" for f in failures[:20]]
    if failures[0].detail:
        lines.append(f"first failure ({failures[0].key!r}):\n{failures[0].detail}")
    error = RuntimeError("\n".join(lines))
    error.__cause__ = failures[0].error
    return error
