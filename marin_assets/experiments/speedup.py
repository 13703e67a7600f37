"""Effective speedup: how much compute the baseline needs to reach an arm's loss, per compute
the arm spent.

The baseline's runs (every budget, every seed) are fitted with the scaling package's loss
envelope L(C) = E + A C^-alpha (``scaling.fits.fit_loss_envelope``). Its inverse
C_base(L) = (A / (L - E))^(1/alpha) is the baseline compute that reaches loss L. At each
budget the arm's loss is averaged over its seeds and

    speedup(budget) = C_base(mean arm loss) / arm compute

and the arm's effective speedup is the geometric mean over budgets (speedups multiply, so
a factor 2 at one budget and 1/2 at another average to 1). A loss at or below the fitted
asymptote E is one the baseline never reaches: the speedup is +inf, and stays so.

Uncertainty: a bootstrap over seeds. A seed is the unit (its runs at every budget move
together), so each replicate resamples the baseline's seeds and refits the envelope, and
resamples the arm's seeds; the spread covers both kinds of noise. Screens have 2-3 seeds
per arm, where percentile intervals are far too narrow (a resample of 3 seeds never leaves
their range, and its variance is (n-1)/n of the truth). So the interval is the bootstrap
standard error of log(speedup), scaled back by n/(n-1) (n = the smaller seed count) and
taken with Student-t quantiles on n_baseline + n_arm - 2 degrees of freedom, around the
point estimate. Only when replicates are unbounded (+inf) does it fall back to percentiles. The
noise floor is what seed noise alone does to the baseline against itself: each baseline
seed's speedup against the fit of the other seeds (leave one seed out).
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from marin_assets.scaling.fits import LossEnvelope, fit_loss_envelope


@dataclasses.dataclass(frozen=True)
class RunLoss:
    """One finished run: its arm, budget label (FLOPs asked for), seed, FLOPs spent, loss."""

    arm: str
    budget: float
    seed: int
    flops: float
    loss: float

    def __post_init__(self) -> None:
        for name in ("budget", "flops", "loss"):
            value = getattr(self, name)
            if not math.isfinite(value):
                raise ValueError(f"run {self.arm}/{self.budget:g}/s{self.seed}: {name} is {value!r}, not finite")
        if self.flops <= 0 or self.budget <= 0:
            raise ValueError(f"run {self.arm}/{self.budget:g}/s{self.seed}: budget and flops must be > 0")


@dataclasses.dataclass(frozen=True)
class ArmSpeedup:
    arm: str
    effective_speedup: float
    ci_low: float
    ci_high: float
    per_budget: dict  # {budget: speedup at that budget}
    runs: int
    bootstrap_n: int
    level: float

    def as_json(self) -> dict:
        return {
            "arm": self.arm,
            "effective_speedup": _json_float(self.effective_speedup),
            "ci_low": _json_float(self.ci_low),
            "ci_high": _json_float(self.ci_high),
            "runs": self.runs,
        }


def _json_float(x: float) -> float | None:
    """JSON has no infinity: an unbounded speedup prints as null (the report says why)."""
    return float(x) if math.isfinite(x) else None


def compute_to_reach(envelope: LossEnvelope, loss: float) -> float:
    """Baseline compute C with L(C) = loss; +inf when loss is at or below the asymptote E."""
    if not envelope.A > 0 or not envelope.alpha > 0:
        raise ValueError(f"the baseline fit {envelope} does not fall with compute; no speedup is defined")
    gap = loss - envelope.E
    if gap <= 0:
        return math.inf
    return (envelope.A / gap) ** (1.0 / envelope.alpha)


def fit_baseline(runs: Sequence[RunLoss]) -> LossEnvelope:
    """The baseline's L(C) through every run (all seeds at all budgets)."""
    if len({r.budget for r in runs}) < 3:
        raise ValueError(f"the baseline fit needs runs at >= 3 budgets, got {sorted({r.budget for r in runs})}")
    return fit_loss_envelope([r.flops for r in runs], [r.loss for r in runs])


def speedup_at_budgets(envelope: LossEnvelope, runs: Sequence[RunLoss]) -> dict[float, float]:
    """{budget: C_base(mean loss over seeds) / mean compute} for one arm's runs."""
    by_budget = defaultdict(list)
    for r in runs:
        by_budget[r.budget].append(r)
    out = {}
    for budget in sorted(by_budget):
        group = by_budget[budget]
        loss = float(np.mean([r.loss for r in group]))
        flops = float(np.mean([r.flops for r in group]))
        out[budget] = compute_to_reach(envelope, loss) / flops
    return out


def effective_speedup(envelope: LossEnvelope, runs: Sequence[RunLoss]) -> float:
    """Geometric mean over budgets of the per-budget speedups."""
    per_budget = list(speedup_at_budgets(envelope, runs).values())
    if not per_budget:
        raise ValueError("effective_speedup: no runs")
    if any(math.isinf(s) for s in per_budget):
        return math.inf
    return float(math.exp(np.mean(np.log(per_budget))))


def _by_seed(runs: Sequence[RunLoss]) -> dict[int, list[RunLoss]]:
    out = defaultdict(list)
    for r in runs:
        out[r.seed].append(r)
    return dict(sorted(out.items()))


