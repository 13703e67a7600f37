"""Peak heap of one call: Python/numpy allocations (tracemalloc) plus Arrow's memory pool.

Peak RSS of a whole process is dominated by imports (~100 MB for numpy + pyarrow) and
never goes down, so it cannot show whether one step's memory grows with its input. This
measures what the step itself allocates: numpy reports its buffers to tracemalloc, and
Arrow buffers (Parquet reads, concatenation) are counted by a proxy pool installed as the
default for the duration of the call.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
# Buffers allocated through a proxy pool may outlive the call (caches, returned tables) and
# free through it later, so every proxy is kept alive (a few hundred bytes each).
_PROXIES: list = []


def peak_heap_bytes(fn: Callable[[], T]) -> tuple[T, int]:
    """(fn(), peak bytes held during the call: tracemalloc peak + Arrow pool peak)."""
    import pyarrow as pa

    base = pa.default_memory_pool()
    proxy = pa.proxy_memory_pool(base)
    _PROXIES.append(proxy)
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    start, _ = tracemalloc.get_traced_memory()
    pa.set_memory_pool(proxy)
    try:
        result = fn()
    finally:
        pa.set_memory_pool(base)
        _, peak = tracemalloc.get_traced_memory()
        if not was_tracing:
            tracemalloc.stop()
    return result, (peak - start) + proxy.max_memory()
