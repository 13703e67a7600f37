"""Validation of the names that become path components (asset keys, partitions).

A name reaches the filesystem only after passing here, so `../x`, absolute paths, empty
segments and shell metacharacters are refused with a message naming the bad part.
"""

from __future__ import annotations

import re

_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=+-]{0,127}$")


def validate_segment(segment: str, what: str = "name") -> str:
    """Return ``segment`` if it is a safe single path component, else raise ValueError."""
    if not isinstance(segment, str):
        raise ValueError(f"{what} must be a string, got {type(segment).__name__}: {segment!r}")
    if segment in (".", "..") or ".." in segment or not _SEGMENT.fullmatch(segment):
        raise ValueError(
            f"invalid {what} {segment!r}: use 1-128 characters from [A-Za-z0-9_.=+-], "
            "starting with a letter or digit, and no '..'"
        )
    return segment


def validate_asset_key(key: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Split an asset key ("a/b" or ["a", "b"]) into validated path segments."""
    parts = key.split("/") if isinstance(key, str) else list(key)
    if not parts:
        raise ValueError("asset key must not be empty")
    return tuple(validate_segment(p, "asset key segment") for p in parts)


NO_PARTITION = "__all__"


def partition_segment(partition_key: str | None) -> str:
    """The path segment of a partition; unpartitioned assets live under ``__all__``."""
    if partition_key is None:
        return NO_PARTITION
    return validate_segment(partition_key, "partition key")
