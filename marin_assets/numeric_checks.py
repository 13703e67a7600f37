"""Checks for numbers that come from config files, CSVs and flags: finite first, then range.

NaN passes every comparison test (``nan <= 0`` is False), so a range check alone lets it
through; every check here tests ``math.isfinite`` before the bounds. Messages name the field.
"""

from __future__ import annotations

import math
import numbers
from typing import Any


def check_int(what: str, value: Any, lo: int, hi: int) -> int:
    """An integer (not a bool, not a float) in [lo, hi], or a ValueError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{what} must be an integer, got {_show(value)}")
    value = int(value)
    if not lo <= value <= hi:
        shown = value if abs(value) < 10**30 else f"an integer of about {_digits(value)} digits"
        raise ValueError(f"{what} must be in [{lo}, {hi}], got {shown}")
    return value


def check_float(what: str, value: Any, lo: float, hi: float, *, lo_open: bool = False) -> float:
    """A finite number in [lo, hi] ((lo, hi] with ``lo_open``), or a ValueError naming ``what``.

    Finiteness first: NaN passes every comparison test such as ``x <= 0``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{what} must be a number, got {_show(value)}")
    try:
        value = float(value)
    except OverflowError:
        raise ValueError(f"{what} must be in {'(' if lo_open else '['}{lo:g}, {hi:g}], got an integer of "
                         f"about {_digits(int(value))} digits") from None
    if not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {value}")
    if value < lo or (lo_open and value == lo) or value > hi:
        raise ValueError(f"{what} must be in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {value:g}")
    return value


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _digits(value: int) -> int:
    # str() of a huge int is slow and, past 4300 digits, refused; the bit length is enough.
    return int(value.bit_length() * math.log10(2)) + 1
