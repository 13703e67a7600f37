"""argparse value types shared by the subcommands: refuse bad flags before any work."""

from __future__ import annotations

import argparse
import math


def finite_float(text: str) -> float:
    """A float flag that refuses nan, inf and non-numbers (argparse names the flag)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def positive_int(text: str) -> int:
    """An integer flag of at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return int(text)
