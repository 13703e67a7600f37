"""Per-step metrics: an append-only metrics.jsonl, optional offline wandb, a loss-curve PNG,
in a local dir or at any fsspec URL (``gs://``, ``memory://``).

The same rows go to the telemetry store (``telemetry_fields`` flattens one: numbers only,
``counts.<k>`` for the guard counters); ``telemetry_rows`` turns a store query back into
rows, which is what the loss curve is drawn from."""

from __future__ import annotations

import io
import json
import math
import os
from pathlib import Path

from marin_assets.store.fsutil import child, filesystem, is_local, write_bytes_atomic

METRICS_FILE = "metrics.jsonl"
# An MoE step's drop rate as its row names it (metrics["moe"]["drop_rate"] flattened): dropped / routed assignments.
DROP_RATE = "moe/drop_rate"


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The rows of a metrics.jsonl (a local path or an fsspec URL); [] when there is none."""
    fs, where = filesystem(os.fspath(path))
    try:
        with fs.open(where, "rb") as f:
            text = f.read().decode("utf-8")
    except FileNotFoundError:
        return []
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except ValueError:
            break  # a torn last line from a killed writer; everything after it is suspect
    return rows


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep it readable
    return value


def _lines(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode("utf-8")


class MetricsLogger:
    """Appends one JSON object per step to ``<out>/metrics.jsonl``; ``out`` is a local dir or
    any fsspec URL (``gs://...``; ``path`` is then a URL string, else a ``Path``).

    On a local disk rows are appended to the open file. Object stores cannot append: the rows
    are kept here and the whole file is replaced (one PUT) on ``flush`` (the loop flushes before
    every checkpoint, so the file always covers the newest checkpoint) and ``close``.
    ``truncate_after(step)`` drops lines for steps the checkpoint being resumed from has not
    seen, so a killed-and-resumed run's file reads exactly like an uninterrupted one."""

    def __init__(self, out_dir: str | os.PathLike, use_wandb: bool = False, run_name: str = "train", config: dict | None = None):
        self.fs, root = filesystem(os.fspath(out_dir))
        self.fs.makedirs(root, exist_ok=True)
        self.path = child(out_dir, METRICS_FILE)
        self._where = filesystem(os.fspath(self.path))[1]
        self._local = is_local(self.fs)
        self._file = None  # local: the append handle
        self._rows: list[dict] | None = None  # object store: the whole file, rewritten on flush
        self._dirty = False
        self._wandb = None
        if use_wandb:
            os.environ.setdefault("WANDB_MODE", "offline")
            os.environ.setdefault("WANDB_SILENT", "true")
            import wandb

            # wandb writes to a local dir: the out dir when local, else its default (./wandb)
            self._wandb = wandb.init(
                project="marin-assets",
                name=run_name,
                dir=root if self._local else None,
                config=config or {},
                mode=os.environ["WANDB_MODE"],
                reinit=True,
            )

    def exists(self) -> bool:
        return self.fs.exists(self._where)

    def truncate_after(self, step: int) -> None:
        """Keep the rows up to ``step`` (a no-op when there is no file yet)."""
        self._close_file()
        if not self.exists():
            return
        rows = [r for r in read_metrics(self.path) if int(r["step"]) <= step]
        write_bytes_atomic(self.fs, self._where, _lines(rows))
        self._rows, self._dirty = None, False

    def write(self, row: dict) -> None:
        stored = {k: _jsonable(v) for k, v in row.items()}
        if self._local:
            if self._file is None:
                self._file = open(self._where, "a")
            self._file.write(json.dumps(stored) + "\n")
        else:
            if self._rows is None:
                self._rows = read_metrics(self.path)  # what earlier attempts left (already truncated)
            self._rows.append(stored)
            self._dirty = True
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in row.items() if isinstance(v, (int, float))}, step=int(row["step"]))

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()
        if self._dirty:
            write_bytes_atomic(self.fs, self._where, _lines(self._rows))
            self._dirty = False

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def close(self) -> None:
        self.flush()
        self._close_file()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def telemetry_fields(row: dict) -> dict[str, float]:
    """A metrics row as telemetry metrics: numeric fields (bools as 0/1), counts as counts.<k>;
    step and phase travel as the store's own columns."""
    out: dict[str, float] = {}
    for key, value in row.items():
        if key in ("step", "phase"):
            continue
        if isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in value.items() if isinstance(v, (bool, int, float))})
        elif isinstance(value, (bool, int, float)):
            out[key] = value
    return out


def telemetry_rows(frame) -> list[dict]:
    """Rows {step, phase, <metric>: value} from a long-format telemetry query, by step
    (pass a ``latest=True`` query: one value per metric and step)."""
    rows: dict[int, dict] = {}
    for metric, step, value, phase in frame.select("metric", "step", "value", "phase").iter_rows():
        row = rows.setdefault(step, {"step": step, "phase": phase})
        row[metric] = math.nan if value is None else value
    for row in rows.values():
        if "skipped" in row:
            row["skipped"] = row["skipped"] == 1
    return [rows[s] for s in sorted(rows)]


def plot_loss_curve(rows, png_path: str | os.PathLike, title: str = "training loss") -> Path | str:
    """Rows (dicts with step/loss/skipped/phase) or a telemetry query (a polars frame), drawn
    to ``png_path`` (a local path or an fsspec URL; returned as ``child`` spells it)."""
    if not isinstance(rows, (list, tuple)) and hasattr(rows, "iter_rows"):
        rows = telemetry_rows(rows)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if isinstance(r.get("loss"), (int, float))]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    steps = [r["step"] for r in rows]
    ax.plot(steps, [r["loss"] for r in rows], lw=1.2, label="loss")
    skipped = [r for r in rows if r.get("skipped")]
    if skipped:
        ax.scatter([r["step"] for r in skipped], [r["loss"] for r in skipped], color="red", s=12, label="skipped", zorder=3)
    phases = {}
    for r in rows:
        phases.setdefault(r.get("phase"), r["step"])
    for name, start in phases.items():
        if name and start != (steps[0] if steps else None):
            ax.axvline(start, color="grey", ls=":", lw=1)
            ax.text(start, ax.get_ylim()[1], f" {name}", va="top", fontsize=8)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png")
    plt.close(fig)
    fs, where = filesystem(os.fspath(png_path))
    write_bytes_atomic(fs, where, png.getvalue())
    return child(png_path)