def _resample(by_seed: dict[int, list[RunLoss]], rng: np.random.Generator) -> list[RunLoss]:
    seeds = list(by_seed)
    picked = rng.choice(len(seeds), size=len(seeds), replace=True)
    return [r for i in picked for r in by_seed[seeds[i]]]


def _percentile(values: np.ndarray, q: float) -> float:
    # "inverted_cdf" picks a sample value (no interpolation), so +inf replicates count as
    # unbounded speedups instead of turning the interval into NaN or being dropped.
    return float(np.percentile(values, q, method="inverted_cdf"))


def baseline_envelopes(baseline: Sequence[RunLoss], n: int, seed: int) -> list[LossEnvelope | None]:
    """``n`` envelopes refitted on seed-resampled baseline runs (None where a fit failed)."""
    rng = np.random.default_rng(seed)
    by_seed = _by_seed(baseline)
    out = []
    for _ in range(n):
        try:
            out.append(fit_baseline(_resample(by_seed, rng)))
        except ValueError:
            out.append(None)
    return out


def t_interval(point: float, log_samples: np.ndarray, n_baseline: int, n_arm: int, level: float) -> tuple[float, float]:
    """exp(log point -+ t * se): se from the bootstrap, corrected for few seeds (see above)."""
    from scipy.stats import t

    counts = [n for n in (n_baseline, n_arm) if n >= 2]
    n_min = min(counts)
    se = float(np.std(log_samples, ddof=1)) * math.sqrt(n_min / (n_min - 1))
    half = float(t.ppf(0.5 + level / 2.0, max(n_baseline + n_arm - 2, 1))) * se
    return math.exp(math.log(point) - half), math.exp(math.log(point) + half)


def arm_speedup(
    arm: str,
    runs: Sequence[RunLoss],
    envelope: LossEnvelope,
    replicates: Sequence[LossEnvelope | None],
    seed: int,
    level: float = 0.95,
    n_baseline_seeds: int = 2,
) -> ArmSpeedup:
    """Point estimate on the full fit; interval from the baseline ``replicates`` paired with
    seed-resampled arm runs."""
    if not runs:
        raise ValueError(f"arm {arm!r} has no finished runs")
    rng = np.random.default_rng([seed, len(arm), *arm.encode()])
    by_seed = _by_seed(runs)
    samples = []
    for env in replicates:
        sample = _resample(by_seed, rng)
        if env is None:
            continue
        try:
            samples.append(effective_speedup(env, sample))
        except ValueError:  # a resampled baseline that does not fall with compute
            continue
    if not samples:
        raise ValueError(f"arm {arm!r}: no bootstrap replicate could be fitted")
    values = np.asarray(samples)
    point = effective_speedup(envelope, runs)
    if np.all(np.isfinite(values)) and np.all(values > 0) and math.isfinite(point) and values.size > 1:
        low, high = t_interval(point, np.log(values), n_baseline_seeds, len(by_seed), level)
    else:
        tail = 100.0 * (1.0 - level) / 2.0
        low, high = _percentile(values, tail), _percentile(values, 100.0 - tail)
    return ArmSpeedup(
        arm=arm,
        effective_speedup=point,
        ci_low=low,
        ci_high=high,
        per_budget=speedup_at_budgets(envelope, runs),
        runs=len(runs),
        bootstrap_n=len(samples),
        level=level,
    )


def noise_floor(baseline: Sequence[RunLoss]) -> dict:
    """Leave-one-seed-out: each baseline seed's speedup against the other seeds' fit.

    ``factor`` = exp(max |log speedup|): speedups within [1/factor, factor] are what seed
    noise alone produces at this scale."""
    by_seed = _by_seed(baseline)
    if len(by_seed) < 2:
        raise ValueError("the noise floor needs >= 2 baseline seeds")
    per_seed = {}
    for held_out, runs in by_seed.items():
        others = [r for s, rs in by_seed.items() if s != held_out for r in rs]
        per_seed[held_out] = effective_speedup(fit_baseline(others), runs)
    logs = [abs(math.log(s)) for s in per_seed.values() if math.isfinite(s) and s > 0]
    factor = math.exp(max(logs)) if len(logs) == len(per_seed) else math.inf
    return {"per_seed": {str(k): _json_float(v) for k, v in per_seed.items()}, "factor": _json_float(factor)}


def screen(
    runs: Sequence[RunLoss], baseline_arm: str = "baseline", bootstrap_n: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[LossEnvelope, dict[str, ArmSpeedup], dict]:
    """(baseline envelope, {arm: ArmSpeedup} for every non-baseline arm, noise floor)."""
    baseline = [r for r in runs if r.arm == baseline_arm]
    if not baseline:
        raise ValueError(f"no runs of the baseline arm {baseline_arm!r}")
    envelope = fit_baseline(baseline)
    replicates = baseline_envelopes(baseline, bootstrap_n, seed)
    arms = sorted({r.arm for r in runs} - {baseline_arm})
    n_base = len(_by_seed(baseline))
    results = {a: arm_speedup(a, [r for r in runs if r.arm == a], envelope, replicates, seed, level, n_base) for a in arms}
    return envelope, results, noise_floor(baseline)
