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
    "invalid_field",  # a field of the wrong type (an id that is a list, say)
    # WARC responses (web.py): not a page, cut short by the crawler or the file, unparsable, no main text
    "not_html",
    "truncated_record",
    "malformed_record",
    "no_main_text",
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


class QuarantineWriter:
    """Streams records to out_dir/_quarantine.jsonl as they come (memory: the reason counts)."""

    def __init__(self, out_dir: str):
        import fsspec

        fs, root = fsspec.core.url_to_fs(out_dir)
        fs.makedirs(root, exist_ok=True)
        self._file = fs.open(f"{root.rstrip('/')}/{QUARANTINE_FILE}", "w")
        self._counts: collections.Counter = collections.Counter()

    def write(self, record: QuarantineRecord) -> None:
        self._file.write(json.dumps(asdict(record), sort_keys=True) + "\n")
        self._counts[record.reason] += 1

    def close(self) -> dict[str, int]:
        self._file.close()
        return dict(sorted(self._counts.items()))


def read_quarantine(out_dir: str) -> list[QuarantineRecord]:
    import fsspec

    fs, root = fsspec.core.url_to_fs(out_dir)
    with fs.open(f"{root.rstrip('/')}/{QUARANTINE_FILE}", "r") as f:
        return [QuarantineRecord(**json.loads(line)) for line in f if line.strip()]
