"""Turn a library function into a content-versioned Dagster asset.

    @versioned_asset(key="datakit/normalized", code_version="1", ins={"raw": "sources/sotu"})
    def normalized(ctx: StageContext, config: NormalizeConfig, raw: ArtifactRef) -> dict:
        return normalize(raw.files(".jsonl"), ctx.out_dir, config.to_library())

The wrapper computes the version from {asset key, code_version, versioned config fields,
partition, upstream versions}; on a version that already has SUCCESS the body does not
run and the same ``DataVersion`` is reported with ``cache_hit=true``. Otherwise the body
writes into a staging URL that the store commits atomically.

Here: the decorator, the asset's config base and what planning outside a run needs
(`Planner`). One partition's version, artifact and metadata: stage.py; how inputs are split
over a step's partitions: inputs.py; a run over a range of partitions: ranges.py.
"""

from __future__ import annotations

import hashlib
import inspect
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import dagster as dg
from pydantic import Field

from marin_assets.orchestration.inputs import Mode, loaded_input_mode, partition_inputs, step_partitions
from marin_assets.orchestration.ranges import materialize_range
from marin_assets.orchestration.resources import ArtifactStoreResource
from marin_assets.orchestration.stage import Stage, StageContext, png_markdown, versioned_output
from marin_assets.store import ArtifactRef, ArtifactStore, canonical_json, validate_asset_key

# StageContext and png_markdown are re-exported: the package's __init__ imports them from here.
__all__ = [
    "IO_MANAGER_KEY",
    "STORE_RESOURCE_KEY",
    "Planner",
    "StageConfig",
    "StageContext",
    "planner_of",
    "png_markdown",
    "versioned",
    "versioned_asset",
]

STORE_RESOURCE_KEY = "artifact_store"
IO_MANAGER_KEY = "artifact_io"

Body = Callable[..., Mapping[str, Any] | None]
OnRef = Callable[[ArtifactRef, dg.AssetExecutionContext], None]


def versioned(default: Any = ..., *, description: str | None = None, **kwargs: Any) -> Any:
    """A config field that is part of the artifact's version (changing it recomputes)."""
    return Field(default, description=description, json_schema_extra={"versioned": True}, **kwargs)


class StageConfig(dg.Config):
    """Base for asset configs: only fields declared with ``versioned()`` enter the version."""

    # field name -> how its (dumped) value enters the version; default: the value itself.
    # Lets a field change shape (a JSON string became a nested Config) and keep its versions.
    version_as: ClassVar[Mapping[str, Callable[[Any], Any]]] = {}

    def versioned_fields(self) -> dict[str, Any]:
        """{name: value} of the fields declared with ``versioned()``, as they enter the version."""
        dumped = self.model_dump()  # nested Config values become plain dicts/lists
        out = {}
        for name, info in type(self).model_fields.items():
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            if extra.get("versioned"):
                encode = self.version_as.get(name)
                out[name] = encode(dumped[name]) if encode else dumped[name]
        return out


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
    version_inputs: Callable[..., Mapping[str, str]] | None = None,  # (config, partition, inputs)
    backfill_policy: dg.BackfillPolicy | None = None,
    on_ref: OnRef | None = None,
    deps: Collection[dg.AssetDep] = (),
) -> Callable[[Body], dg.AssetsDefinition]:
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
      cache hit and materialization) on the artifact store resource's ``local_workers``
      processes ($MARIN_LOCAL_WORKERS by default; ranges.py).
      The body stays per-partition (``ctx.partition_key``).
    on_ref: ``(ref, context)`` called in the run after every materialisation, computed or a
      cache hit (unpartitioned assets only). For what the instance must learn from the
      artifact even when the body does not run: shards/index registers its shard partitions
      on a fresh instance over an existing store.
    deps: assets the body reads without loading them as inputs, for lineage only (their versions do not
      enter this one): an eval reads its phase's checkpoint folder through the phase's artifact, and
      depends on the checkpoint asset so its lineage shows which checkpoint it scored.
    """
    asset_path = validate_asset_key(key)
    asset_key = "/".join(asset_path)
    asset_ins = _asset_ins(ins or {})
    if on_ref is not None and partitions_def is not None:
        raise ValueError(f"{asset_key}: on_ref is for unpartitioned assets")
    in_keys = {name: spec.key or dg.AssetKey([*(spec.key_prefix or []), name]) for name, spec in asset_ins.items()}
    effective_code_version = f"{code_version}+cfg.{_config_fingerprint(config_cls)}"

    def decorator(body: Body) -> dg.AssetsDefinition:
        """`body` as the asset's op; its `marin_planner` lets uptodate.py plan it outside a run."""
        stage = Stage(asset_key, code_version, body, versioned_ins, version_inputs, extra_metadata)
        compute = _compute_fn(stage, in_keys, resources or {}, on_ref)
        compute.__signature__ = _compute_signature(config_cls, resources or {}, asset_ins)  # type: ignore[attr-defined]
        compute.__name__ = asset_path[-1].replace("-", "_").replace(".", "_")
        compute.__doc__ = body.__doc__
        compute.marin_planner = Planner(stage, config_cls, in_keys, on_ref is None)  # type: ignore[attr-defined]

        return dg.asset(
            key=dg.AssetKey(list(asset_path)),
            ins=asset_ins,
            deps=list(deps),
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


def _asset_ins(ins: Mapping[str, str | dg.AssetIn]) -> dict[str, dg.AssetIn]:
    """Dagster AssetIns from `ins`: an asset key string becomes an AssetIn of that (validated) key."""
    return {
        name: (spec if isinstance(spec, dg.AssetIn) else dg.AssetIn(key=dg.AssetKey(validate_asset_key(spec))))
        for name, spec in ins.items()
    }


def _compute_signature(
    config_cls: type[StageConfig] | None, resources: Mapping[str, type], asset_ins: Mapping[str, dg.AssetIn]
) -> inspect.Signature:
    """The signature Dagster reads off the op: context, [config], the store, the resources, the inputs."""

    def param(name: str, annotation: Any = inspect.Parameter.empty) -> inspect.Parameter:
        return inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=annotation)

    params = [param("context", dg.AssetExecutionContext)]
    if config_cls is not None:
        params.append(param("config", config_cls))
    params.append(param(STORE_RESOURCE_KEY, ArtifactStoreResource))
    params += [param(name, cls) for name, cls in resources.items()]
    params += [param(name) for name in asset_ins]
    return inspect.Signature(params)


