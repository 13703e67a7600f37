"""Effective-speedup arithmetic against a hand-computed case: L(C) = 2 + 10 C^-0.3."""

from __future__ import annotations

import math

import numpy as np
import pytest

from marin_assets.experiments.speedup import (
    RunLoss,
    baseline_envelopes,
    compute_to_reach,
    effective_speedup,
    fit_baseline,
    noise_floor,
    screen,
    speedup_at_budgets,
    t_interval,
)
from marin_assets.scaling.fits import LossEnvelope

LAW = LossEnvelope(E=2.0, A=10.0, alpha=0.3)
BUDGETS = (1e3, 2e3, 4e3, 8e3)


def law(c):
    return 2.0 + 10.0 * c**-0.3


def runs(arm, loss_at, seeds=(0, 1, 2), noise=0.0, rng=None):
    """One run per (budget, seed) at compute = budget with loss ``loss_at(C)`` (+ seed noise)."""
    out = []
    for seed in seeds:
        shift = rng.normal(0, noise) if noise else 0.0  # a seed is a little better or worse everywhere
        out += [RunLoss(arm, c, seed, c, loss_at(c) + shift) for c in BUDGETS]
    return out


def test_compute_to_reach_inverts_the_law():
    # 2 + 10 * 5000^-0.3 = 2.7743...; the baseline needs exactly 5000 to reach it.
    assert compute_to_reach(LAW, law(5000.0)) == pytest.approx(5000.0, rel=1e-12)
    assert compute_to_reach(LAW, 2.0) == math.inf  # the asymptote is never reached
    assert compute_to_reach(LAW, 1.5) == math.inf
    with pytest.raises(ValueError, match="does not fall with compute"):
        compute_to_reach(LossEnvelope(E=3.0, A=0.0, alpha=0.3), 3.5)


def test_fit_recovers_the_known_law():
    fit = fit_baseline(runs("baseline", law))
    assert (fit.E, fit.A, fit.alpha) == pytest.approx((2.0, 10.0, 0.3), rel=1e-3)


@pytest.mark.parametrize("factor", [2.0, 0.5, 1.0, 4.0])
def test_arm_at_law_of_factor_c_has_speedup_factor(factor):
    """An arm whose loss at compute C equals the baseline's L(factor * C) has speedup factor."""
    fit = fit_baseline(runs("baseline", law))
    arm = runs("arm", lambda c: law(factor * c))
    per_budget = speedup_at_budgets(fit, arm)
    assert list(per_budget) == list(BUDGETS)
    assert list(per_budget.values()) == pytest.approx([factor] * 4, rel=2e-3)
    assert effective_speedup(fit, arm) == pytest.approx(factor, rel=2e-3)


def test_exact_law_gives_a_point_interval_at_two():
    envelope, arms, floor = screen(runs("baseline", law) + runs("faster", lambda c: law(2 * c)), bootstrap_n=30)
    result = arms["faster"]
    assert result.effective_speedup == pytest.approx(2.0, rel=2e-3)
    assert result.ci_low == pytest.approx(2.0, rel=2e-3) and result.ci_high == pytest.approx(2.0, rel=2e-3)
    assert result.runs == 12 and result.bootstrap_n == 30
    assert floor["factor"] == pytest.approx(1.0, abs=2e-3)  # identical seeds: no noise
    assert result.as_json() == {
        "arm": "faster",
        "effective_speedup": result.effective_speedup,
        "ci_low": result.ci_low,
        "ci_high": result.ci_high,
        "runs": 12,
    }


def test_per_budget_speedups_are_averaged_geometrically():
    fit = LAW
    # speedup 4 at the first two budgets, 1/4 at the last two: the geometric mean is 1.
    arm = [RunLoss("a", c, 0, c, law(4 * c) if c < 3e3 else law(c / 4)) for c in BUDGETS]
    assert effective_speedup(fit, arm) == pytest.approx(1.0, rel=1e-9)


def test_loss_beyond_the_asymptote_is_unbounded_and_prints_null():
    envelope, arms, _ = screen(runs("baseline", law) + runs("magic", lambda c: 1.9), bootstrap_n=20)
    assert arms["magic"].effective_speedup == math.inf
    assert arms["magic"].as_json()["effective_speedup"] is None
    assert arms["magic"].as_json()["ci_high"] is None


