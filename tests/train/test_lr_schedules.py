import math

import pytest

from marin_assets.train.config import ScheduleConfig
from marin_assets.train.lr_schedules import learning_rate


def lr(step, **kw):
    return float(learning_rate(step, ScheduleConfig(**kw)))


def test_wsd_warmup_stable_decay_to_five_percent():
    kw = dict(kind="wsd", peak_lr=1.0, warmup_steps=10, total_steps=100, decay_steps=20)
    assert lr(0, **kw) == 0.0
    assert lr(5, **kw) == pytest.approx(0.5)
    assert lr(10, **kw) == 1.0 and lr(79, **kw) == 1.0
    assert lr(90, **kw) == pytest.approx(1.0 - 0.95 * 10 / 20)
    assert lr(100, **kw) == pytest.approx(0.05)
    assert lr(500, **kw) == pytest.approx(0.05)  # stays at the floor


@pytest.mark.parametrize("step", [81, 83, 85, 87, 93, 95, 97, 99])
def test_wsd_decay_is_linear_at_interior_points(step):
    """Linear, not cosine: the two agree at the decay's ends and midpoint (80, 90, 100) only,
    so check points on both sides of the midpoint against the straight line and the curve."""
    kw = dict(kind="wsd", peak_lr=1.0, warmup_steps=10, total_steps=100, decay_steps=20)
    frac = (step - 80) / 20
    linear = 1.0 - 0.95 * frac
    cosine = 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac))
    assert lr(step, **kw) == pytest.approx(linear, abs=1e-6)
    assert abs(lr(step, **kw) - cosine) > 0.01  # the check could tell the two apart here


def test_cosine_ends_at_floor():
    kw = dict(kind="cosine", peak_lr=2.0, warmup_steps=0, total_steps=50, decay_steps=0, min_lr_fraction=0.1)
    assert lr(0, **kw) == pytest.approx(2.0)
    assert lr(25, **kw) == pytest.approx(0.2 + 1.8 * 0.5)
    assert lr(50, **kw) == pytest.approx(0.2)


def test_wsd_s_cycles_decay_and_rewarm():
    kw = dict(kind="wsd_s", peak_lr=1.0, warmup_steps=4, total_steps=1000, cycle_steps=20, decay_steps=5, rewarm_steps=4)
    assert lr(4 + 10, **kw) == 1.0  # stable inside cycle 0
    assert lr(4 + 20 - 1, **kw) < 0.3  # end of cycle 0 decays
    assert lr(4 + 20, **kw) == pytest.approx(0.05)  # cycle 1 re-warms from the floor
    assert lr(4 + 22, **kw) == pytest.approx(0.05 + 0.95 * 0.5)
    assert lr(4 + 30, **kw) == 1.0
    # the pattern repeats
    assert lr(4 + 45, **kw) == pytest.approx(lr(4 + 25, **kw))


def test_linear_cooldown_from_a_fraction_and_rewarm_from_floor():
    cool = dict(kind="linear_decay", peak_lr=1.0, warmup_steps=0, total_steps=11, decay_steps=0, start_fraction=0.8)
    assert lr(0, **cool) == pytest.approx(0.8)
    assert lr(10, **cool) == pytest.approx(0.05)
    assert lr(5, **cool) == pytest.approx((0.8 + 0.05) / 2)
    rewarm = dict(kind="wsd", peak_lr=1.0, warmup_steps=10, warmup_start_fraction=0.05, total_steps=100, decay_steps=10)
    assert lr(0, **rewarm) == pytest.approx(0.05)
    assert lr(10, **rewarm) == 1.0


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(kind="nope"), "kind"),
        (dict(warmup_steps=90, decay_steps=20, total_steps=100), "exceed"),
        (dict(kind="wsd_s", cycle_steps=0), "cycle_steps"),
        (dict(min_lr_fraction=1.5), "min_lr_fraction"),
    ],
)
def test_invalid_schedules_are_rejected(kw, msg):
    with pytest.raises(ValueError, match=msg):
        ScheduleConfig(**kw)


def test_schedule_is_jittable():
    import jax

    cfg = ScheduleConfig(kind="wsd", peak_lr=1.0, warmup_steps=10, total_steps=100, decay_steps=20)
    f = jax.jit(lambda s: learning_rate(s, cfg))
    assert all(math.isclose(float(f(s)), lr(s, **cfg.__dict__), rel_tol=1e-6) for s in (0, 3, 50, 95))
