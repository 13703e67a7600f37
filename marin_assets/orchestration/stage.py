"""One partition of a versioned asset: plan its version, compute or reuse its artifact, describe it.

The same `Stage` serves a single-partition run and every partition of a range run
(ranges.py), so a partition gets the same version (and cache hit) whichever way it is run.
"""

from __future__ import annotations

import base64
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import dagster as dg

from marin_assets.store import ArtifactRef, ArtifactStore, Materialization, compute_version, version_payload

if TYPE_CHECKING:
    from marin_assets.orchestration.versioned import StageConfig

# The counts a summary line turns into a throughput, the first present one wins.
RATE_KEYS = ("docs_in", "docs", "train_tokens", "tokens_trained", "rows")


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

    @property
    def partition(self) -> str:
        """The partition key of a partitioned asset's step (ValueError for an unpartitioned one)."""
        if self.partition_key is None:
            raise ValueError(f"{self.asset_key} ran without a partition key")
        return self.partition_key


@dataclass(frozen=True)
class Plan:
    """One partition's version, what its body gets, and the provenance its artifact records."""

    partition: str | None
    version: str
    inputs: Mapping[str, Any]  # what the body gets: one ref per co-partitioned input
    provenance: Mapping[str, Any]


@dataclass(frozen=True)
class Stage:
    """What the decorator knows about one asset; the same for single and range runs, so a
    partition gets the same version (and cache hit) whichever way it is run."""

    asset_key: str
    code_version: str
    body: Callable[..., Mapping[str, Any] | None]
    versioned_ins: Callable[[Any], Collection[str]] | None
    version_inputs: Callable[[Any, str | None, Mapping[str, Any]], Mapping[str, str]] | None
    extra_metadata: Callable[[ArtifactRef], Mapping[str, Any]] | None

    def plan(self, config: StageConfig | None, partition: str | None, inputs: Mapping[str, Any]) -> Plan:
        """The version `partition` gets from `config` and `inputs`, and its provenance."""
        versioned_config = config.versioned_fields() if config is not None else {}
        upstream = self._upstream(config, partition, inputs)
        version = compute_version(self.asset_key, self.code_version, versioned_config, partition, upstream)
        provenance = {
            "version_payload": version_payload(self.asset_key, self.code_version, versioned_config, partition, upstream),
            "config": config.model_dump() if config is not None else {},
        }
        return Plan(partition, version, inputs, provenance)

    def _upstream(self, config: StageConfig | None, partition: str | None, inputs: Mapping[str, Any]) -> dict[str, str]:
        """{label: version} of the inputs that enter the version (versioned_ins, version_inputs)."""
        used = set(inputs) if self.versioned_ins is None else set(self.versioned_ins(config))
        unknown = used - set(inputs)
        if unknown:
            raise ValueError(f"{self.asset_key}: versioned_ins names {sorted(unknown)}, not inputs of the asset")
        if self.version_inputs is not None:
            return _checked_versions(self.asset_key, dict(self.version_inputs(config, partition, inputs)))
        return _upstream_versions({name: value for name, value in inputs.items() if name in used})

    def materialize(
        self,
        store: ArtifactStore,
        plan: Plan,
        config: StageConfig | None,
        used_resources: Mapping[str, Any],
        log: Callable[[str], None],
        context: dg.AssetExecutionContext,
        announce: bool = True,
    ) -> Materialization:
        """The SUCCESS artifact of `plan`: a cache hit, or the body run into a staging dir and committed."""

        def run_body(out_dir: str) -> Mapping[str, Any] | None:
            stage = StageContext(
                out_dir,
                plan.partition,
                log,
                self.asset_key,
                plan.version,
                store.scratch_dir(self.asset_key, plan.partition, plan.version),
                store,
                context,
            )
            if announce:  # a range logs progress lines instead (each log line is a stored event)
                where = f" partition {plan.partition}" if plan.partition else ""
                log(f"computing {self.asset_key} version {plan.version[:16]}{where}")
            arguments = {**plan.inputs, **used_resources}
            return self.body(stage, config, **arguments) if config is not None else self.body(stage, **arguments)

        return store.materialize(self.asset_key, plan.partition, plan.version, run_body, plan.provenance)

    def summary_line(self, result: Materialization, elapsed: float) -> str:
        """'key partition p: computed in 1.20s (1,234 docs/s); counts {...}' for the run log."""
        counts = dict(result.ref.counts)
        where = f" partition {result.ref.partition}" if result.ref.partition is not None else ""
        return (
            f"{self.asset_key}{where}: {'cache hit' if result.cache_hit else 'computed'} in {elapsed:.2f}s"
            f"{rate_suffix(counts, elapsed, result.cache_hit)}; counts {counts}"
        )

    def metadata(self, result: Materialization, elapsed: float) -> dict[str, Any]:
        """The materialization metadata of one partition: path, version, cache hit, sizes, counts."""
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


