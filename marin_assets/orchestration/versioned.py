"""Turn a library function into a content-versioned Dagster asset.

    @versioned_asset(key="datakit/normalized", code_version="1", ins={"raw": "sources/sotu"})
    def normalized(ctx: StageContext, config: NormalizeConfig, raw: ArtifactRef) -> dict:
        return normalize(raw.files(".jsonl"), ctx.out_dir, config.to_library())

The wrapper computes the version from {asset key, code_version, versioned config fields,
partition, upstream versions}; on a version that already has SUCCESS the body does not
run and the same ``DataVersion`` is reported with ``cache_hit=true``. Otherwise the body
writes into a staging URL that the store commits atomically.
"""

from __future__ import annotations

import hashlib
import inspect
import time
import warnings
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import dagster as dg
from pydantic import Field

from marin_assets.store import ArtifactRef, ArtifactStore, canonical_json, validate_asset_key
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
    dagster_context: dg.AssetExecutionContext | None = None  # run tags, resources, Pipes sessions


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
    """
    asset_path = validate_asset_key(key)
    asset_key = "/".join(asset_path)
    asset_ins = {
        name: (spec if isinstance(spec, dg.AssetIn) else dg.AssetIn(key=dg.AssetKey(validate_asset_key(spec))))
        for name, spec in (ins or {}).items()
    }
    effective_code_version = f"{code_version}+cfg.{_config_fingerprint(config_cls)}"

    def decorator(body: Callable[..., Mapping[str, Any] | None]) -> dg.AssetsDefinition:
        def compute(context: dg.AssetExecutionContext, **kwargs: Any) -> dg.Output:
            config: StageConfig | None = kwargs.pop("config", None)
            store = kwargs.pop(STORE_RESOURCE_KEY).store
            used_resources = {name: kwargs.pop(name) for name in resources or {}}
            partition = context.partition_key if context.has_partition_key else None
            inputs = {name: _unwrap(value, partition) for name, value in kwargs.items()}
            return _materialize(context, store, body, config, partition, inputs, used_resources)

        def _materialize(context, store, body, config, partition, inputs, used_resources) -> dg.Output:
            from marin_assets.store import compute_version, version_payload

            versioned_config = config.versioned_fields() if config is not None else {}
            used = set(inputs) if versioned_ins is None else set(versioned_ins(config))
            unknown = used - set(inputs)
            if unknown:
                raise ValueError(f"{asset_key}: versioned_ins names {sorted(unknown)}, not inputs of the asset")
            if version_inputs is not None:
                upstream = _checked_versions(asset_key, dict(version_inputs(config, partition, inputs)))
            else:
                upstream = _upstream_versions({name: value for name, value in inputs.items() if name in used})
            version = compute_version(asset_key, code_version, versioned_config, partition, upstream)
            provenance = {
                "version_payload": version_payload(asset_key, code_version, versioned_config, partition, upstream),
                "config": config.model_dump() if config is not None else {},
            }

            def run_body(out_dir: str) -> Mapping[str, Any] | None:
                stage = StageContext(out_dir, partition, context.log.info, asset_key, version,
                                     store.scratch_dir(asset_key, partition, version), store, context)
                context.log.info(f"computing {asset_key} version {version[:16]}" + (f" partition {partition}" if partition else ""))
                arguments = {**inputs, **used_resources}
                return body(stage, config, **arguments) if config is not None else body(stage, **arguments)

            started = time.monotonic()
            result = store.materialize(asset_key, partition, version, run_body, provenance)
            ref = result.ref
            counts = dict(ref.counts)
            elapsed = time.monotonic() - started
            context.log.info(
                f"{asset_key}: {'cache hit' if result.cache_hit else 'computed'} in {elapsed:.2f}s{_rate(counts, elapsed, result.cache_hit)}; counts {counts}"
            )
            metadata = {
                "path": dg.MetadataValue.path(ref.path),
                "version": ref.version,
                "cache_hit": result.cache_hit,
                "total_bytes": int(ref.manifest.get("total_bytes", 0)),
                "files": len(ref.manifest.get("files", [])),
                "duration_s": round(elapsed, 3),
                **{f"count/{k}": _metadata_value(v) for k, v in counts.items()},
                **(extra_metadata(ref) if extra_metadata else {}),
            }
            with warnings.catch_warnings():  # data_version on Output is "beta" but stable in practice
                warnings.simplefilter("ignore", dg.BetaWarning)
                return dg.Output(ref, data_version=dg.DataVersion(version), metadata=metadata)

        params = [inspect.Parameter("context", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=dg.AssetExecutionContext)]
        if config_cls is not None:
            params.append(inspect.Parameter("config", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=config_cls))
        params.append(inspect.Parameter(STORE_RESOURCE_KEY, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=ArtifactStoreResource))
        params += [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=cls) for name, cls in (resources or {}).items()]
        params += [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in asset_ins]
        compute.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        compute.__name__ = asset_path[-1].replace("-", "_").replace(".", "_")
        compute.__doc__ = body.__doc__

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


def _unwrap(value: Any, partition: str | None) -> Any:
    """Co-partitioned inputs arrive as {partition: ref}; hand the body the single ref."""
    if isinstance(value, Mapping) and partition is not None and set(value) == {partition}:
        return value[partition]
    return value
