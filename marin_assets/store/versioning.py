"""Content versions: what an artifact *is*, independent of where it is stored.

version = sha256(canonical JSON {asset key, code_version, versioned config, partition,
sorted upstream versions}). Nothing machine- or region-specific may enter (paths,
hostnames, timestamps), so copying a prefix to another region keeps every cache hit.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

from marin_assets.store.names import validate_asset_key

SHORT_VERSION_CHARS = 16


def _check_json(value: Any, where: str) -> None:
    """Refuse values that do not round-trip through canonical JSON, naming the field."""
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"config field {where!r} is {value!r}: only finite numbers can be versioned")
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_json(item, f"{where}[{i}]")
        return
    if isinstance(value, Mapping):
        for k, item in value.items():
            if not isinstance(k, str):
                raise ValueError(f"config field {where!r} has a non-string key {k!r}")
            _check_json(item, f"{where}.{k}")
        return
    raise ValueError(
        f"config field {where!r} has type {type(value).__name__} ({value!r}), which is not "
        "JSON-serialisable; version only plain numbers, strings, booleans, lists and dicts"
    )


def canonical_json(value: Any) -> str:
    _check_json(value, "<root>")
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def version_payload(
    asset_key: str | tuple[str, ...],
    code_version: str,
    config: Mapping[str, Any],
    partition_key: str | None,
    upstream: Mapping[str, str],
) -> dict[str, Any]:
    """The exact document whose hash is the version (kept for provenance)."""
    for field_name, value in config.items():
        _check_json(value, field_name)
    return {
        "asset": "/".join(validate_asset_key(asset_key)),
        "code_version": str(code_version),
        "config": dict(config),
        "partition": partition_key,
        "upstream": {k: upstream[k] for k in sorted(upstream)},
    }


def compute_version(
    asset_key: str | tuple[str, ...],
    code_version: str,
    config: Mapping[str, Any],
    partition_key: str | None = None,
    upstream: Mapping[str, str] | None = None,
) -> str:
    """Full sha256 hex of the canonical version payload."""
    payload = version_payload(asset_key, code_version, config, partition_key, upstream or {})
    return hashlib.sha256(canonical_json(payload).encode("utf-8")).hexdigest()


def short_version(version: str) -> str:
    return version[:SHORT_VERSION_CHARS]
