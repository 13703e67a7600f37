"""PNG figures for a fit: IsoFLOP curves, power laws with the extrapolation, predicted vs actual.

Each function returns the PNG bytes and, given ``path``, also writes them there. matplotlib is
imported lazily with the Agg backend so this works on headless machines and keeps imports fast.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from marin_assets.scaling.data import Runs
from marin_assets.scaling.fits import IsoFlopResult, group_by_budget


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, plt, path: str | Path | None) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    data = buf.getvalue()
    if path is not None:
        Path(path).write_bytes(data)
    return data


def plot_isoflop_curves(runs: Runs, result: IsoFlopResult, path: str | Path | None = None, bucket_base: float = 1.1) -> bytes:
    """Loss against tokens per budget, the fitted parabola, and its vertex."""
    plt = _figure()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    groups = group_by_budget(runs.flops, bucket_base)
    colors = plt.cm.viridis(np.linspace(0, 0.9, max(len(groups), 1)))
    fitted = {o.budget: o for o in result.optima}
    for color, (budget, idx) in zip(colors, groups.items()):
        ax.scatter(runs.tokens[idx], runs.loss[idx], color=color, s=18, label=f"C={budget:.2g}")
        opt = fitted.get(budget)
        if opt is not None:
            xs = np.geomspace(opt.fit_tokens.x_min, opt.fit_tokens.x_max, 100)
            ax.plot(xs, opt.fit_tokens(xs), color=color, lw=1)
            ax.scatter([opt.tokens_opt], [opt.loss_opt], marker="x", color="black", s=50, zorder=3)
    ax.set_xscale("log")
    ax.set_xlabel("tokens D")
    ax.set_ylabel("loss")
    ax.set_title("IsoFLOP curves (x = fitted optimum)")
    ax.legend(fontsize=7)
    return _save(fig, plt, path)


def plot_power_laws(result: IsoFlopResult, extrapolate_to: float | None = None, path: str | Path | None = None) -> bytes:
    """N*(C) and D*(C) at the fitted budgets, with the power laws drawn out to ``extrapolate_to``."""
    plt = _figure()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    budgets = np.array([o.budget for o in result.optima])
    hi = max(budgets.max(), extrapolate_to or 0.0)
    xs = np.geomspace(budgets.min(), hi, 100)
    ax.scatter(budgets, [o.params_opt for o in result.optima], label="N* (vertex)", color="C0")
    ax.scatter(budgets, [o.tokens_opt for o in result.optima], label="D* (vertex)", color="C1")
    ax.plot(xs, result.n_opt(xs), color="C0", label=f"N* = {result.n_opt.k:.3g} C^{result.n_opt.exponent:.3f}")
    ax.plot(xs, result.d_opt(xs), color="C1", label=f"D* = {result.d_opt.k:.3g} C^{result.d_opt.exponent:.3f}")
    if extrapolate_to:
        ax.axvline(extrapolate_to, color="gray", ls="--", lw=1)
        ax.scatter(
            [extrapolate_to] * 2,
            [result.n_opt(extrapolate_to), result.d_opt(extrapolate_to)],
            marker="*",
            s=120,
            color="red",
            zorder=3,
            label="extrapolation",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("compute C (FLOPs)")
    ax.set_title("Compute-optimal size and tokens")
    ax.legend(fontsize=7)
    return _save(fig, plt, path)


def plot_predicted_vs_actual(budgets, predicted, actual, path: str | Path | None = None) -> bytes:
    """Predicted against measured loss per budget, with the y = x line and relative errors."""
    plt = _figure()
    budgets = np.asarray(budgets, dtype=np.float64)
    predicted = np.asarray(predicted, dtype=np.float64)
    actual = np.asarray(actual, dtype=np.float64)
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.scatter(actual, predicted, color="C3")
    for c, p, a in zip(budgets, predicted, actual):
        ax.annotate(f"C={c:.2g}: {100 * (p - a) / a:+.2f}%", (a, p), fontsize=7, xytext=(4, 4), textcoords="offset points")
    lo = float(min(predicted.min(), actual.min()))
    hi = float(max(predicted.max(), actual.max()))
    pad = 0.02 * (hi - lo + 1e-9)
    ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="gray", ls="--", lw=1)
    ax.set_xlabel("actual loss")
    ax.set_ylabel("predicted loss")
    ax.set_title("Scaling-law prediction vs actual")
    return _save(fig, plt, path)


def plot_extrapolation(fitted, law, targets, title: str = "", path: str | Path | None = None) -> bytes:
    """Loss against compute: ``fitted`` (budget, vertex loss) optima, the fitted loss ``law``
    drawn out past the targets, and ``targets`` (flops, predicted, low, high, actual, name):
    each prediction with its interval (NaN: none) beside the loss its run reached."""
    from marin_assets.scaling.ladder import loss_at  # deferred (import cost): polars, pyarrow

    plt = _figure()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    budgets = [b for b, _ in fitted] + [t[0] for t in targets]
    xs = np.geomspace(min(budgets) / 1.2, max(budgets) * 1.2, 200)
    ax.plot(xs, [loss_at(law, float(x)) for x in xs], color="gray", lw=1, label=f"fitted law ({law['kind']})")
    ax.scatter([b for b, _ in fitted], [loss for _, loss in fitted], color="C0", zorder=3, label="ladder optima (fitted)")
    for flops, predicted, low, high, actual, name in targets:
        if np.isfinite(low) and np.isfinite(high):
            ax.errorbar([flops], [predicted], yerr=[[predicted - low], [high - predicted]], color="C1", capsize=4)
        ax.scatter([flops], [predicted], marker="s", color="C1", zorder=3)
        ax.scatter([flops], [actual], marker="*", s=120, color="C3", zorder=4)
        ax.annotate(
            f"{name}: {100 * (predicted - actual) / actual:+.2f}%",
            (flops, actual),
            fontsize=7,
            xytext=(5, -10),
            textcoords="offset points",
        )
    ax.scatter([], [], marker="s", color="C1", label="pre-registered prediction (interval: the fit's seeds and the runs' noise)")
    ax.scatter([], [], marker="*", s=120, color="C3", label="actual (mean of the target's runs)")
    ax.set_xscale("log")
    ax.set_xlabel("compute C (FLOPs)")
    ax.set_ylabel("validation loss")
    ax.set_title(title or "Extrapolation: predicted before the runs, then run")
    ax.legend(fontsize=7)
    return _save(fig, plt, path)
