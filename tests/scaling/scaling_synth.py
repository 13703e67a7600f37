"""Shared helpers for the scaling tests: synthetic runs from a known Chinchilla law."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from marin_assets.scaling.data import validate_runs
from marin_assets.scaling.parametric import ParametricFit

# The anchor file lives next to the repo (../shared/anchors in CI and here).
ANCHOR_CSV = Path(__file__).resolve().parents[2] / ".." / "shared" / "anchors" / "chinchilla_svg_extracted.csv"

# A known law to sample from (shape close to the Chinchilla fit, different numbers so the test
# cannot pass by echoing published values). Optimal exponents: a = beta/(alpha+beta), b = alpha/(alpha+beta).
TRUE_LAW = ParametricFit(E=1.7, A=400.0, B=1500.0, alpha=0.34, beta=0.28, n=0, objective=0.0)
TRUE_N_EXPONENT = 0.28 / 0.62
TRUE_D_EXPONENT = 0.34 / 0.62


def isoflop_sweep(budgets, noise: float, seed: int = 0, sizes: int = 7, span: float = 8.0):
    """Runs at each budget: ``sizes`` model sizes log-spaced from N*/span to N*·span around the
    true optimum, D = C / (6N), loss = law · (1 + noise · standard normal)."""
    rng = np.random.default_rng(seed)
    params, tokens, flops, loss = [], [], [], []
    for c in budgets:
        n_opt, _ = TRUE_LAW.optimal_allocation(c)
        for f in np.geomspace(1.0 / span, span, sizes):
            n = float(n_opt) * f
            d = c / (6.0 * n)
            params.append(n)
            tokens.append(d)
            flops.append(c)
            loss.append(float(TRUE_LAW.predict(n, d)) * (1.0 + noise * rng.normal()))
    return params, tokens, flops, loss


def sweep_runs(noise: float = 0.002, seed: int = 0):
    p, t, c, l = isoflop_sweep([1e17, 3e17, 1e18, 3e18, 1e19], noise=noise, seed=seed)
    return validate_runs(params=p, tokens=t, flops=c, loss=l)
