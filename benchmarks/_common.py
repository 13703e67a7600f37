"""Shared bits of the benchmark scripts: the one-JSON-line-per-figure convention."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

# The demo's main-run model (assets/run_plan.py DEMO_BASE.model) on byte tokens: what the benchmarks that
# measure the demo's model start from (set max_seq_len to the context they run).
DEMO_MODEL = {
    "vocab_size": 257,
    "d_model": 64,
    "n_layers": 2,
    "n_heads": 4,
    "n_kv_heads": 2,
    "d_ff": 128,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "top_k": 2,
    "expert_d_ff": 64,
}


def emit(name: str, unit: str, ours: float, reference: float, higher_is_better: bool, **extra) -> dict:
    """Print one figure. ``ratio`` > 1 always means we are better."""
    ratio = ours / reference if higher_is_better else reference / ours
    line = {
        "name": name,
        "unit": unit,
        "ours": round(ours, 6),
        "reference": round(reference, 6),
        "ratio": round(ratio, 4),
        **extra,
    }
    print(json.dumps(line), flush=True)
    return line


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def compiled_bytes(stats, prefix: str = "") -> int:
    """argument + output + temp - alias bytes of a compiled executable's ``memory_analysis()``: what one
    call holds at its peak by XLA's buffer assignment (per device). ``prefix="host_"``: the same of host memory
    (fields a backend does not report count 0)."""

    def field(name: str) -> int:
        return int(getattr(stats, f"{prefix}{name}_size_in_bytes", 0) or 0)

    return field("argument") + field("output") + field("temp") - field("alias")
