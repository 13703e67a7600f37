"""Dagster resources and the IO manager that pass artifact references between assets.

Only references travel (a versioned path plus its manifest, as a small JSON pointer):
never pickled frames, so shards can be terabytes and live on gs:// or s3://.
"""

from __future__ import annotations

import os
from functools import cached_property

import dagster as dg

from marin_assets.store import ArtifactRef, ArtifactStore


def default_prefix() -> str:
    return os.environ.get("MARIN_PREFIX") or os.path.abspath("artifacts")


class ArtifactStoreResource(dg.ConfigurableResource):
    """Where content-versioned artifacts live: a local path or any fsspec URL."""

    prefix: str | None = None  # None: $MARIN_PREFIX at run time, else ./artifacts
    lease_heartbeat_s: float = 30.0
    lease_stale_after_s: float = 90.0

    @cached_property
    def store(self) -> ArtifactStore:
        from marin_assets.store import LeaseConfig

        return ArtifactStore(self.prefix or default_prefix(), LeaseConfig(self.lease_heartbeat_s, self.lease_stale_after_s))


class ArtifactIOManager(dg.ConfigurableIOManager):
    """Stores/loads ``ArtifactRef`` pointers (``LATEST.json``) next to the versions.

    A partitioned upstream always loads as ``{partition_key: ArtifactRef}``; the
    versioned-asset wrapper unwraps co-partitioned inputs to a single reference.
    """

    artifact_store: ArtifactStoreResource

    def handle_output(self, context: dg.OutputContext, obj: ArtifactRef) -> None:
        if not isinstance(obj, ArtifactRef):
            raise TypeError(f"{context.asset_key.to_user_string()} must return an ArtifactRef, got {type(obj).__name__}")
        self.artifact_store.store.write_pointer(obj)

    def load_input(self, context: dg.InputContext) -> ArtifactRef | dict[str, ArtifactRef]:
        store = self.artifact_store.store
        key = "/".join(context.asset_key.path)
        if not context.has_asset_partitions:
            return _require(store.read_pointer(key, None), key, None)
        return {p: _require(store.read_pointer(key, p), key, p) for p in context.asset_partition_keys}


def _require(ref: ArtifactRef | None, key: str, partition: str | None) -> ArtifactRef:
    if ref is None:
        where = f" partition {partition!r}" if partition else ""
        raise FileNotFoundError(f"upstream asset {key!r}{where} has not been materialised yet")
    return ref
