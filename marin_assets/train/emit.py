"""Where each step's metrics go: metrics.jsonl, the telemetry store (under a run name) and ``log_fn``.

The emitter is the loop's first hook: it writes a step's row one step late, while the next
step computes, so the host never waits on the device for metrics. The phase's first row is
flushed to the telemetry store at once (the phase controller sees the phase is live); later
rows every ``TELEMETRY_FLUSH_SECONDS`` and before each checkpoint (``sync``).

Beside the step function's own metrics a row carries the MoE telemetry (``moe/...`` columns,
computed inside the jitted step, ``model.moe.moe_step_metrics``) and, from the second row on,
``tokens_per_s`` and ``mfu`` (``Throughput``: host wall-clock over a trailing window of rows).
"""

from __future__ import annotations

import collections
import functools
import hashlib
import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np

from marin_assets.model.flops import PeakFlops, flops_per_token, peak_flops
from marin_assets.store.fsutil import filesystem, is_local
from marin_assets.telemetry import TelemetryWriter, default_root
from marin_assets.train.config import TrainConfig
from marin_assets.train.distributed import hosts as distributed
from marin_assets.train.hooks import StepInfo
from marin_assets.train.metrics import MetricsLogger, telemetry_fields

TELEMETRY_FLUSH_SECONDS = 5.0  # live metrics reach the store (and the phase controller) this often

# The per-step MoE columns (``moe/<name>``) and the per-layer ones (``moe/layer<i>/<name>``).
MOE_STEP_COLUMNS = ("drop_rate", "drop_rate_sender", "drop_rate_receiver", "load_max_over_mean", "load_cv", "router_z_loss")
MOE_LAYER_COLUMNS = ("drop_rate", "load_max_over_mean", "load_cv", "router_z_loss")

log = logging.getLogger(__name__)


class Throughput:
    """``tokens_per_s`` and ``mfu`` over the last ``window`` rows, on the host clock.

    A row is timed when its device values arrive (``host_row``'s ``device_get`` returns once
    the step is done; the loop has queued the next step by then). When the device is the
    bottleneck the interval between two rows is the step time; when the host is, a row read
    early (a checkpoint's ``sync``) makes one interval short and the next long, so the rate is
    taken over a trailing window of rows, and it includes whatever the loop did in it (a
    checkpoint, a telemetry flush). The first row of a phase (its interval would hold the
    compile) gets neither column, nor does the first row after a gap in the steps."""

    def __init__(self, peak: PeakFlops, clock: Callable[[], float] = time.perf_counter, window: int = 8):
        if window < 1:
            raise ValueError(f"Throughput.window must be >= 1, got {window}")
        self.peak, self.clock = peak, clock
        self._rows: collections.deque[tuple[int, int, float]] = collections.deque(maxlen=window + 1)  # (step, tokens, t)

    def columns(self, step: int, tokens: int, flops_per_token: float) -> dict[str, float]:
        """This row's throughput columns ({} for the first row, or after a gap in the steps)."""
        now = self.clock()
        if self._rows and step != self._rows[-1][0] + 1:
            self._rows.clear()
        self._rows.append((step, tokens, now))
        _, first_tokens, first_time = self._rows[0]
        if len(self._rows) < 2 or now <= first_time:
            return {}
        tokens_per_s = (tokens - first_tokens) / (now - first_time)
        return {"tokens_per_s": tokens_per_s, "mfu": tokens_per_s * flops_per_token / self.peak.flops_per_s}


class Emitter:
    """Writes each step's metrics row one step late (``push``, the hook), so the host never waits on the device."""

    def __init__(
        self,
        logger: MetricsLogger,
        log_fn: Callable[[dict], None] | None,
        telemetry: TelemetryWriter,
        peak: PeakFlops | None = None,
    ):
        """``peak``: MFU's denominator; by default ``flops.peak_flops()`` of every device, resolved here,
        before any step runs (a CPU's is measured, and a measurement beside a step would time both)."""
        self.logger, self.log_fn, self.telemetry = logger, log_fn, telemetry
        self.pending: StepInfo | None = None
        self.last_row: dict | None = None
        self.throughput = Throughput(peak or peak_flops())
        log.info("MFU peak: %.4g FLOP/s (%s)", self.throughput.peak.flops_per_s, self.throughput.peak.source)

    def push(self, info: StepInfo) -> None:
        """Write the previous step's row; hold this one until the next step (or a ``sync``)."""
        self.flush()
        # The loop builds row_fn as partial(host_row, ...): hand it the clock, so the row is timed
        # when it is made, whoever reads it first (a later hook sees the row that is logged).
        fn = info.row_fn
        if isinstance(fn, functools.partial) and fn.func is host_row and "throughput" not in fn.keywords:
            info.row_fn = functools.partial(fn, throughput=self.throughput)
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
        if not distributed.is_writer():  # metrics are replicated: process 0 speaks for all
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


def host_row(step: int, m: dict, config: TrainConfig, tokens: int, throughput: Throughput | None = None) -> dict:
    """The metrics row of ``step`` from the step function's device metrics ``m`` (one ``device_get``);
    with ``throughput``, timed there for ``tokens_per_s`` and ``mfu``."""
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
    if "moe" in m:
        row.update(moe_columns(m["moe"]))
    if throughput is not None:
        row.update(throughput.columns(step, tokens, flops_per_token(config.model, config.seq_len)))
    return row


def moe_columns(moe: dict) -> dict[str, float]:
    """``moe/<name>`` and ``moe/layer<i>/<name>`` columns from the host copy of ``moe_step_metrics``."""
    out = {f"moe/{name}": float(moe[name]) for name in MOE_STEP_COLUMNS}
    for name in MOE_LAYER_COLUMNS:
        for i, value in enumerate(np.asarray(moe[f"layer_{name}"]).tolist()):
            out[f"moe/layer{i}/{name}"] = float(value)
    return out


def default_telemetry_root() -> str:
    """``$MARIN_PREFIX/telemetry`` (``telemetry.default_root``)."""
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
