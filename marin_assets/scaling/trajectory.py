"""The ladder watches the main run: its expected trajectory at the main run's scale, and a verdict.

Pure numbers in, verdict out (no Dagster, no I/O): ``sensors/ladder_watch.py`` reads the runs and
the live telemetry, and the phase controller acts on the verdict.

    expected_trajectory(ladder_curves, target_params, settings) -> Expected
    check_trajectory(expected, main_curve, settings) -> Verdict (inside/outside per metric, first step, reason)
    trajectory_plot.trajectory_png(expected, main_curve, verdict, settings) -> PNG bytes

What "expected" means, per metric (issue 23: Delphi compares the main run's loss, gradient norm and
token drops with the ladder's patterns; this is our reading of that):

- loss against tokens: ``L(N, D) = E + A/N^alpha + B/D^beta`` fitted (``parametric.fit_parametric``,
  Huber on log loss) to every ladder run's per-step training loss past ``min_fraction`` of its run,
  then read at the main run's active parameter count N and its tokens D. The band is
  ``max(loss_floor, loss_sigmas * sigma)`` above it, sigma the RMS of the ladder's own residuals
  about the fit after the same smoothing the main run gets (so it holds the seeds' spread and the
  law's misfit). Only the upper side fails: a loss below the ladder's is not a fault to act on.
- gradient norm: at the same fraction of its run (bins of ``1/fraction_bins``), between the
  smallest and largest smoothed norm any ladder run had there, widened by ``grad_norm_factor``
  both ways (a too-high LR pushed it either way on our tiny runs: to twice the band's top at 100x
  the LR, to a third of the ladder's smallest at 10x; tests/scaling/test_trajectory.py).
- drop rate (routed-expert assignments lost to capacity, per trained token): at most the ladder's
  largest there plus ``drop_rate_floor``.

A point is outside when its raw value is not finite or its smoothed value is out of the band:
the trailing median over ``smooth_tokens`` worth of steps (of the residual about the law for the
loss, so a falling curve is not read late; a mean for the drop rate, where sporadic drops count).
A metric leaves the band at the first of ``patience`` consecutive outside points, so one noisy
step or one spike does not (spikes are ``phases.signals.loss_spike``'s business); a sustained
departure does, however it started.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from marin_assets.knobs import knob
from marin_assets.numeric_checks import check_field_types, check_float, check_int
from marin_assets.scaling.parametric import ParametricFitConfig, fit_parametric

BAND_ACTIONS = ("hold", "rollback", "warn")
METRICS = ("loss", "grad_norm", "drop_rate")
_ROW_METRICS = ("loss", "grad_norm", "dropped")


@dataclasses.dataclass(frozen=True)
class LadderWatchSettings:
    """How the ladder's band is drawn around the main run and what the phase controller does when the
    run leaves it. Knobs (marin_assets/knobs.py); the defaults were set on real tiny runs
    (tests/scaling/test_trajectory.py: a 100x LR leaves within 10 steps, seeds of a normal LR stay in)."""

    action: str = knob(
        "warn",
        versioned=False,
        help="when the main run leaves the band: hold (request no next "
        "phase until the budget file's released_holds names it), rollback (end the phase and restart "
        "it from its warm start, as a loss spike does), or warn (record it only)",
    )
    loss_sigmas: float = knob(3.0, help="loss band above the ladder's law, in RMS residuals of the ladder's runs")
    loss_floor: float = knob(0.1, help="narrowest loss band above the law, in nats/token")
    grad_norm_factor: float = knob(3.0, help="gradient-norm band: the ladder's range divided and multiplied by this")
    drop_rate_floor: float = knob(0.01, help="drop-rate band: the ladder's largest plus this (assignments per token)")
    smooth_tokens: int = knob(2048, help="tokens a smoothed point spans (steps = this / tokens per step, at least 1)")
    patience: int = knob(3, help="consecutive smoothed points outside the band before a metric has left it")
    min_fraction: float = knob(0.1, help="the first fraction of a run (warmup) is neither fitted nor judged")
    fraction_bins: int = knob(10, help="bins over the fraction of a run for the gradient-norm and drop-rate bands")
    max_rollbacks: int = knob(2, versioned=False, help="roll a phase back at most this often for leaving the band, then hold it")

    def __post_init__(self) -> None:
        check_field_types(self)
        if self.action not in BAND_ACTIONS:
            raise ValueError(f"LadderWatchSettings.action must be one of {BAND_ACTIONS}, got {self.action!r}")
        check_float("LadderWatchSettings.loss_sigmas", self.loss_sigmas, 0, 100, lo_open=True)
        check_float("LadderWatchSettings.loss_floor", self.loss_floor, 0, 100)
        check_float("LadderWatchSettings.grad_norm_factor", self.grad_norm_factor, 1, 1e6)
        check_float("LadderWatchSettings.drop_rate_floor", self.drop_rate_floor, 0, 1e6)
        check_int("LadderWatchSettings.smooth_tokens", self.smooth_tokens, 1, 10**15)
        check_int("LadderWatchSettings.patience", self.patience, 1, 10**6)
        check_float("LadderWatchSettings.min_fraction", self.min_fraction, 0, 1, hi_open=True)
        check_int("LadderWatchSettings.fraction_bins", self.fraction_bins, 1, 10**4)
        check_int("LadderWatchSettings.max_rollbacks", self.max_rollbacks, 0, 10**6)


@dataclasses.dataclass(frozen=True)
class Curve:
    """One run's (or one phase's) per-step metrics. ``tokens`` is the run's cumulative count;
    the fraction of the run at a step is ``(tokens - start_tokens) / planned_tokens``. A value
    is None where the row did not log that metric (not judged) and may be non-finite (outside)."""

    name: str
    params: float  # active parameters per token (what the ladder's planner counts as N)
    steps: tuple[int, ...]
    tokens: tuple[float, ...]
    values: Mapping[str, tuple[float | None, ...]]  # "loss", "grad_norm", "dropped" -> one per step
    start_tokens: float = 0.0
    planned_tokens: float | None = None  # None: the last row's tokens (a finished run)

    @classmethod
    def from_rows(
        cls,
        name: str,
        params: float,
        rows: Sequence[Mapping[str, Any]],
        *,
        start_tokens: float = 0.0,
        planned_tokens: float | None = None,
    ) -> Curve:
        """From metrics rows ({step, tokens, loss, grad_norm, dropped}, e.g. metrics.jsonl's), sorted by
        step; a row without a step or tokens is an error naming the run and the row."""
        check_float(f"{name}: params", params, 0, None, lo_open=True)
        parsed = [_parse_row(name, i, row) for i, row in enumerate(rows)]
        parsed.sort(key=lambda r: r[0])
        if not parsed:
            raise ValueError(f"{name}: no metrics rows")
        return cls(
            name,
            float(params),
            tuple(r[0] for r in parsed),
            tuple(r[1] for r in parsed),
            {m: tuple(r[2][m] for r in parsed) for m in _ROW_METRICS},
            float(start_tokens),
            planned_tokens,
        )

    def fraction(self) -> np.ndarray:
        tokens = np.asarray(self.tokens, dtype=np.float64)
        total = self.planned_tokens if self.planned_tokens is not None else tokens[-1] - self.start_tokens
        return (tokens - self.start_tokens) / max(float(total), 1.0)

    def series(self, metric: str) -> np.ndarray:
        """``metric`` per step as floats (nan where missing or not finite); ``drop_rate`` is derived."""
        if metric == "drop_rate":
            return _as_float(self.values["dropped"]) / self.step_tokens()
        return _as_float(self.values[metric])

    def measured(self, metric: str) -> np.ndarray:
        """Where the row logged ``metric`` at all (None: not judged)."""
        return np.array([v is not None for v in self.values["dropped" if metric == "drop_rate" else metric]])

    def step_tokens(self) -> np.ndarray:
        """Tokens trained per step at each row (from the cumulative count; a gap averages over it)."""
        tokens = np.asarray(self.tokens, dtype=np.float64)
        steps = np.asarray(self.steps, dtype=np.float64)
        before = np.concatenate([[self.start_tokens], tokens[:-1]])
        gaps = np.maximum(np.diff(np.concatenate([[steps[0] - 1], steps])), 1.0)
        return np.maximum((tokens - before) / gaps, 1.0)

    def window(self, settings: LadderWatchSettings) -> int:
        return max(1, int(round(settings.smooth_tokens / float(np.median(self.step_tokens())))))


def _parse_row(name: str, index: int, row: Mapping[str, Any]) -> tuple[int, float, dict[str, float | None]]:
    try:
        step, tokens = int(row["step"]), float(row["tokens"])
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{name}: metrics row {index} needs a numeric step and tokens ({err!r}): {dict(row)!r:.200}") from None
    if not math.isfinite(tokens) or tokens < 0:
        raise ValueError(f"{name}: metrics row {index} (step {step}) has tokens {tokens}, not a finite count >= 0")
    values = {}
    for metric in _ROW_METRICS:
        raw = row.get(metric)
        try:
            values[metric] = None if raw is None else float(raw)  # "nan" (metrics.jsonl's spelling) -> nan
        except (TypeError, ValueError):
            raise ValueError(f"{name}: metrics row {index} (step {step}): {metric} {raw!r} is not a number") from None
    return step, tokens, values


def _as_float(values: Sequence[float | None]) -> np.ndarray:
    return np.array([math.nan if v is None else v for v in values], dtype=np.float64)


def _trailing(values: np.ndarray, window: int, reduce) -> np.ndarray:
    """``reduce`` over the finite values of each trailing window (nan where there are none)."""
    out = np.full(values.shape, math.nan)
    for i in range(values.size):
        chunk = values[max(0, i - window + 1) : i + 1]
        chunk = chunk[np.isfinite(chunk)]
        if chunk.size:
            out[i] = reduce(chunk)
    return out


@dataclasses.dataclass(frozen=True)
class Expected:
    """The ladder's trajectory at one model size: the loss law, its band, and per-fraction bands."""

    params: float
    law: Mapping[str, float]  # E, A, B, alpha, beta
    loss_sigma: float
    grad_norm_range: tuple[tuple[float, float], ...]  # per fraction bin: (smallest, largest) smoothed norm
    drop_rate_max: tuple[float, ...]  # per fraction bin
    runs: tuple[str, ...]
    params_range: tuple[float, float]
    tokens_range: tuple[float, float]
    points: int  # ladder steps fitted
    not_finite: int  # ladder steps left out of the fit for a non-finite loss

    def loss(self, tokens) -> np.ndarray:
        law = self.law
        return law["E"] + law["A"] / self.params ** law["alpha"] + law["B"] / np.asarray(tokens, np.float64) ** law["beta"]

    def bin_of(self, fraction) -> np.ndarray:
        bins = len(self.drop_rate_max)
        return np.clip((np.asarray(fraction) * bins).astype(int), 0, bins - 1)

    def bands(self, metric: str, tokens, fraction, settings: LadderWatchSettings) -> tuple[np.ndarray, np.ndarray]:
        """(low, high) of ``metric``'s band at each point (low -inf: no lower side)."""
        if metric == "loss":
            width = max(settings.loss_floor, settings.loss_sigmas * self.loss_sigma)
            center = self.loss(tokens)
            return np.full(center.shape, -math.inf), center + width
        b = self.bin_of(fraction)
        if metric == "grad_norm":
            lo = np.array([self.grad_norm_range[i][0] for i in b]) / settings.grad_norm_factor
            return lo, np.array([self.grad_norm_range[i][1] for i in b]) * settings.grad_norm_factor
        return np.full(b.shape, -math.inf), np.array([self.drop_rate_max[i] for i in b]) + settings.drop_rate_floor


def smoothed_series(curve: Curve, metric: str, settings: LadderWatchSettings, expected: Expected | None = None) -> np.ndarray:
    """The smoothed series a band is compared with (the module docstring says how); the loss is
    smoothed about the law at ``expected.params`` (a ladder run's own size when fitting)."""
    values, window = curve.series(metric), curve.window(settings)
    values[curve.fraction() < settings.min_fraction] = math.nan  # the warmup is not judged: nor does it smooth
    if metric == "loss":
        if expected is None:
            raise ValueError("the loss is smoothed about the ladder's law: pass the Expected")
        center = expected.loss(curve.tokens)
        return center + _trailing(values - center, window, np.median)
    return _trailing(values, window, np.median if metric == "grad_norm" else np.mean)


# The law's L-BFGS starts: 162 of the published grid's 4,500. Measured on two real 40-step ladder
# runs (widths 16 and 32, as tests/scaling/test_trajectory.py trains them): the same residual RMS (0.1313) and a law within
# 0.03 nats of the full grid's at 1e3..1e5 tokens, in 1.0 s instead of 12 s on a busy 2-core machine.
WATCH_FIT_GRID = {
    "a": (0.0, 10.0, 20.0),
    "b": (0.0, 5.0, 10.0),
    "e": (-1.0, 0.0, 1.0),
    "alpha": (0.25, 1.0),
    "beta": (0.25, 0.75, 1.5),
}


def expected_trajectory(
    ladder: Sequence[Curve], target_params: float, settings: LadderWatchSettings, fit_config=None
) -> Expected:
    """The ladder runs' trajectory at ``target_params`` (see the module docstring). Needs runs of >= 2
    sizes (alpha is fitted across sizes); ``fit_config`` (a ParametricFitConfig) defaults to WATCH_FIT_GRID."""
    check_float("target_params", target_params, 0, None, lo_open=True)
    if len({c.params for c in ladder}) < 2:
        raise ValueError(
            f"the ladder watch needs runs of >= 2 model sizes, got {sorted({c.params for c in ladder})} from {len(ladder)} run(s)"
        )
    n, d, loss, not_finite = [], [], [], 0
    for curve in ladder:
        keep = (curve.fraction() >= settings.min_fraction) & (np.asarray(curve.tokens) > 0)
        values = curve.series("loss")[keep]
        ok = np.isfinite(values) & (values > 0)
        not_finite += int(np.sum(~ok))
        n += [curve.params] * int(ok.sum())
        d += list(np.asarray(curve.tokens)[keep][ok])
        loss += list(values[ok])
    fit = fit_parametric(n, d, loss, fit_config or ParametricFitConfig(grid=dict(WATCH_FIT_GRID)))
    law = {"E": fit.E, "A": fit.A, "B": fit.B, "alpha": fit.alpha, "beta": fit.beta}
    bands = _fraction_bands(ladder, settings)
    provisional = Expected(
        float(target_params),
        law,
        0.0,
        *bands,
        runs=tuple(c.name for c in ladder),
        params_range=(min(c.params for c in ladder), max(c.params for c in ladder)),
        tokens_range=(float(min(d)), float(max(d))),
        points=len(loss),
        not_finite=not_finite,
    )
    residuals = []
    for curve in ladder:
        at_own_size = dataclasses.replace(provisional, params=curve.params)
        smoothed = smoothed_series(curve, "loss", settings, at_own_size) - at_own_size.loss(curve.tokens)
        residuals += list(smoothed[(curve.fraction() >= settings.min_fraction) & np.isfinite(smoothed)])
    sigma = float(np.sqrt(np.mean(np.square(residuals)))) if residuals else 0.0
    return dataclasses.replace(provisional, loss_sigma=sigma)


def _fraction_bands(ladder: Sequence[Curve], settings: LadderWatchSettings):
    bins = settings.fraction_bins
    norms: list[list[float]] = [[] for _ in range(bins)]
    drops: list[list[float]] = [[] for _ in range(bins)]
    for curve in ladder:
        b = np.clip((curve.fraction() * bins).astype(int), 0, bins - 1)
        for metric, into in (("grad_norm", norms), ("drop_rate", drops)):
            smoothed = smoothed_series(curve, metric, settings)
            for i in np.flatnonzero(np.isfinite(smoothed)):
                into[b[i]].append(float(smoothed[i]))
    norms, drops = _fill_empty(norms, "grad_norm"), _fill_empty(drops, "drop_rate")
    return tuple((min(v), max(v)) for v in norms), tuple(max(v) for v in drops)


def _fill_empty(per_bin: list[list[float]], metric: str) -> list[list[float]]:
    """A bin no ladder step fell in takes its nearest neighbours' values (short runs, few bins)."""
    filled = [i for i, v in enumerate(per_bin) if v]
    if not filled:
        raise ValueError(f"the ladder runs logged no finite {metric}: no band can be drawn")
    return [
        v or [x for j in filled if abs(j - i) == min(abs(k - i) for k in filled) for x in per_bin[j]]
        for i, v in enumerate(per_bin)
    ]


@dataclasses.dataclass(frozen=True)
class MetricVerdict:
    metric: str
    inside: bool
    judged: int  # points compared with the band
    first_step: int | None = None  # first step of the first run of ``patience`` outside points
    value: float | None = None  # the smoothed value there (nan: the raw value was not finite)
    low: float | None = None
    high: float | None = None
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class Verdict:
    inside: bool
    metrics: tuple[MetricVerdict, ...]
    first_step: int | None
    reason: str

    def metric(self, name: str) -> MetricVerdict:
        return next(m for m in self.metrics if m.metric == name)

    def as_dict(self) -> dict:
        return {
            "inside": self.inside,
            "first_step": self.first_step,
            "reason": self.reason,
            "metrics": {m.metric: dataclasses.asdict(m) for m in self.metrics},
        }


def check_trajectory(expected: Expected, main: Curve, settings: LadderWatchSettings) -> Verdict:
    """Compare ``main`` (its params should be ``expected.params``) with the band, metric by metric."""
    verdicts = tuple(_check_metric(expected, main, metric, settings) for metric in METRICS)
    outside = [v for v in verdicts if not v.inside]
    if not outside:
        judged = max(v.judged for v in verdicts)
        return Verdict(
            True, verdicts, None, f"inside the ladder's band over {judged} steps ({'; '.join(v.reason for v in verdicts)})"
        )
    first = min(v.first_step for v in outside if v.first_step is not None)
    return Verdict(False, verdicts, first, "; ".join(v.reason for v in sorted(outside, key=lambda v: v.first_step or 0)))


def _check_metric(expected: Expected, main: Curve, metric: str, settings: LadderWatchSettings) -> MetricVerdict:
    fraction = main.fraction()
    judged = (fraction >= settings.min_fraction) & main.measured(metric)
    if not judged.any():
        return MetricVerdict(metric, True, 0, reason=f"{metric_label(metric)} not measured")
    raw, smoothed = main.series(metric), smoothed_series(main, metric, settings, expected)
    low, high = expected.bands(metric, main.tokens, fraction, settings)
    out = judged & (~np.isfinite(raw) | (smoothed < low) | (smoothed > high))
    first = _first_streak(out[judged], settings.patience)
    if first is None:
        return MetricVerdict(metric, True, int(judged.sum()), reason=f"{metric_label(metric)} inside")
    i = int(np.flatnonzero(judged)[first])
    value = float(smoothed[i]) if math.isfinite(raw[i]) else math.nan
    side = (
        "not finite"
        if math.isnan(value)
        else (f"{value:.4g} > {high[i]:.4g}" if value > high[i] else f"{value:.4g} < {low[i]:.4g}")
    )
    where = (
        f"at {main.tokens[i]:,.0f} tokens (law {expected.loss(main.tokens[i]):.4g})"
        if metric == "loss"
        else f"at {fraction[i]:.0%} of the phase"
    )
    return MetricVerdict(
        metric,
        False,
        int(judged.sum()),
        main.steps[i],
        value,
        _finite_or_none(low[i]),
        _finite_or_none(high[i]),
        f"{metric_label(metric)} left the ladder's band at step {main.steps[i]}: {side} {where}",
    )


def _first_streak(out: np.ndarray, patience: int) -> int | None:
    run = 0
    for i, bad in enumerate(out):
        run = run + 1 if bad else 0
        if run >= patience:
            return i - patience + 1
    return None


def _finite_or_none(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def metric_label(metric: str) -> str:
    """How a metric is named in verdicts and plots."""
    return {"loss": "loss", "grad_norm": "gradient norm", "drop_rate": "drop rate"}[metric]
