"""The MoE telemetry plot of a phase: drop rate (sender/receiver split) and expert-load CV over steps.

Drawn from metrics rows or a telemetry query (``TelemetryStore.query(..., latest=True)``), the
``moe/...`` columns ``train.emit`` writes each step. Returns PNG bytes, as the other plots do.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Sequence

from marin_assets.train.metrics import DROP_RATE, telemetry_rows

DROP_SERIES = (
    (DROP_RATE, "all", "C0"),
    ("moe/drop_rate_sender", "sender", "C1"),
    ("moe/drop_rate_receiver", "receiver", "C2"),
)
_LAYER_CV = re.compile(r"moe/layer(\d+)/load_cv")


def _series(rows: Sequence[dict], name: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the rows that carry ``name`` as a number (non-finite values kept: drawn as gaps)."""
    pairs = [(r["step"], float(r[name])) for r in rows if isinstance(r.get(name), (int, float))]
    return [s for s, _ in pairs], [v for _, v in pairs]


def _layers(rows: Sequence[dict]) -> list[int]:
    found = {int(m.group(1)) for r in rows for key in r if (m := _LAYER_CV.fullmatch(key))}
    return sorted(found)


def moe_telemetry_png(rows, title: str = "MoE telemetry") -> bytes:
    """Drop rate (all, sender, receiver; fraction of routed assignments) and load CV (the mean
    over layers, each layer faint) against step. ``rows``: metrics rows (dicts with ``step`` and
    the ``moe/...`` columns) or a long-format telemetry query (a polars frame)."""
    if not isinstance(rows, (list, tuple)) and hasattr(rows, "iter_rows"):
        rows = telemetry_rows(rows)
    steps, _ = _series(rows, DROP_RATE)
    if not steps:
        raise ValueError(
            "moe_telemetry_png: no row has a moe/drop_rate value (a dense run, or rows from before the MoE telemetry)"
        )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (drops, cv) = plt.subplots(1, 2, figsize=(10, 3.5), dpi=100)
    highest = 0.05  # an all-zero run still gets a readable axis
    for name, label, color in DROP_SERIES:
        x, y = _series(rows, name)
        drops.plot(x, y, lw=1.2, color=color, label=label)
        highest = max([highest, *(v for v in y if math.isfinite(v))])
    drops.set_ylim(0.0, 1.1 * highest)
    drops.set_xlabel("step")
    drops.set_ylabel("dropped / routed assignments")
    drops.set_title("drop rate")
    drops.legend(loc="upper right", fontsize=8)
    for layer in _layers(rows):
        x, y = _series(rows, f"moe/layer{layer}/load_cv")
        cv.plot(x, y, lw=0.6, color="0.6", alpha=0.7)
    x, y = _series(rows, "moe/load_cv")
    cv.plot(x, y, lw=1.4, color="C3", label="mean over layers")
    cv.set_xlabel("step")
    cv.set_ylabel("std / mean of expert load")
    cv.set_title("expert load CV (grey: each layer)")
    cv.legend(loc="upper right", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png")
    plt.close(fig)
    return png.getvalue()
