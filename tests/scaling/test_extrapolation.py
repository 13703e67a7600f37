"""Pre-registration with the experiment-record lock, the prediction at a target's config, the
seed interval, and the comparison, on small hand-made inputs (no training)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from marin_assets.scaling.extrapolation import (
    PredictionNotFrozen,
    check_stamp,
    compare,
    comparison_png,
    lock_name,
    register_prediction,
    require_frozen,
)
from marin_assets.scaling.fits import IsoFlopConfig
from marin_assets.scaling.ladder import Ladder, SweepSettings, Target, fit_summary_of, loss_at
from marin_assets.scaling.ladder_predict import (
    frozen_candidate,
    loss_at_config,
    off_optimum,
    predict_target,
    run_noise,
    seed_interval,
    top_budget_holdout,
)
from marin_assets.scaling.recipes import V2
from marin_assets.scaling.sweep import partition_key, plan_run
from marin_assets.store import ArtifactStore
from marin_assets.store.lock_files import LockFileError, RecordChangedError, content_hash, lock_path, read_lock

PRED = {"ladder": "dense", "target": "x3", "loss": 2.5, "budget": 1.2e11, "config": {"width": 16}}


@pytest.fixture
def store(tmp_path) -> ArtifactStore:
    return ArtifactStore(str(tmp_path / "store"))


def test_a_registered_prediction_is_frozen(store):
    name = lock_name("dense", "x3", "0123456789abcdef0123")
    assert name == "scaling_dense_x3_0123456789abcdef"
    stamp = register_prediction(store, name, PRED)
    lock = read_lock(store, name)  # the experiment lock's own reader validates it
    assert lock["frozen"] == PRED and stamp == {"experiment": name, "frozen_hash": content_hash(PRED)}
    assert register_prediction(store, name, dict(PRED)) == stamp  # a rerun of the same prediction
    with pytest.raises(RecordChangedError, match="never replaced"):
        register_prediction(store, name, PRED | {"loss": 2.4})
    assert read_lock(store, name)["frozen"] == PRED  # written once
    assert require_frozen(store, name, PRED) == stamp


def test_a_target_may_not_start_without_its_frozen_prediction(store):
    name = lock_name("dense", "x3", "f" * 64)
    with pytest.raises(PredictionNotFrozen, match="was not registered"):
        require_frozen(store, name, PRED)
    register_prediction(store, name, PRED)
    with pytest.raises(RecordChangedError, match="refusing to run against it"):
        require_frozen(store, name, PRED | {"loss": 2.0})  # handed another prediction than the frozen one


def test_deleting_the_lock_after_the_run_unfreezes_nothing(store):
    name = lock_name("dense", "x3", "a" * 64)
    stamp = register_prediction(store, name, PRED)
    check_stamp(store, "x3", stamp, PRED)
    Path(lock_path(store, name)).unlink()
    check_stamp(store, "x3", stamp, PRED)  # the run's own stamp still names the prediction
    with pytest.raises(RecordChangedError, match="changed after its run"):
        check_stamp(store, "x3", stamp, PRED | {"loss": 2.45})  # edited, then the lock deleted: still refused
    with pytest.raises(RecordChangedError, match="carries no prediction stamp"):
        check_stamp(store, "x3", None, PRED)


def test_a_lock_rewritten_by_hand_is_refused(store):
    name = lock_name("dense", "x3", "b" * 64)
    stamp = register_prediction(store, name, PRED)
    path = Path(lock_path(store, name))
    lock = json.loads(path.read_text())
    path.write_text(json.dumps(lock | {"frozen": PRED | {"loss": 9.0}}))  # its hash no longer matches
    with pytest.raises(LockFileError):
        check_stamp(store, "x3", stamp, PRED)
    other = PRED | {"loss": 9.0}  # a consistent lock for another prediction
    path.write_text(json.dumps({"experiment": name, "frozen": other, "frozen_hash": content_hash(other)}))
    with pytest.raises(RecordChangedError, match="not the .* target x3 ran against"):
        check_stamp(store, "x3", stamp, PRED)


# ---------------------------------------------------------------- the prediction

# A fit summary whose laws are known: N* = 10 C^0.5, envelope 2 + 1e3 C^-0.3, curvature 0.5.
FIT = {
    "n_opt_coefficient": 10.0,
    "n_opt_exponent": 0.5,
    "d_opt_coefficient": 1 / 60,
    "d_opt_exponent": 0.5,
    "loss_law": {"kind": "envelope", "E": 2.0, "A": 1e3, "alpha": 0.3},
    "curvature_log10_params": 0.5,
}


def test_the_loss_at_a_config_is_the_envelope_plus_the_parabolas_rise():
    c = 1e12
    n_star = 10 * c**0.5
    assert loss_at_config(FIT, c, n_star) == pytest.approx(loss_at(FIT["loss_law"], c))
    assert loss_at_config(FIT, c, 10 * n_star) == pytest.approx(loss_at(FIT["loss_law"], c) + 0.5)  # a decade off N*
    assert loss_at_config(FIT, c, n_star / 10) == pytest.approx(loss_at(FIT["loss_law"], c) + 0.5)


LAW = dict(E=2.0, A=40.0, alpha=0.35, B=60.0, beta=0.30)
SETTINGS = SweepSettings(vocab_size=257, seq_len=32, batch_sizes=[8], min_steps=20, max_width=64)


def law_counts(seeds: int, noise: float, top_widths: tuple[int, ...] = (16, 24, 40)) -> dict:
    """Sweep counts of a small ladder whose losses follow LAW, each seed offset by +-noise."""
    counts = {}
    recipe = V2
    for budget, widths in ((8e9, (8, 16, 32)), (1.6e10, (8, 16, 32)), (3.2e10, top_widths)):
        for width in widths:
            cand = plan_run(budget, width, SETTINGS, recipe)
            base = LAW["E"] + LAW["A"] / cand.params ** LAW["alpha"] + LAW["B"] / cand.tokens ** LAW["beta"]
            for seed in range(seeds):
                counts[partition_key(budget, width, seed)] = {
                    "budget": cand.budget,
                    "params": cand.params,
                    "tokens": cand.tokens,
                    "flops": cand.flops,
                    "validation_loss": base * (1 + noise * (-1) ** (seed + width // 8)),
                    "vocab_size": 257,
                    "recipe": "v2",
                    "lr_base": recipe.lr_base,
                    "lr_sweep_flops": 1e9,
                }
    return counts


def fit_of(counts: dict) -> dict:
    from marin_assets.scaling.fits import fit_isoflop
    from marin_assets.scaling.ladder import runs_from_counts

    runs, _ = runs_from_counts(counts)
    config = IsoFlopConfig(bootstrap_n=0)
    return fit_summary_of(fit_isoflop(runs, config)) | {
        "runs": [dict(c) | {"partition": k} for k, c in counts.items()],
        "isoflop_config": config.__dict__ | {"bootstrap_n": 50},
    }


def test_seeds_are_averaged_and_resampled_for_the_interval():
    one, two = law_counts(1, 0.0), law_counts(2, 0.01)
    # Two seeds +-1% around the law average to the law: the fits agree.
    assert fit_of(two)["n_opt_exponent"] == pytest.approx(fit_of(one)["n_opt_exponent"], rel=1e-6)
    config = IsoFlopConfig(bootstrap_n=50)
    cand = plan_run(6.4e10, 24, SETTINGS, V2)
    point = loss_at_config(fit_of(two), cand.flops, cand.params)
    interval = seed_interval(two, config, cand.flops, cand.params, n=50)
    assert interval["low"] < point < interval["high"] and interval["seeds_per_point"] == 2 and interval["n_ok"] > 40
    assert seed_interval(one, config, cand.flops, cand.params, n=50) is None  # one seed: no interval from seeds


def test_the_top_budget_holdout_predicts_the_largest_budgets_runs_from_the_others():
    counts = law_counts(2, 0.01)
    out = top_budget_holdout(counts, IsoFlopConfig(bootstrap_n=0))
    lower = {k: c for k, c in counts.items() if c["budget"] < 3e10}
    fit = fit_of(lower)
    assert len(out["fitted_budgets"]) == 2 and out["held_out_budget"] == pytest.approx(3.2e10, rel=0.05)
    assert out["n_opt_exponent"] == pytest.approx(fit["n_opt_exponent"])
    top = {k: c for k, c in counts.items() if c["budget"] > 3e10}
    assert [r["params"] for r in out["rows"]] == sorted({c["params"] for c in top.values()})  # widths 16, 24, 40
    # Rows in order of N, not of their keys' text ("C3.2e10-d16" sorts before "C3.2e10-d8").
    rows = top_budget_holdout(law_counts(1, 0.0, top_widths=(8, 16, 32)), IsoFlopConfig(bootstrap_n=0))["rows"]
    assert [r["params"] for r in rows] == sorted(r["params"] for r in rows) and len(rows) == 3
    for row in out["rows"]:
        runs = [c for c in top.values() if c["params"] == row["params"]]
        # The seeds' +-1% cancel in the mean; the prediction is the lower budgets' fit at that run.
        assert row["actual"] == pytest.approx(sum(c["validation_loss"] for c in runs) / 2)
        assert row["predicted"] == pytest.approx(loss_at_config(fit, runs[0]["flops"], row["params"]))
        assert row["relative_error"] == pytest.approx((row["predicted"] - row["actual"]) / row["actual"])
    assert out["mean_abs_relative_error"] == pytest.approx(sum(abs(r["relative_error"]) for r in out["rows"]) / 3)
    # A law with a floor, fitted on two budgets by a floorless power law: it extrapolates 2x to within ~2%.
    assert 0 < out["mean_abs_relative_error"] < 0.02
    with pytest.raises(ValueError, match=r"1 budget\(s\) below the largest; the fit needs >= 2"):
        top_budget_holdout({k: c for k, c in counts.items() if c["budget"] > 1e10}, IsoFlopConfig(bootstrap_n=0))


def test_run_noise_is_one_runs_pooled_seed_deviation_relative_to_its_loss():
    assert run_noise(law_counts(1, 0.0)) is None  # one seed: no noise measured
    # Two seeds at +-1% of the law: each point's sample SD is sqrt(2) x 1% of its mean.
    assert run_noise(law_counts(2, 0.01)) == pytest.approx(0.01 * 2**0.5)
    # Variances pool, SDs do not average: points at +-1% and +-3% give sqrt((2e-4 + 18e-4) / 2), not 2.83%.
    losses = {"C1e10-d8": 2.02, "C1e10-d8-s1": 1.98, "C1e10-d16": 3.09, "C1e10-d16-s1": 2.91}
    assert run_noise({k: {"validation_loss": v} for k, v in losses.items()}) == pytest.approx(1e-3**0.5)


def test_a_prediction_names_its_run_and_the_target_replans_exactly_it():
    ladder = Ladder(
        name="law",
        budgets=(8e9, 1.6e10, 3.2e10),
        widths=((8, 16, 32), (8, 16, 32), (16, 24, 40)),
        targets=(Target("x2", 2.0), Target("pinned", 4.0, width=32, batch_size=8)),
        seeds=(0, 1),
    )
    fit = fit_of(law_counts(2, 0.002))
    pred = json.loads(json.dumps(predict_target(fit, ladder, ladder.targets[0], SETTINGS)))
    assert pred["budget"] == pytest.approx(6.4e10, rel=0.05) and pred["recipe"]["name"] == "v2"
    assert pred["config"]["params"] == pytest.approx(pred["params_opt"], rel=0.5)  # the member nearest N*
    assert pred["loss"] == pytest.approx(loss_at_config(fit, pred["config"]["flops"], pred["config"]["params"]))
    assert pred["ladder_flops"] == pytest.approx(sum(r["flops"] for r in fit["runs"])) and pred["lr_sweep_flops"] == 1e9
    assert pred["interval"]["low"] < pred["loss"] < pred["interval"]["high"]
    assert pred["run_sd"] == pytest.approx(0.002 * 2**0.5)  # the ladder's seeds, +-0.2% at every point
    cand = frozen_candidate(pred, SETTINGS)
    assert json.loads(json.dumps(cand.as_dict())) == pred["config"]
    with pytest.raises(ValueError, match=r"differs from the frozen prediction in \[.*'steps'"):
        frozen_candidate(pred, SweepSettings(vocab_size=257, seq_len=64, batch_sizes=[8], min_steps=20))
    pinned = predict_target(fit, ladder, ladder.targets[1], SETTINGS)
    assert (pinned["config"]["width"], pinned["config"]["batch_size"]) == (32, 8)
    # How far each target's model is from N*, against the farthest fitted run from its budget's N*.
    reach = max(abs(off_optimum(fit, r["flops"], r["params"])) for r in fit["runs"])
    for p in (pred, pinned):
        decades = off_optimum(fit, p["config"]["flops"], p["config"]["params"])
        assert p["off_optimum"] == {
            "decades": pytest.approx(decades),
            "ladder_reach_decades": pytest.approx(reach),
            "extrapolated": abs(decades) > reach,
        }
    assert abs(pred["off_optimum"]["decades"]) < 0.1 and not pred["off_optimum"]["extrapolated"]  # the member nearest N*
    far = predict_target(fit, ladder, Target("far", 2.0, width=128, batch_size=8), SETTINGS)["off_optimum"]
    assert far["decades"] > far["ladder_reach_decades"] and far["extrapolated"]


def test_a_target_of_pinned_tokens_trains_exactly_them_and_replans_exactly_them():
    """A main run's target: its model and batch for its tokens, not the nearest 1.1 budget bucket
    (a bucket is up to 5% off: 82 steps instead of the main run's 81)."""
    ladder = Ladder(
        name="law",
        budgets=(8e9, 1.6e10, 3.2e10),
        widths=((8, 16, 32), (8, 16, 32), (16, 24, 40)),
        targets=(Target("main", 4.0, width=32, batch_size=8, tokens=81 * 8 * 32),),
        seeds=(0, 1),
    )
    fit = fit_of(law_counts(2, 0.002))
    pred = json.loads(json.dumps(predict_target(fit, ladder, ladder.targets[0], SETTINGS)))
    assert (pred["config"]["steps"], pred["config"]["tokens"], pred["pinned_tokens"]) == (81, 81 * 8 * 32, 81 * 8 * 32)
    assert pred["budget"] == pred["config"]["flops"] and pred["multiple"] == pytest.approx(pred["budget"] / 3.2e10)
    assert pred["loss"] == pytest.approx(loss_at_config(fit, pred["config"]["flops"], pred["config"]["params"]))
    assert json.loads(json.dumps(frozen_candidate(pred, SETTINGS).as_dict())) == pred["config"]
    with pytest.raises(ValueError, match=r"differs from the frozen prediction in \[.*'tokens'"):
        frozen_candidate(pred, SweepSettings(vocab_size=257, seq_len=64))
    with pytest.raises(ValueError, match="not whole steps of 256"):
        predict_target(fit, ladder, Target("main", 4.0, width=32, batch_size=8, tokens=1000), SETTINGS)
    with pytest.raises(ValueError, match="pinned tokens need a pinned width and batch_size"):
        Target("main", 4.0, tokens=512)


def test_the_comparison_reports_errors_intervals_and_the_cost_fraction():
    preds = {
        t: {
            "ladder": "law",
            "target": t,
            "multiple": m,
            "budget": b,
            "loss": p,
            "c_fit": 1e10,
            "recipe": {"name": "v2"},
            "interval": {"low": p - 0.05, "high": p + 0.05},
            "ladder_flops": 6e10,
            "lr_sweep_flops": 1e10,
            "loss_law": FIT["loss_law"],
            "in_sample": [{"budget": 1e10, "vertex_loss": 3.0, "predicted": 3.0}],
        }
        for t, m, b, p in (("x3", 3, 3e10, 2.6), ("x10", 10, 1e11, 2.4))
    }
    actual = {
        "x3": {"validation_loss": 2.5, "flops": 3e10, "width": 16, "params": 1e4},
        "x10": {"validation_loss": 2.41, "flops": 1e11, "width": 24, "params": 2e4},
    }
    out = compare(preds, actual, bound=0.01)
    rows = {r["target"]: r for r in out["rows"]}
    assert rows["x3"]["relative_error"] == pytest.approx(0.04) and rows["x3"]["actual_in_interval"] is False
    assert rows["x10"]["relative_error"] == pytest.approx(-0.01 / 2.41) and rows["x10"]["actual_in_interval"] is True
    assert not out["passed"] and out["max_abs_relative_error"] == pytest.approx(0.04)
    assert rows["x3"]["actual_runs"] == [2.5] and rows["x3"]["run_interval"] == rows["x3"]["interval"]  # no run noise known
    assert out["ladder_cost_fraction"] == pytest.approx((6e10 + 1e10) / 1.3e11)
    assert comparison_png(out, preds)[:8] == b"\x89PNG\r\n\x1a\n"
    assert math.isfinite(out["target_flops"])


def test_the_comparison_takes_a_targets_seed_mean_and_widens_the_interval_by_the_runs_noise():
    """A target run at several seeds: the actual is their mean; the interval it is judged by adds
    the ladder's one-run noise over sqrt(seeds) to the fit's interval, in quadrature."""
    pred = {
        "ladder": "law",
        "target": "x3",
        "multiple": 3,
        "budget": 3e10,
        "loss": 2.6,
        "c_fit": 1e10,
        "recipe": {"name": "v2"},
        "interval": {"low": 2.57, "high": 2.64, "level": 0.95},
        "run_sd": 0.01,
        "ladder_flops": 6e10,
        "lr_sweep_flops": 0.0,
        "loss_law": FIT["loss_law"],
        "in_sample": [],
    }
    run = {"flops": 3e10, "width": 16, "params": 1e4}
    seeds = [run | {"validation_loss": loss} for loss in (2.525, 2.565)]
    (row,) = compare({"x3": pred}, {"x3": seeds}, bound=0.05)["rows"]
    assert row["actual"] == pytest.approx(2.545) and row["actual_runs"] == [2.525, 2.565]
    assert row["relative_error"] == pytest.approx(0.055 / 2.545)
    noise = 1.959964 * 0.01 * 2.6 / 2**0.5  # z(97.5%) x one run's SD of the loss / sqrt(2 seeds)
    assert row["run_interval"]["low"] == pytest.approx(2.6 - (0.03**2 + noise**2) ** 0.5, rel=1e-6)
    assert row["run_interval"]["high"] == pytest.approx(2.6 + (0.04**2 + noise**2) ** 0.5, rel=1e-6)
    assert row["interval"] == pred["interval"] and row["actual_in_interval"] is False  # 2.545 < 2.553
    # One seed at the same loss: more noise, a wider interval, and 2.545 is inside it (low 2.541).
    (one,) = compare({"x3": pred}, {"x3": seeds[0] | {"validation_loss": 2.545}}, bound=0.05)["rows"]
    assert one["run_interval"]["low"] < 2.545 < row["run_interval"]["low"] and one["actual_in_interval"] is True
    # The cost fraction counts the target's run once, not once per seed.
    assert compare({"x3": pred}, {"x3": seeds}, bound=0.05)["target_flops"] == 3e10