def test_a_harmful_arm_is_below_one_despite_seed_noise():
    rng = np.random.default_rng(7)
    all_runs = (
        runs("baseline", law, noise=0.004, rng=rng)
        + runs("harm", lambda c: law(c / 4), seeds=(0, 1), noise=0.004, rng=rng)
        + runs("help", lambda c: law(c * 4), seeds=(0, 1), noise=0.004, rng=rng)
    )
    _, arms, floor = screen(all_runs, bootstrap_n=100, seed=1)
    harm, helps = arms["harm"], arms["help"]
    assert harm.ci_high < 1.0 and harm.effective_speedup == pytest.approx(0.25, rel=0.3)
    assert helps.ci_low > 1.0 and helps.effective_speedup == pytest.approx(4.0, rel=0.3)
    assert harm.ci_low < harm.effective_speedup < harm.ci_high
    assert floor["factor"] > 1.0 and len(floor["per_seed"]) == 3


def test_bad_runs_are_refused_with_the_run_named():
    with pytest.raises(ValueError, match=r"run a/1000/s0: loss is nan"):
        RunLoss("a", 1e3, 0, 1e3, float("nan"))
    with pytest.raises(ValueError, match="flops must be > 0"):
        RunLoss("a", 1e3, 0, 0.0, 3.0)
    with pytest.raises(ValueError, match=">= 3 budgets"):
        fit_baseline([r for r in runs("baseline", law) if r.budget < 3e3])
    with pytest.raises(ValueError, match=">= 2 baseline seeds"):
        noise_floor(runs("baseline", law, seeds=(0,)))
    with pytest.raises(ValueError, match="no runs of the baseline arm"):
        screen(runs("arm", law))


def test_intervals_cover_one_for_pure_seed_noise():
    """16 simulated screens of pure seed noise (3 baseline vs 3 control seeds): a 95% interval
    must contain 1.0 in most of them. (Percentile intervals of 3 seeds did so in ~60%.)"""
    covered = 0
    for i in range(16):
        rng = np.random.default_rng(1000 + i)
        all_runs = runs("baseline", law, noise=0.004, rng=rng) + runs("same", law, seeds=(7, 8, 9), noise=0.004, rng=rng)
        _, arms, _ = screen(all_runs, bootstrap_n=20, seed=i)
        covered += arms["same"].ci_low <= 1.0 <= arms["same"].ci_high
    assert covered >= 13


def test_t_interval_takes_seed_degrees_of_freedom_not_the_replicate_count():
    """Hand computation on fixed numbers: 8 bootstrap log-speedups, 3 baseline and 2 arm seeds.
    df = 3 + 2 - 2 = 3 (t = 3.182); the replicate count (8, or 6) would give t = 2.45 or less,
    an interval a quarter narrower that every other test passed."""
    from scipy.stats import t

    logs = np.array([-0.12, -0.05, 0.0, 0.03, 0.08, 0.11, -0.02, 0.05])
    se = float(np.std(logs, ddof=1)) * math.sqrt(2 / 1)  # n_min = 2 seeds: the bootstrap's (n-1)/n undone
    assert t.ppf(0.975, 3) == pytest.approx(3.182446305284263, rel=1e-12)
    half = 3.182446305284263 * se
    low, high = t_interval(1.5, logs, n_baseline=3, n_arm=2, level=0.95)
    assert (low, high) == pytest.approx((1.5 * math.exp(-half), 1.5 * math.exp(half)), rel=1e-12)
    # level enters the quantile, not the df
    low90, high90 = t_interval(1.5, logs, n_baseline=3, n_arm=2, level=0.90)
    assert math.log(high90 / 1.5) == pytest.approx(t.ppf(0.95, 3) * se, rel=1e-12)


def test_screen_interval_equals_the_hand_computed_t_interval_on_seed_counts():
    """The whole path (screen -> arm_speedup -> t_interval): the arm's two seeds are identical,
    so every bootstrap replicate is effective_speedup(replicate envelope, arm runs) and the
    interval can be computed by hand with df = 3 baseline seeds + 2 arm seeds - 2 = 3."""
    from scipy.stats import t

    rng = np.random.default_rng(3)
    baseline = runs("baseline", law, noise=0.004, rng=rng)
    arm = runs("arm", lambda c: law(2 * c), seeds=(0, 1))
    _, arms, _ = screen(baseline + arm, bootstrap_n=40, seed=5)
    samples = [effective_speedup(env, arm) for env in baseline_envelopes(baseline, 40, 5) if env is not None]
    logs = np.log(samples)
    se = float(np.std(logs, ddof=1)) * math.sqrt(2 / 1)
    half = float(t.ppf(0.975, 3 + 2 - 2)) * se
    point = arms["arm"].effective_speedup
    assert arms["arm"].bootstrap_n == len(samples) > 30
    assert (arms["arm"].ci_low, arms["arm"].ci_high) == pytest.approx((point * math.exp(-half), point * math.exp(half)), rel=1e-9)
