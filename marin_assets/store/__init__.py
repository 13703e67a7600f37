"""Content-versioned artifact store: versions, paths, atomic commit, status, lease locks."""

from marin_assets.store.artifact import FAILED, RUNNING, SUCCESS, ArtifactRef, ArtifactStore, Materialization
from marin_assets.store.lease import FakeClock, Lease, LeaseConfig, LeaseLost, SystemClock
from marin_assets.store.names import validate_asset_key, validate_segment
from marin_assets.store.versioning import canonical_json, compute_version, short_version, version_payload

__all__ = [
    "ArtifactRef",
    "ArtifactStore",
    "FAILED",
    "FakeClock",
    "Lease",
    "LeaseConfig",
    "LeaseLost",
    "Materialization",
    "RUNNING",
    "SUCCESS",
    "SystemClock",
    "canonical_json",
    "compute_version",
    "short_version",
    "validate_asset_key",
    "validate_segment",
    "version_payload",
]
