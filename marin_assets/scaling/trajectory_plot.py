"""The ladder watch's plot: the main run against the ladder's band (``marin_assets.scaling.trajectory``
draws the band and judges the run; this only draws them)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from marin_assets.scaling.trajectory import METRICS, Curve, Expected, LadderWatchSettings, Verdict, metric_label, smoothed_series


def trajectory_png(
    expected: Expected, main: Curve, verdict: Verdict, settings: LadderWatchSettings, ladder: Sequence[Curve] = ()
) -> bytes:
    """Loss against tokens, gradient norm and drop rate against the fraction of the phase: the
    ladder's band (shaded), the ladder's runs (grey, given), the main run raw (faint) and smoothed,
    and a red line where a metric left the band."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    fraction = main.fraction()
    for ax, metric in zip(axes, METRICS, strict=True):
        x = np.asarray(main.tokens) if metric == "loss" else fraction
        judged = fraction >= settings.min_fraction
        low, high = expected.bands(metric, main.tokens, fraction, settings)
        for curve in ladder:
            ax.plot(curve.tokens if metric == "loss" else curve.fraction(), curve.series(metric), color="0.75", lw=0.6)
        if metric == "loss":
            ax.plot(
                x[judged], expected.loss(main.tokens)[judged], color="C2", lw=1, label=f"ladder law at N={expected.params:.3g}"
            )
        floor = expected.loss(main.tokens) if metric == "loss" else np.zeros(low.shape)  # one-sided: from the law / 0
        ax.fill_between(
            x[judged], np.where(np.isfinite(low), low, floor)[judged], high[judged], color="C2", alpha=0.2, label="ladder band"
        )
        raw = main.series(metric)
        ax.plot(x, raw, color="C0", lw=0.6, alpha=0.4, label=f"{main.name} (raw)")
        ax.plot(x, smoothed_series(main, metric, settings, expected), color="C0", lw=1.5, label="smoothed")
        bad = main.measured(metric) & ~np.isfinite(raw)
        if bad.any():  # not finite: drawn on the top edge
            ax.scatter(
                x[bad],
                np.full(int(bad.sum()), np.nanmax(high[judged])),
                marker="x",
                color="red",
                s=14,
                label="not finite",
                zorder=3,
            )
        if metric == "grad_norm":
            ax.set_yscale("log")
        mv = verdict.metric(metric)
        if mv.first_step is not None:
            ax.axvline(x[main.steps.index(mv.first_step)], color="red", ls="--", lw=1, label=f"left at step {mv.first_step}")
        ax.set_xlabel("tokens" if metric == "loss" else "fraction of the phase")
        ax.set_title(f"{metric_label(metric)}: {'inside' if mv.inside else 'OUTSIDE'}", color="black" if mv.inside else "red")
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(
        ("inside the ladder's band" if verdict.inside else f"left the ladder's band at step {verdict.first_step}"), fontsize=10
    )
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()
