"""IsoFLOP analysis: quadratics, budget exclusion with reasons, power laws, envelope, prediction."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from marin_assets.cli import main
from marin_assets.scaling.data import bucket_flops, validate_runs
from marin_assets.scaling.fits import IsoFlopConfig, fit_isoflop, fit_loss_envelope, fit_power_law, fit_robust_quadratic
from marin_assets.scaling.predict import predict_optimum, predict_parametric, relative_error
from tests.scaling.scaling_synth import TRUE_D_EXPONENT, TRUE_LAW, TRUE_N_EXPONENT, isoflop_sweep, sweep_runs

FAST = IsoFlopConfig(bootstrap_n=6)


def test_quadratic_recovers_exact_parabola_and_vertex():
    x = np.geomspace(1e8, 1e10, 6)
    u = np.log10(x)
    y = 0.3 * (u - 9.2) ** 2 + 2.5
    fit = fit_robust_quadratic(x, y)
    assert fit.vertex_log10 == pytest.approx(9.2, abs=1e-6)
    assert fit.a == pytest.approx(0.3, rel=1e-6)
    assert fit.interior_minimum() == (True, "")


def test_huber_quadratic_ignores_one_bad_run_where_least_squares_does_not():
    x = np.geomspace(1e8, 1e10, 8)
    u = np.log10(x)
    y = 0.3 * (u - 9.2) ** 2 + 2.5
    y[1] += 0.5  # one diverged run
    robust = fit_robust_quadratic(x, y, delta=0.01)
    lsq = np.polyfit(u, y, 2)
    assert abs(robust.vertex_log10 - 9.2) < 0.02
    assert abs(-lsq[1] / (2 * lsq[0]) - 9.2) > 0.1  # the plain fit is dragged off


def test_power_law_and_envelope_exact_on_noiseless_points():
    c = np.geomspace(1e17, 1e21, 6)
    law = fit_power_law(c, 0.05 * c**0.5)
    assert law.exponent == pytest.approx(0.5, abs=1e-9) and law.k == pytest.approx(0.05, rel=1e-6)
    env = fit_loss_envelope(c, 1.8 + 40.0 * c**-0.1)
    assert env.E == pytest.approx(1.8, abs=1e-3)
    assert env.alpha == pytest.approx(0.1, abs=1e-3)
    assert env(1e23) == pytest.approx(1.8 + 40.0 * 1e23**-0.1, rel=1e-4)


def test_synthetic_sweep_recovers_optimal_exponents():
    # Noise 0.2% per run, 7 sizes over a 64x range per budget, 5 budgets over 2 decades.
    # Tolerance 0.02: the bootstrap spread of the exponent at this noise is ~0.006 (3 sigma
    # ~0.018) and approach 2's parabola approximation of the true curve biases it by < 0.003
    # for sizes placed symmetrically around the optimum. The bootstrap CI must cover the truth.
    result = fit_isoflop(sweep_runs(), IsoFlopConfig(bootstrap_n=20))
    assert result.excluded_budgets == []
    assert abs(result.n_opt.exponent - TRUE_N_EXPONENT) < 0.02
    assert abs(result.d_opt.exponent - TRUE_D_EXPONENT) < 0.02
    low, high = result.uncertainty["ci"]["n_opt_exponent"]
    assert low - 0.005 <= TRUE_N_EXPONENT <= high + 0.005
    # N* D* ~ C/6 at every budget (the two vertices are fitted independently).
    for opt in result.optima:
        assert opt.params_opt * opt.tokens_opt * 6 / opt.budget == pytest.approx(1.0, rel=0.1)


def test_prediction_at_a_larger_budget_matches_the_true_law():
    result = fit_isoflop(sweep_runs(noise=0.0), FAST)
    target = 1e21  # 2 decades past the largest fitted budget
    pred = predict_optimum(result, target)
    n_true, d_true = TRUE_LAW.optimal_allocation(target)
    # Exponent bias <= 0.003 over 2 decades of extrapolation is <= ~1.5% in N*; allow 10%.
    assert pred.params_opt / n_true == pytest.approx(1.0, rel=0.10)
    assert pred.tokens_opt / d_true == pytest.approx(1.0, rel=0.10)
    true_loss = float(TRUE_LAW.predict(n_true, d_true))
    assert abs(relative_error(pred.loss, true_loss)) < 0.02
    assert predict_parametric(TRUE_LAW, target).loss == pytest.approx(true_loss, rel=1e-12)


def test_parametric_optimum_is_the_isoflop_minimum():
    c = 1e20
    n_opt, d_opt = TRUE_LAW.optimal_allocation(c)
    assert 6 * n_opt * d_opt == pytest.approx(c, rel=1e-9)
    ns = n_opt * np.geomspace(0.5, 2.0, 41)
    losses = TRUE_LAW.predict(ns, c / (6 * ns))
    assert int(np.argmin(losses)) == 20


def test_bad_budgets_are_excluded_with_reasons():
    p, t, c, l = isoflop_sweep([1e17, 1e18, 1e19], noise=0.0)
    # Budget with only 2 runs.
    p += [1e7, 2e7]
    t += [1e20 / 6e7, 1e20 / 1.2e8]
    c += [1e20, 1e20]
    l += [3.0, 2.9]
    # Non-convex budget: loss falls monotonically with N (all runs on one side of the optimum).
    for n, loss in [(1e6, 4.0), (2e6, 3.8), (4e6, 3.6), (8e6, 3.4)]:
        p.append(n)
        t.append(1e16 / (6 * n))
        c.append(1e16)
        l.append(loss)
    # Bad rows: NaN loss and a zero parameter count.
    p += [1e8, 0.0]
    t += [1e9, 1e9]
    c += [6e17, 6e17]
    l += [math.nan, 3.0]
    runs = validate_runs(params=p, tokens=t, flops=c, loss=l)
    result = fit_isoflop(runs, FAST)
    reasons = {round(math.log10(e["budget"])): e["reason"] for e in result.excluded_budgets}
    assert set(reasons) == {16, 20}
    assert "only 2 run(s)" in reasons[20]
    assert "minimum" in reasons[16] and ("outside the sampled range" in reasons[16] or "not convex" in reasons[16])
    assert [o.budget for o in result.optima] == [bucket_flops(x) for x in (1e17, 1e18, 1e19)]
    rows = {e["row"]: e["reason"] for e in result.excluded_rows}
    assert "loss is missing or NaN" in rows[len(l) - 2]
    assert "params is non-positive" in rows[len(l) - 1]


def test_concave_budget_is_reported_as_not_convex():
    p, t, c, l = isoflop_sweep([1e17, 1e18], noise=0.0)
    for n, loss in [(1e6, 3.0), (2e6, 3.3), (4e6, 3.4), (8e6, 3.3), (1.6e7, 3.0)]:
        p.append(n)
        t.append(1e16 / (6 * n))
        c.append(1e16)
        l.append(loss)
    result = fit_isoflop(validate_runs(params=p, tokens=t, flops=c, loss=l), FAST)
    (bad,) = result.excluded_budgets
    assert "not convex" in bad["reason"]


def test_too_few_budgets_is_an_error_listing_reasons():
    p, t, c, l = isoflop_sweep([1e17], noise=0.0)
    with pytest.raises(ValueError, match="need >= 2"):
        fit_isoflop(validate_runs(params=p, tokens=t, flops=c, loss=l), FAST)


def test_cli_fit_isoflop_json(tmp_path, capsys):
    p, t, c, l = isoflop_sweep([1e17, 1e18, 1e19], noise=0.0)
    rows = ["flops,params,tokens,loss"] + [f"{ci},{pi},{ti},{li}" for pi, ti, ci, li in zip(p, t, c, l)]
    rows.append("1e18,1e8,1e9,nan")
    path = tmp_path / "sweep.csv"
    path.write_text("\n".join(rows) + "\n")
    code = main(["scaling", "fit-isoflop", "--csv", str(path), "--json", "--bootstrap", "4", "--predict", "1e21"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert abs(out["n_opt_exponent"] - TRUE_N_EXPONENT) < 0.02
    assert abs(out["d_opt_exponent"] - TRUE_D_EXPONENT) < 0.02
    assert len(out["optima"]) == 3 and out["envelope"]["E"] > 0
    assert out["excluded"] == [{"row": len(p), "reason": "loss is missing or NaN"}]
    assert out["predictions"][0]["budget"] == 1e21


def test_cli_reports_unreadable_input(tmp_path, capsys):
    path = tmp_path / "bad.csv"
    path.write_text("foo,bar\n1,2\n")
    assert main(["scaling", "fit-isoflop", "--csv", str(path)]) == 2
    assert "missing column" in capsys.readouterr().err