def versioned_output(value: Any, data_version: str, metadata: Mapping[str, Any]) -> dg.Output:
    """An Output that carries our version as Dagster's data version."""
    with warnings.catch_warnings():  # data_version on Output is "beta" but stable in practice
        warnings.simplefilter("ignore", dg.BetaWarning)
        return dg.Output(value, data_version=dg.DataVersion(data_version), metadata=metadata)


def is_number(value: Any) -> bool:
    """An int or float count (a bool is not one)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def rate_suffix(counts: Mapping[str, Any], elapsed: float, cache_hit: bool) -> str:
    """', 1234 docs/s' for the first throughput-like count, so long stages show a rate."""
    if cache_hit or elapsed <= 0:
        return ""
    for key in RATE_KEYS:
        if is_number(counts.get(key)):
            return f" ({counts[key] / elapsed:,.0f} {key}/s)"
    return ""


def png_markdown(title: str, png: bytes) -> dg.MetadataValue:
    """A PNG shown inline in the asset's metadata (markdown with a data URL)."""
    return dg.MetadataValue.md(f"**{title}**\n\n![{title}](data:image/png;base64,{base64.b64encode(png).decode()})")


def _metadata_value(value: Any) -> Any:
    """A count as the typed metadata value the UI shows (bool before int: a bool is an int)."""
    if isinstance(value, bool):
        return dg.MetadataValue.bool(value)
    if isinstance(value, int):
        return dg.MetadataValue.int(value)
    if isinstance(value, float):
        return dg.MetadataValue.float(value)
    if isinstance(value, (dict, list)):
        return dg.MetadataValue.json(value)
    return dg.MetadataValue.text(str(value))


def _checked_versions(asset_key: str, versions: dict[str, str]) -> dict[str, str]:
    """A version_inputs result, refused unless every label and version is a non-empty string."""
    for label, version in versions.items():
        if not isinstance(label, str) or not isinstance(version, str) or not label or not version:
            raise ValueError(
                f"{asset_key}: version_inputs must map non-empty labels to non-empty version strings, got {label!r}: {version!r}"
            )
    return versions


def _upstream_versions(inputs: Mapping[str, Any]) -> dict[str, str]:
    """{'key' or 'key[partition]': version} of every ref among `inputs`."""
    versions: dict[str, str] = {}
    for ref in _iter_refs(inputs):
        label = ref.asset_key if ref.partition is None else f"{ref.asset_key}[{ref.partition}]"
        versions[label] = ref.version
    return versions


def _iter_refs(inputs: Mapping[str, Any]) -> Iterator[ArtifactRef]:
    """The refs of `inputs`: a single ref, or the refs of a {partition: ref} input."""
    for value in inputs.values():
        if isinstance(value, ArtifactRef):
            yield value
        elif isinstance(value, Mapping):
            yield from (v for v in value.values() if isinstance(v, ArtifactRef))
