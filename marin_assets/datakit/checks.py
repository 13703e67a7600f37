"""Range checks for DataKit config fields, with the field named in every message.

Floats are checked with `math.isfinite` before any range comparison: NaN fails every
comparison, so `not 0 <= x <= 1` alone would let it through as "in range" in some forms
(`x < 0 or x > 1` is False for NaN). Integers must be real ints (not bools, not floats
from YAML), so `shard_docs: .nan` cannot slip past `x < 1`.
"""

from __future__ import annotations

import math


def check_float(
    field: str, value, lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False
) -> float:
    """`value` as a float, if it is a finite number within the given bounds; else ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{field} must be a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{field} must be a finite number, got {value!r}")
    below = lo is not None and (value <= lo if lo_open else value < lo)
    above = hi is not None and (value >= hi if hi_open else value > hi)
    if below or above:
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        interval = f"{left}{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}{right}"
        raise ValueError(f"{field} must be in {interval}, got {value!r}")
    return float(value)


def check_int(field: str, value, lo: int | None = None, hi: int | None = None) -> int:
    """`value` if it is an int (not a bool) within [lo, hi]; else ValueError naming `field`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{field} must be an integer, got {type(value).__name__} {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ValueError(f"{field} must be in [{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}], got {value}")
    return value
