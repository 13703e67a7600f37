"""Where each step's metrics go: metrics.jsonl, the telemetry store (under a run name) and ``log_fn``.

The emitter is the loop's first hook: it writes a step's row one step late, while the next
step computes, so the host never waits on the device for metrics. The phase's first row is
flushed to the telemetry store at once (the phase controller sees the phase is live); later
rows every ``TELEMETRY_FLUSH_SECONDS`` and before each checkpoint (``sync``).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path

import jax

from marin_assets.store.fsutil import filesystem, is_local
from marin_assets.telemetry import TelemetryWriter
from marin_assets.train import mesh as meshlib
from marin_assets.train.config import TrainConfig
from marin_assets.train.hooks import StepInfo
from marin_assets.train.metrics import MetricsLogger, telemetry_fields

TELEMETRY_FLUSH_SECONDS = 5.0  # live metrics reach the store (and the phase controller) this often


class Emitter:
    """Writes each step's metrics row one step late (``push``, the hook), so the host never waits on the device."""

    def __init__(self, logger: MetricsLogger, log_fn: Callable[[dict], None] | None, telemetry: TelemetryWriter):
        self.logger, self.log_fn, self.telemetry = logger, log_fn, telemetry
        self.pending: StepInfo | None = None
        self.last_row: dict | None = None

    def push(self, info: StepInfo) -> None:
        """Write the previous step's row; hold this one until the next step (or a ``sync``)."""
        self.flush()
        self.pending = info

    def flush(self) -> None:
        """Write the held row, if any."""
        if self.pending is None:
            return
        row = self.pending.row
        self.pending = None
        if row is None:
            return
        first = self.last_row is None
        self.last_row = row
        if not meshlib.is_writer():  # metrics are replicated: process 0 speaks for all
            return
        self.logger.write(row)
        self.telemetry.log(row["step"], telemetry_fields(row), phase=row["phase"])
        if first:
            self.telemetry.flush()  # the first step at once: the phase controller sees the phase is live
        if self.log_fn is not None:
            self.log_fn(row)

    def end(self, info: StepInfo) -> None:
        """The at_end hook: the last row, should a step still hold it (the final checkpoint's
        ``sync`` has written it already, unless the cadence changes)."""
        self.flush()

    def sync(self) -> None:
        """Everything so far on disk and in the store (before a checkpoint names the step)."""
        self.flush()
        self.logger.flush()
        self.telemetry.flush()

    def close(self) -> None:
        """Close the metrics file and the telemetry writer (its buffered rows reach the store)."""
        try:
            self.logger.close()
        finally:
            self.telemetry.close()


def host_row(step: int, m: dict, config: TrainConfig, tokens: int) -> dict:
    """The metrics row of ``step`` from the step function's device metrics ``m``."""
    m = jax.device_get(m)
    row = {
        "step": step,
        "loss": float(m["loss"]),
        "lr": float(m["lr"]),
        "grad_norm": float(m["grad_norm"]),
        "update_norm": float(m["update_norm"]),
        "skipped": bool(m["skipped"]),
        "tokens": tokens,
        "phase": config.phase,
    }
    row["counts"] = {k: int(v) for k, v in m["counts"].items()}
    row["dropped"] = int(m["dropped"])
    return row


def default_telemetry_root() -> str:
    """``$MARIN_PREFIX/telemetry`` (``telemetry.default_root``)."""
    from marin_assets.telemetry import default_root

    return default_root()


def default_telemetry_run(out_dir: str | os.PathLike, phase: str) -> str:
    """``<out dir name>-<phase>-<hash of the absolute out dir or its URL>``: a valid run name
    (scratch dirs like ``.work`` are not) and a distinct one per out dir (they often share a
    name); a resume in the same out dir logs under the same run."""

    def safe(text: str) -> str:
        return re.sub(r"[^A-Za-z0-9_.=+-]+|\.{2,}", "-", text).lstrip("._=+-")[:48]

    where = _absolute(out_dir)
    digest = hashlib.sha256(where.encode()).hexdigest()[:8]
    return "-".join(part for part in (safe(dir_name(where)), safe(phase), digest) if part)


def _absolute(out_dir: str | os.PathLike) -> str:
    """A local dir as its resolved absolute path; a URL as spelled (less a trailing slash)."""
    fs, path = filesystem(os.fspath(out_dir))
    return str(Path(path).resolve()) if is_local(fs) else os.fspath(out_dir).rstrip("/")


def dir_name(out_dir: str | os.PathLike) -> str:
    """The last part of a local path or URL (``gs://b/runs/kestrel`` -> ``kestrel``)."""
    return os.fspath(out_dir).rstrip("/").rsplit("/", 1)[-1]
