"""Quarantine: where bad input records go instead of vanishing.

Every record a reader cannot turn into a document becomes one QuarantineRecord naming the
file, the line (1-based; None when the whole file is unreadable) and a reason. Stages
write them next to their output so `records in = kept + quarantined` can always be checked.
"""

from __future__ import annotations

import collections
import json
from dataclasses import asdict, dataclass

# The closed set of reasons, so counts are comparable across runs and sources.
REASONS = (
    "invalid_utf8",
    "nul_bytes",
    "empty_text",
    "too_large",
    "malformed_json",
    "missing_text",
    "truncated_file",
    "binary_file",
    "unsupported_file_type",
    "unreadable_file",
)

QUARANTINE_FILE = "_quarantine.jsonl"


@dataclass(frozen=True)
class QuarantineRecord:
    file: str
    line: int | None
    reason: str
    detail: str = ""

    def __post_init__(self):
        if self.reason not in REASONS:
            raise ValueError(f"unknown quarantine reason {self.reason!r}; expected one of {REASONS}")


def count_reasons(records) -> dict[str, int]:
    return dict(sorted(collections.Counter(r.reason for r in records).items()))


def write_quarantine(records: list[QuarantineRecord], out_dir: str) -> dict[str, int]:
    """Write records as JSON lines to out_dir/_quarantine.jsonl (always, even when empty)."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(out_dir)
    fs.makedirs(root, exist_ok=True)
    with fs.open(f"{root.rstrip('/')}/{QUARANTINE_FILE}", "w") as f:
        for record in records:
            f.write(json.dumps(asdict(record), sort_keys=True) + "\n")
    return count_reasons(records)


def read_quarantine(out_dir: str) -> list[QuarantineRecord]:
    import fsspec

    fs, root = fsspec.core.url_to_fs(out_dir)
    with fs.open(f"{root.rstrip('/')}/{QUARANTINE_FILE}", "r") as f:
        return [QuarantineRecord(**json.loads(line)) for line in f if line.strip()]
