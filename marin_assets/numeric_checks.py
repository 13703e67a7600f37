"""Checks for numbers that come from config files, CSVs and flags: finite first, then range.

NaN passes every comparison test (``nan <= 0`` is False), so a range check alone lets it
through; every check here tests ``math.isfinite`` before the bounds. Messages name the field.
This is the one home for these checks: DataKit, training, scaling and cluster configs use it.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

_SCALARS = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,)}


def check_int(what: str, value: Any, lo: int | None = None, hi: int | None = None) -> int:
    """An integer (not a bool, not a float) in [lo, hi], or a ValueError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{what} must be an integer, got {_show(value)}")
    value = int(value)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        shown = value if abs(value) < 10**30 else f"an integer of about {_digits(value)} digits"
        raise ValueError(f"{what} must be in [{_bound(lo, '-inf')}, {_bound(hi, 'inf')}], got {shown}")
    return value


def check_float(
    what: str, value: Any, lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False
) -> float:
    """A finite number within the bounds (open where asked), or a ValueError naming ``what``.

    Finiteness first: NaN passes every comparison test such as ``x <= 0``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{what} must be a number, got {_show(value)}")
    interval = f"{'(' if lo_open else '['}{_bound(lo, '-inf')}, {_bound(hi, 'inf')}{')' if hi_open else ']'}"
    try:
        value = float(value)
    except OverflowError:
        digits = _digits(int(math.trunc(value)))  # int(x) of a Real; typeshed's numbers.Real declares no __int__
        raise ValueError(f"{what} must be in {interval}, got an integer of about {digits} digits") from None
    if not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {value}")
    below = lo is not None and (value <= lo if lo_open else value < lo)
    above = hi is not None and (value >= hi if hi_open else value > hi)
    if below or above:
        raise ValueError(f"{what} must be in {interval}, got {value:g}")
    return value


def check_field_types(obj) -> None:
    """Every scalar field of a config dataclass has its declared type, and every float is finite.

    Runs first in ``__post_init__``: range checks like ``x <= 0`` let NaN through and raise
    TypeError on a string, so the field is named here instead. Handles ``int``, ``float``,
    ``str``, ``bool`` and ``X | None`` annotations; other fields are checked by their owner.
    """
    where = type(obj).__name__
    for f in dataclasses.fields(obj):
        annotation = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", None) or str(f.type)
        declared = annotation.replace(" ", "")
        optional = declared.endswith("|None")
        kinds = _SCALARS.get(declared.removesuffix("|None"))
        value = getattr(obj, f.name)
        if kinds is None or (optional and value is None):
            continue
        if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
            raise ValueError(f"{where}.{f.name} must be {declared.replace('|', ' | ')}, got {type(value).__name__} {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{where}.{f.name} must be finite, got {value!r}")


def _bound(value: float | None, missing: str) -> str:
    if value is None:
        return missing
    return str(value) if isinstance(value, int) else f"{value:g}"


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _digits(value: int) -> int:
    # str() of a huge int is slow and, past 4300 digits, refused; the bit length is enough.
    return int(value.bit_length() * math.log10(2)) + 1
