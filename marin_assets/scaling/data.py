"""Runs for scaling-law fits: one row per training run, validated before any fit.

A run is (params N, tokens D, flops C, loss). Either tokens or flops may be missing; the other
follows from C = 6 N D (the Chinchilla convention the anchor file uses). Rows with a missing,
NaN, infinite or non-positive value are never fitted and never dropped silently: each is
reported in ``excluded`` as {"row": i, "reason": ...} where i is the 0-based data row.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# Accepted column names, first match wins. The anchor file (Epoch AI's extraction of the
# Chinchilla paper) uses "Model Size" and "Training FLOP".
COLUMN_ALIASES: dict[str, tuple[str, ...]] = {
    "params": ("params", "Model Size", "N", "parameters"),
    "tokens": ("tokens", "D"),
    "flops": ("flops", "Training FLOP", "C", "compute"),
    "loss": ("loss", "Loss"),
}


@dataclass
class Runs:
    """Validated runs as float64 arrays of equal length, plus what was left out and why."""

    params: np.ndarray
    tokens: np.ndarray
    flops: np.ndarray
    loss: np.ndarray
    rows: np.ndarray  # 0-based row of each run in the input, for error messages
    excluded: list[dict] = field(default_factory=list)
    source: str = "<memory>"

    def __len__(self) -> int:
        return int(self.loss.size)

    def take(self, index) -> "Runs":
        """Subset (or resample, with repeated indices) of the runs; excluded rows are kept."""
        return Runs(
            self.params[index], self.tokens[index], self.flops[index], self.loss[index],
            self.rows[index], list(self.excluded), self.source,
        )


def _to_float(value) -> float:
    if value is None:
        return math.nan
    if isinstance(value, str):
        value = value.strip()
        if value == "":
            return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _value_problem(name: str, v: float) -> str | None:
    """Why a value cannot be fitted, or None. NaN first: it passes ``v <= 0``."""
    if math.isnan(v):
        return f"{name} is missing or NaN"
    if not math.isfinite(v):
        return f"{name} is infinite"
    if v <= 0:
        return f"{name} is non-positive ({v:g})"
    return None


def validate_runs(params=None, tokens=None, flops=None, loss=None, source: str = "<memory>") -> Runs:
    """Build ``Runs`` from columns (lists or arrays), deriving tokens or flops from C = 6 N D.

    At least one of tokens/flops must be given. A row is excluded, with its reason, when any
    value it needs is missing, not finite or not positive.
    """
    if params is None or loss is None:
        raise ValueError(f"{source}: need params and loss columns")
    if tokens is None and flops is None:
        raise ValueError(f"{source}: need a tokens or a flops column (D = C / (6 N))")
    n_rows = len(loss)
    columns = {"params": params, "tokens": tokens, "flops": flops, "loss": loss}
    values = {}
    for name, col in columns.items():
        if col is None:
            continue
        if len(col) != n_rows:
            raise ValueError(f"{source}: column {name} has {len(col)} rows, loss has {n_rows}")
        values[name] = np.array([_to_float(v) for v in col], dtype=np.float64)

    p = values["params"]
    t = values.get("tokens")
    c = values.get("flops")
    derived = "tokens" if t is None else "flops" if c is None else None
    with np.errstate(invalid="ignore", divide="ignore", over="ignore", under="ignore"):
        if t is None:
            t = c / (6.0 * p)
        if c is None:
            c = 6.0 * p * t

    keep = np.ones(n_rows, dtype=bool)
    excluded: list[dict] = []
    for i in range(n_rows):
        reasons = [_value_problem(name, arr[i]) for name, arr in values.items()]
        reasons = [r for r in reasons if r]
        if not reasons and derived is not None:  # C = 6 N D can overflow or underflow
            problem = _value_problem(derived, (t if derived == "tokens" else c)[i])
            if problem:
                reasons.append(f"{problem} (derived from C = 6 N D)")
        if reasons:
            keep[i] = False
            excluded.append({"row": i, "reason": "; ".join(reasons)})
    rows = np.arange(n_rows)
    return Runs(p[keep], t[keep], c[keep], values["loss"][keep], rows[keep], excluded, source)


def _pick(header: list[str], name: str) -> str | None:
    for alias in COLUMN_ALIASES[name]:
        if alias in header:
            return alias
    return None


def load_runs_csv(path: str | Path) -> Runs:
    """Read runs from a CSV with columns params, tokens or flops, loss (aliases accepted)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            header = list(reader.fieldnames or [])
            rows = list(reader)
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text (byte {err.start})") from None
    except csv.Error as err:  # a NUL byte, an over-long field, a broken quote
        raise ValueError(f"{path}: after line {reader.line_num}: unreadable CSV: {err}") from None
    cols = {name: _pick(header, name) for name in COLUMN_ALIASES}
    missing = [name for name in ("params", "loss") if cols[name] is None]
    if missing or (cols["tokens"] is None and cols["flops"] is None):
        need = missing + ([] if cols["tokens"] or cols["flops"] else ["tokens or flops"])
        raise ValueError(f"{path}: missing column(s) {need}; header is {header}")
    data = {name: ([r.get(col) for r in rows] if col else None) for name, col in cols.items()}
    return validate_runs(**data, source=str(path))


def drop_highest_loss(runs: Runs, count: int) -> Runs:
    """The published Chinchilla protocol drops the ``count`` highest-loss runs (outliers from
    the smallest models); they are recorded in ``excluded`` like any other dropped row."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"drop count must be a non-negative integer, got {count!r}")
    if count == 0:
        return runs
    if count >= len(runs):
        raise ValueError(f"{runs.source}: cannot drop {count} of {len(runs)} runs")
    order = np.argsort(runs.loss, kind="stable")
    kept, dropped = np.sort(order[:-count]), order[-count:]
    out = runs.take(kept)
    for j in dropped:
        out.excluded.append({"row": int(runs.rows[j]), "reason": f"dropped as one of the {count} highest-loss runs (loss={runs.loss[j]:g})"})
    return out


def bucket_flops(flops: float, base: float = 1.1) -> float:
    """Round a FLOP count to the nearest power of ``base`` (Marin's budget buckets: with 1.1,
    ~10%-wide log-spaced buckets), so runs that aimed at one budget and landed a few percent
    apart are analysed together."""
    if not base > 1:
        raise ValueError(f"bucket base must be > 1, got {base}")
    if not (flops > 0 and math.isfinite(flops)):
        raise ValueError(f"flops must be finite and > 0, got {flops}")
    return float(base ** round(math.log(flops) / math.log(base)))
