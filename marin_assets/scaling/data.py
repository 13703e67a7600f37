"""Runs for scaling-law fits: one row per training run, validated before any fit.

A run is (params N, tokens D, flops C, loss). Either tokens or flops may be missing; the other
follows from C = 6 N D (the Chinchilla convention the anchor file uses). Rows with a missing,
NaN, infinite or non-positive value are never fitted and never dropped silently: each is
reported in ``excluded`` as {"row": i, "reason": ...} where i is the 0-based data row.
"""

from __future__ import annotations

import csv
import itertools
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

    def take(self, index) -> Runs:
        """Subset (or resample, with repeated indices) of the runs; excluded rows are kept."""
        return Runs(
            self.params[index],
            self.tokens[index],
            self.flops[index],
            self.loss[index],
            self.rows[index],
            list(self.excluded),
            self.source,
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


def _to_floats(column) -> np.ndarray:
    """``_to_float`` of every value. float() strips whitespace itself, so where it accepts every
    value (the common case) it agrees with ``_to_float`` and runs ~10x faster than calling it."""
    try:
        return np.fromiter(map(float, column), dtype=np.float64, count=len(column))
    except (TypeError, ValueError):
        return np.array([_to_float(v) for v in column], dtype=np.float64)


def _value_problem(name: str, v: float) -> str | None:
    """Why a value cannot be fitted, or None. NaN first: it passes ``v <= 0``."""
    if math.isnan(v):
        return f"{name} is missing or NaN"
    if not math.isfinite(v):
        return f"{name} is infinite"
    if v <= 0:
        return f"{name} is non-positive ({v:g})"
    return None


def _unfittable(values: np.ndarray) -> np.ndarray:
    """Rows ``_value_problem`` objects to, for a whole column at once."""
    return ~(np.isfinite(values) & (values > 0))


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
        values[name] = _to_floats(col)

    p = values["params"]
    t = values.get("tokens")
    c = values.get("flops")
    derived = "tokens" if t is None else "flops" if c is None else None
    with np.errstate(invalid="ignore", divide="ignore", over="ignore", under="ignore"):
        if t is None:
            t = c / (6.0 * p)
        if c is None:
            c = 6.0 * p * t

    bad = np.zeros(n_rows, dtype=bool)
    for arr in values.values():
        bad |= _unfittable(arr)
    if derived is not None:
        bad |= _unfittable(t if derived == "tokens" else c)
    excluded: list[dict] = []
    for i in np.flatnonzero(bad).tolist():  # the reasons, row by row, only where there are some
        reasons = [r for r in (_value_problem(name, arr[i]) for name, arr in values.items()) if r]
        if not reasons and derived is not None:  # C = 6 N D can overflow or underflow
            problem = _value_problem(derived, (t if derived == "tokens" else c)[i])
            if problem:
                reasons.append(f"{problem} (derived from C = 6 N D)")
        excluded.append({"row": i, "reason": "; ".join(reasons)})
    keep = ~bad
    rows = np.arange(n_rows)
    return Runs(p[keep], t[keep], c[keep], values["loss"][keep], rows[keep], excluded, source)


def _pick(header: list[str], name: str) -> str | None:
    for alias in COLUMN_ALIASES[name]:
        if alias in header:
            return alias
    return None


def load_runs_csv(path: str | Path) -> Runs:
    """Read runs from a CSV with columns params, tokens or flops, loss (aliases accepted).

    Columns are kept as float arrays while reading, a block of rows at a time: a million rows
    as Python strings (or one dict per row) would cost hundreds of MB before any fit."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            reader = _LineTrackingReader(fh)
            header = next(reader, [])
            cols = {name: _pick(header, name) for name in COLUMN_ALIASES}
            missing = [name for name in ("params", "loss") if cols[name] is None]
            if missing or (cols["tokens"] is None and cols["flops"] is None):
                need = missing + ([] if cols["tokens"] or cols["flops"] else ["tokens or flops"])
                raise ValueError(f"{path}: missing column(s) {need}; header is {header}")
            data = _read_columns(reader, {name: col for name, col in cols.items() if col}, header)
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text (byte {err.start})") from None
    except csv.Error as err:  # a NUL byte, an over-long field, a broken quote
        raise ValueError(f"{path}: after line {reader.line_num}: unreadable CSV: {err}") from None
    return validate_runs(**data, source=str(path))


_CSV_BLOCK_ROWS = 65536


class _LineTrackingReader:
    """csv.reader that keeps, as ``line_num``, the last line of the last complete row: what an
    error's "after line N" names (csv.reader's own count includes the row that failed)."""

    def __init__(self, fh) -> None:
        self._reader = csv.reader(fh)
        self.line_num = 0

    def __iter__(self) -> _LineTrackingReader:
        return self

    def __next__(self) -> list[str]:
        row = next(self._reader)
        self.line_num = self._reader.line_num
        return row


def _read_columns(reader, cols: dict[str, str], header: list[str]) -> dict[str, np.ndarray]:
    """The named columns of every non-blank row as floats (``_to_float``: a short row's missing
    cells are NaN). A name repeated in the header reads its last column, as csv.DictReader does."""
    where = {name: len(header) - 1 - header[::-1].index(col) for name, col in cols.items()}
    blocks: dict[str, list[np.ndarray]] = {name: [] for name in where}
    while block := list(itertools.islice(reader, _CSV_BLOCK_ROWS)):
        rows = [row for row in block if row]
        for name, j in where.items():
            blocks[name].append(_to_floats([row[j] if j < len(row) else None for row in rows]))
    return {name: np.concatenate(parts) if parts else np.zeros(0) for name, parts in blocks.items()}


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
        out.excluded.append(
            {"row": int(runs.rows[j]), "reason": f"dropped as one of the {count} highest-loss runs (loss={runs.loss[j]:g})"}
        )
    return out


SUBSAMPLE_SEED = 0


def deterministic_subsample(n: int, k: int) -> np.ndarray:
    """Sorted indices of ``k`` of ``n`` rows (all of them when n <= k): a uniform draw without
    replacement from a fixed seed, so a capped fit is unbiased and the same on every run."""
    if n <= k:
        return np.arange(n)
    return np.sort(np.random.default_rng(SUBSAMPLE_SEED).choice(n, size=k, replace=False))


def bucket_flops(flops: float, base: float = 1.1) -> float:
    """Round a FLOP count to the nearest power of ``base`` (Marin's budget buckets: with 1.1,
    ~10%-wide log-spaced buckets), so runs that aimed at one budget and landed a few percent
    apart are analysed together."""
    if not base > 1:
        raise ValueError(f"bucket base must be > 1, got {base}")
    if not (flops > 0 and math.isfinite(flops)):
        raise ValueError(f"flops must be finite and > 0, got {flops}")
    return float(base ** round(math.log(flops) / math.log(base)))
