"""The ladder watches the main run (marin_assets/scaling/trajectory.py): its expected trajectory at
the main run's size, and a verdict per metric.

Synthetic ladders (a known law plus noise) check the fit and each metric's band in milliseconds;
the slow test trains real tiny runs: a small ladder, then the main size with a normal LR (inside)
and with a 100x LR (outside within 10 steps, while the loss-spike detector sees nothing).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from marin_assets.scaling.trajectory import Curve, LadderWatchSettings, check_trajectory, expected_trajectory
from marin_assets.scaling.trajectory_plot import trajectory_png

E, A, ALPHA, B, BETA = 1.8, 400.0, 0.5, 60.0, 0.4
TOKENS_PER_STEP = 512
STEPS = 60
SIZES = (2e4, 4e4, 8e4)  # the ladder's active parameters
TARGET = 5e4
SETTINGS = LadderWatchSettings()


def law(params: float, tokens: float) -> float:
    return E + A / params**ALPHA + B / tokens**BETA


def rows(params: float, seed: int, *, loss_shift=None, grad_scale=None, dropped=None, steps: int = STEPS) -> list[dict]:
    """Per-step rows like the trainer's: the law plus noise, a gradient norm near 1 (higher in the
    first steps), no drops; ``loss_shift(step)``, ``grad_scale(step)``, ``dropped(step)`` plant a fault."""
    rng = np.random.default_rng(seed)
    out = []
    for step in range(1, steps + 1):
        tokens = step * TOKENS_PER_STEP
        loss = law(params, tokens) + rng.normal(0, 0.04) + (loss_shift(step) if loss_shift else 0.0)
        grad = math.exp(rng.normal(0, 0.15)) * (1 + 2 * math.exp(-step / 5)) * (grad_scale(step) if grad_scale else 1.0)
        out.append({"step": step, "tokens": tokens, "loss": loss, "grad_norm": grad, "dropped": dropped(step) if dropped else 0})
    return out


def ladder() -> list[Curve]:
    return [Curve.from_rows(f"ladder-{n:g}-s{seed}", n, rows(n, seed)) for n in SIZES for seed in (0, 1)]


@pytest.fixture(scope="module")
def expected():
    return expected_trajectory(ladder(), TARGET, SETTINGS)


def main(seed: int = 7, **faults) -> Curve:
    return Curve.from_rows("main", TARGET, rows(TARGET, seed, **faults), planned_tokens=STEPS * TOKENS_PER_STEP)


def test_the_fit_recovers_the_law_at_the_main_runs_size(expected):
    # E and B/D^beta trade off over one decade of tokens; the sum is what the band is drawn around
    tokens = np.array([4e3, 1e4, 3e4])
    assert expected.loss(tokens) == pytest.approx([law(TARGET, t) for t in tokens], abs=0.03)
    assert 0.0 < expected.loss_sigma < 0.05  # the noise (0.04 per step), smoothed over 4 steps
    assert expected.points == len(SIZES) * 2 * (STEPS - 5) and expected.not_finite == 0


def test_a_normal_run_stays_inside(expected):
    for seed in range(5):
        verdict = check_trajectory(expected, main(seed=seed), SETTINGS)
        assert verdict.inside, verdict.reason
        assert verdict.first_step is None and verdict.reason.startswith("inside the ladder's band over 55 steps")


def test_a_too_high_lr_leaves_the_band_and_the_verdict_names_the_metric_and_the_step(expected):
    # What a 100x LR did on real tiny runs (the slow test below): from some step on the loss sits
    # nats above where it was heading and the gradient norm is several times the ladder's.
    start = 20
    too_high = main(loss_shift=lambda s: 1.5 * (s >= start), grad_scale=lambda s: 8.0 if s >= start else 1.0)
    verdict = check_trajectory(expected, too_high, SETTINGS)
    assert not verdict.inside
    loss, grad = verdict.metric("loss"), verdict.metric("grad_norm")
    assert not loss.inside and start <= loss.first_step <= start + 3
    assert not grad.inside and start <= grad.first_step <= start + 3
    assert verdict.first_step == min(loss.first_step, grad.first_step)
    assert f"loss left the ladder's band at step {loss.first_step}: " in verdict.reason
    assert f"gradient norm left the ladder's band at step {grad.first_step}: " in verdict.reason
    assert loss.value > loss.high and grad.value > grad.high
    assert verdict.metric("drop_rate").inside


def test_a_collapsed_gradient_norm_or_drops_leave_the_band_alone(expected):
    collapsed = check_trajectory(expected, main(grad_scale=lambda s: 0.05 if s >= 30 else 1.0), SETTINGS)
    assert [m.metric for m in collapsed.metrics if not m.inside] == ["grad_norm"]
    grad = collapsed.metric("grad_norm")
    assert 30 <= grad.first_step <= 33 and grad.value < grad.low and "< " in grad.reason
    drops = check_trajectory(expected, main(dropped=lambda s: 100 if s >= 40 else 0), SETTINGS)  # 100/512 per token
    assert [m.metric for m in drops.metrics if not m.inside] == ["drop_rate"]
    assert 40 <= drops.first_step <= 43 and drops.metric("drop_rate").high == pytest.approx(SETTINGS.drop_rate_floor)


def test_one_spike_or_one_nan_step_is_not_leaving_the_band_but_a_nan_streak_is(expected):
    spike = check_trajectory(expected, main(loss_shift=lambda s: 3.0 * (s == 30)), SETTINGS)
    assert spike.inside  # one step: the loss-spike detector's business
    one_nan = check_trajectory(expected, main(loss_shift=lambda s: math.nan if s == 30 else 0.0), SETTINGS)
    assert one_nan.inside
    streak = check_trajectory(expected, main(loss_shift=lambda s: math.nan if s >= 30 else 0.0), SETTINGS)
    loss = streak.metric("loss")
    assert not loss.inside and loss.first_step == 30 and math.isnan(loss.value) and "not finite" in loss.reason


def test_a_loss_below_the_ladders_is_not_a_fault(expected):
    assert check_trajectory(expected, main(loss_shift=lambda s: -1.0 * (s >= 20)), SETTINGS).metric("loss").inside


def test_the_warmup_is_not_judged_and_unlogged_metrics_are_named(expected):
    bad_start = check_trajectory(expected, main(loss_shift=lambda s: 5.0 * (s <= 5)), SETTINGS)  # 10% of 60 steps
    assert bad_start.inside
    no_drops = [{k: v for k, v in r.items() if k != "dropped"} for r in rows(TARGET, 7)]
    verdict = check_trajectory(expected, Curve.from_rows("main", TARGET, no_drops), SETTINGS)
    assert verdict.inside and verdict.metric("drop_rate").judged == 0 and "drop rate not measured" in verdict.reason


def test_a_later_phase_is_judged_on_the_runs_tokens_and_its_own_fraction(expected):
    # Steps 31-60 as a phase of their own, warm-started at 30 steps' tokens: same law, so inside;
    # a fault in its first 10% (steps 31-33) is its warmup, not judged.
    later = rows(TARGET, 3)[30:]
    phase = Curve.from_rows("main-phase2", TARGET, later, start_tokens=30 * TOKENS_PER_STEP, planned_tokens=30 * TOKENS_PER_STEP)
    assert phase.fraction()[0] == pytest.approx(1 / 30) and check_trajectory(expected, phase, SETTINGS).inside


def test_the_plot_is_a_png(expected):
    curve = main(loss_shift=lambda s: 1.5 * (s >= 20))
    png = trajectory_png(expected, curve, check_trajectory(expected, curve, SETTINGS), SETTINGS, ladder())
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_bad_rows_and_settings_are_named():
    with pytest.raises(ValueError, match=r"run-x: metrics row 1 needs a numeric step and tokens"):
        Curve.from_rows("run-x", 1e4, [{"step": 1, "tokens": 512, "loss": 3.0}, {"step": 2, "loss": 3.0}])
    with pytest.raises(ValueError, match=r"run-x: metrics row 0 \(step 1\): grad_norm 'high' is not a number"):
        Curve.from_rows("run-x", 1e4, [{"step": 1, "tokens": 512, "loss": 3.0, "grad_norm": "high"}])
    with pytest.raises(ValueError, match=r"run-x: metrics row 0 \(step 1\) has tokens nan"):
        Curve.from_rows("run-x", 1e4, [{"step": 1, "tokens": math.nan, "loss": 3.0}])
    assert math.isnan(Curve.from_rows("r", 1e4, [{"step": 1, "tokens": 1, "loss": "nan"}]).series("loss")[0])
    with pytest.raises(ValueError, match="action must be one of"):
        LadderWatchSettings(action="pause")
    with pytest.raises(ValueError, match="LadderWatchSettings.loss_sigmas must be finite, got nan"):
        LadderWatchSettings(loss_sigmas=math.nan)
    with pytest.raises(ValueError, match="needs runs of >= 2 model sizes"):
        expected_trajectory([Curve.from_rows("one", 2e4, rows(2e4, 0))], TARGET, SETTINGS)


# ---------------------------------------------------------------- real tiny runs

WIDTHS = {"ladder": (16, 32), "main": 24}
# Each run's cost is mostly tracing its step (seconds, whatever its length), so the runs are as
# few as the property needs (two ladder sizes, a normal and a too-high main run) and short.
STEPS_REAL = 20


def _model(width: int) -> dict:
    from tests.support.configs import TINY_MODEL

    return dict(TINY_MODEL, d_model=width, d_ff=2 * width, expert_d_ff=width, n_heads=max(1, width // 16), n_kv_heads=1)


def _active_params(width: int) -> float:
    from marin_assets.model import count_params
    from marin_assets.model.config import ModelConfig

    return float(count_params(ModelConfig(**_model(width)))[1])


def _train(caches, out, width: int, lr: float, seed: int) -> Curve:
    from marin_assets.train.config import config_from_dict
    from marin_assets.train.loop import train
    from marin_assets.train.metrics import read_metrics

    config = config_from_dict(
        {
            "model": _model(width),
            "seq_len": 32,
            "batch_size": 8,
            "num_steps": STEPS_REAL,
            "seed": seed,
            "data_seed": seed,
            "checkpoint_every_steps": STEPS_REAL,
            "guards": {"max_skipped_fraction": 1.0},  # let a diverging run log every step
            "schedule": {"kind": "wsd", "peak_lr": lr, "warmup_steps": 2, "decay_steps": 4},
        },
        "run",
    )
    result = train(config, caches, out, resume=False, telemetry_root=str(out / "telemetry"))
    return Curve.from_rows(
        f"d{width}-lr{lr:g}-s{seed}", _active_params(width), read_metrics(result.metrics_path), planned_tokens=STEPS_REAL * 8 * 32
    )


@pytest.mark.slow
def test_real_runs_a_100x_lr_leaves_the_band_within_10_steps_and_a_normal_lr_stays_inside(tmp_path):
    """Measured here on 20-step runs: LR 1e-2 stays inside with main seeds 0, 1 and 2; LR 1.0 leaves
    at step 3 with each (its gradient norm, 4.9 > 2.9 with seed 1; its loss at step 5, 6.75 > 5.19).
    The loss-spike detector sees nothing with seeds 1 and 2 (with seed 0 it fires too). On 40-step
    runs a 10x LR (0.1) trained about as well and sat on the gradient norm's lower edge, so it is
    not asserted either way."""
    from marin_assets.phases.signals import loss_spike
    from tests.support.caches import stdlib_module_docs, stdlib_paragraphs, write_cache

    write_cache(tmp_path / "license", stdlib_paragraphs())
    write_cache(tmp_path / "docs", stdlib_module_docs())
    caches = {"license": tmp_path / "license", "docs": tmp_path / "docs"}
    runs = [_train(caches, tmp_path / f"ladder{w}", w, 1e-2, seed=0) for w in WIDTHS["ladder"]]
    expected = expected_trajectory(runs, _active_params(WIDTHS["main"]), SETTINGS)
    normal = _train(caches, tmp_path / "normal", WIDTHS["main"], 1e-2, seed=1)
    too_high = _train(caches, tmp_path / "too_high", WIDTHS["main"], 1.0, seed=1)

    inside = check_trajectory(expected, normal, SETTINGS)
    assert inside.inside, inside.reason
    outside = check_trajectory(expected, too_high, SETTINGS)
    assert not outside.inside and outside.first_step <= 10, outside.reason
    assert outside.metric("loss").first_step <= 10 and "loss left the ladder's band at step" in outside.reason
    # The phase controller's own detector compares a run with its own recent past: a run that is
    # bad from the start and stays bad never spikes against it.
    losses = list(too_high.series("loss"))
    assert not any(loss_spike(losses[: i + 1], 6.0, 32) for i in range(len(losses)))
