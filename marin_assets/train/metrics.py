"""Per-step metrics: an append-only metrics.jsonl, optional offline wandb, a loss-curve PNG.

The same rows go to the telemetry store (``telemetry_fields`` flattens one: numbers only,
``counts.<k>`` for the guard counters); ``telemetry_rows`` turns a store query back into
rows, which is what the loss curve is drawn from."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path


def read_metrics(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
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


class MetricsLogger:
    """Appends one JSON object per step to ``<out>/metrics.jsonl``.

    ``truncate_after(step)`` drops lines for steps the checkpoint being resumed from has not
    seen, so a killed-and-resumed run's file reads exactly like an uninterrupted one."""

    def __init__(self, out_dir: str | Path, use_wandb: bool = False, run_name: str = "train",
                 config: dict | None = None):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.out_dir / "metrics.jsonl"
        self._file = None
        self._wandb = None
        if use_wandb:
            os.environ.setdefault("WANDB_MODE", "offline")
            os.environ.setdefault("WANDB_SILENT", "true")
            import wandb

            self._wandb = wandb.init(project="marin-assets", name=run_name, dir=str(self.out_dir),
                                     config=config or {}, mode=os.environ["WANDB_MODE"], reinit=True)

    def truncate_after(self, step: int) -> None:
        rows = [r for r in read_metrics(self.path) if int(r["step"]) <= step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.replace(tmp, self.path)

    def write(self, row: dict) -> None:
        if self._file is None:
            self._file = open(self.path, "a")
        self._file.write(json.dumps({k: _jsonable(v) for k, v in row.items()}) + "\n")
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in row.items() if isinstance(v, (int, float))}, step=int(row["step"]))

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
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


def plot_loss_curve(rows, png_path: str | Path, title: str = "training loss") -> Path:
    """Rows (dicts with step/loss/skipped/phase) or a telemetry query (a polars frame)."""
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
        ax.scatter([r["step"] for r in skipped], [r["loss"] for r in skipped], color="red", s=12,
                   label="skipped", zorder=3)
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
    png_path = Path(png_path)
    fig.savefig(png_path)
    plt.close(fig)
    return png_path