def _compute_fn(
    stage: Stage, in_keys: Mapping[str, dg.AssetKey], resources: Mapping[str, type], on_ref: OnRef | None
) -> Callable[..., Iterator[dg.Output | dg.AssetMaterialization]]:
    """The op body: one partition (or none) here, a range of partitions in ranges.py."""

    def compute(context: dg.AssetExecutionContext, **kwargs: Any) -> Iterator[dg.Output | dg.AssetMaterialization]:
        config: StageConfig | None = kwargs.pop("config", None)
        store_resource = kwargs.pop(STORE_RESOURCE_KEY)
        store = store_resource.store
        used_resources = {name: kwargs.pop(name) for name in resources}
        partitions = step_partitions(context)
        modes = {name: loaded_input_mode(context, in_keys[name], value) for name, value in kwargs.items()}
        if len(partitions) > 1:  # a generator: a failed range still yields its committed partitions
            workers = store_resource.range_workers()
            yield from materialize_range(context, store, stage, config, partitions, kwargs, modes, used_resources, workers)
            return
        partition = partitions[0] if partitions else None
        yield _materialize_one(context, store, stage, config, partition, kwargs, modes, used_resources, on_ref)

    return compute


def _materialize_one(
    context: dg.AssetExecutionContext,
    store: ArtifactStore,
    stage: Stage,
    config: StageConfig | None,
    partition: str | None,
    loaded: Mapping[str, Any],
    modes: Mapping[str, Mode],
    used_resources: Mapping[str, Any],
    on_ref: OnRef | None,
) -> dg.Output:
    """One partition (or an unpartitioned asset): plan, compute or reuse, log a summary line."""
    plan = stage.plan(config, partition, partition_inputs(loaded, modes, partition, context, in_range=False))
    started = time.monotonic()
    result = stage.materialize(store, plan, config, used_resources, context.log.info, context)
    if on_ref is not None:
        on_ref(result.ref, context)
    elapsed = time.monotonic() - started
    context.log.info(stage.summary_line(result, elapsed))
    return versioned_output(result.ref, plan.version, stage.metadata(result, elapsed))


@dataclass(frozen=True)
class Planner:
    """What planning a versioned asset's partitions outside a run needs (uptodate.py)."""

    stage: Stage
    config_cls: type[StageConfig] | None
    in_keys: Mapping[str, dg.AssetKey]  # input name -> upstream asset
    skippable: bool  # False with on_ref: the run must call it even when nothing is computed


def planner_of(assets_def: dg.AssetsDefinition) -> Planner | None:
    """The Planner of a versioned_asset, None for any other asset."""
    if not assets_def.is_executable:  # an external asset (a phase's reported checkpoints) has no op
        return None
    return getattr(getattr(assets_def.op.compute_fn, "decorated_fn", None), "marin_planner", None)
