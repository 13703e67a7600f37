"""Shared bits of the benchmark scripts: the one-JSON-line-per-figure convention."""

from __future__ import annotations

import json
import time
from collections.abc import Callable


def emit(name: str, unit: str, ours: float, reference: float, higher_is_better: bool, **extra) -> dict:
    """Print one figure. ``ratio`` > 1 always means we are better."""
    ratio = ours / reference if higher_is_better else reference / ours
    line = {"name": name, "unit": unit, "ours": round(ours, 6), "reference": round(reference, 6), "ratio": round(ratio, 4), **extra}
    print(json.dumps(line), flush=True)
    return line


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value
