"""Percentile bootstrap: refit on resampled runs, report the spread of every fitted number."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from marin_assets.numeric_checks import check_float, check_int

MAX_RESAMPLES = 100_000


@dataclass(frozen=True)
class BootstrapConfig:
    n: int = 200  # resamples; tests use a handful
    seed: int = 0
    level: float = 0.95  # two-sided confidence level of the percentile interval

    def __post_init__(self) -> None:
        check_int("bootstrap n", self.n, 0, MAX_RESAMPLES)
        check_int("bootstrap seed", self.seed, 0, 2**63 - 1)
        check_float("bootstrap level", self.level, 0, 1, lo_open=True)
        if self.level == 1:
            raise ValueError("bootstrap level must be in (0, 1), got 1")


def bootstrap(
    refit: Callable[[np.random.Generator], dict[str, float] | None],
    config: BootstrapConfig,
) -> dict:
    """Call ``refit(rng)`` ``config.n`` times; each call resamples its own data with ``rng`` and
    returns the fitted numbers, or None when the resample cannot be fitted (e.g. a budget lost
    its interior minimum). Returns {"n", "n_ok", "level", "ci": {name: [low, high]}, "std": {...}}.
    Failed resamples are counted, not hidden: n - n_ok of them.
    """
    rng = np.random.default_rng(config.seed)
    samples: dict[str, list[float]] = {}
    n_ok = 0
    for _ in range(config.n):
        try:
            values = refit(rng)
        except (ValueError, RuntimeError, np.linalg.LinAlgError):
            values = None
        if values is None:
            continue
        n_ok += 1
        for name, value in values.items():
            samples.setdefault(name, []).append(float(value))
    tail = 100.0 * (1.0 - config.level) / 2.0
    ci, std = {}, {}
    for name, vals in samples.items():
        arr = np.asarray(vals)
        arr = arr[np.isfinite(arr)]
        if arr.size == 0:
            continue
        ci[name] = [float(np.percentile(arr, tail)), float(np.percentile(arr, 100.0 - tail))]
        std[name] = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
    return {"n": config.n, "n_ok": n_ok, "level": config.level, "seed": config.seed, "ci": ci, "std": std}
