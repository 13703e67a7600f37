import jax.numpy as jnp
import numpy as np
import pytest

from marin_assets.train.config import GuardConfig
from marin_assets.train.guards import (
    clip_grads,
    clip_updates,
    global_norm,
    init_guard_state,
    record,
    should_skip,
    window_threshold,
)


def test_window_threshold_matches_numpy():
    hist = jnp.array([1.0, 2.0, 3.0, 4.0, 0.0, 0.0])
    got = float(window_threshold(hist, jnp.int32(4), 2.0))
    assert got == pytest.approx(np.mean([1, 2, 3, 4]) + 2 * np.std([1, 2, 3, 4]), rel=1e-6)
    # after wrap-around all slots count
    assert float(window_threshold(hist, jnp.int32(10), 0.0)) == pytest.approx(10 / 6)


def feed(cfg, values):
    state = init_guard_state(cfg)
    for v in values:
        d = should_skip(cfg, state, jnp.float32(v), jnp.float32(1.0), True)
        state = record(cfg, state, d, v, 1.0, 0.1, jnp.bool_(False), jnp.bool_(False))
    return state


def test_spike_skipped_only_after_enough_history():
    cfg = GuardConfig(window=8, min_history=4, skip_sigma=3.0)
    state = feed(cfg, [2.0, 2.1, 1.9, 2.0])
    d = should_skip(cfg, state, jnp.float32(9.0), jnp.float32(1.0), True)
    assert bool(d["skip"]) and bool(d["spike"])
    d = should_skip(cfg, state, jnp.float32(2.05), jnp.float32(1.0), True)
    assert not bool(d["skip"])
    young = feed(cfg, [2.0, 2.1])
    assert not bool(should_skip(cfg, young, jnp.float32(9.0), jnp.float32(1.0), True)["skip"])


def test_a_lasting_level_shift_is_accepted_after_the_consecutive_skip_cap():
    cfg = GuardConfig(window=8, min_history=4, skip_sigma=3.0, max_consecutive_spikes=3)
    state = feed(cfg, [2.0, 2.1, 1.9, 2.0])
    skipped = []
    for _ in range(6):  # the loss moves to a new level and stays there
        d = should_skip(cfg, state, jnp.float32(5.0), jnp.float32(1.0), True)
        skipped.append(bool(d["skip"]))
        state = record(cfg, state, d, 5.0, 1.0, 0.1, jnp.bool_(False), jnp.bool_(False))
    assert skipped[:3] == [True, True, True] and skipped[3] is False  # the 4th is accepted
    assert int(state["counts"]["skipped_spike"]) == 3
    uncapped = GuardConfig(window=8, min_history=4, skip_sigma=3.0, max_consecutive_spikes=0)
    state = feed(uncapped, [2.0, 2.1, 1.9, 2.0, 5.0, 5.0, 5.0, 5.0, 5.0])
    assert int(state["counts"]["skipped_spike"]) == 5  # without the cap the run freezes


def test_nonfinite_and_bad_batch_always_skip_and_are_counted_separately():
    cfg = GuardConfig(window=8, min_history=4)
    state = init_guard_state(cfg)
    for loss, ok, kind in (
        (jnp.nan, True, "skipped_nonfinite"),
        (2.0, False, "skipped_bad_batch"),
        (jnp.inf, True, "skipped_nonfinite"),
    ):
        d = should_skip(cfg, state, jnp.float32(loss), jnp.float32(1.0), ok)
        assert bool(d["skip"])
        state = record(cfg, state, d, loss, 1.0, 0.1, jnp.bool_(False), jnp.bool_(False))
    assert int(state["counts"]["skipped_nonfinite"]) == 2
    assert int(state["counts"]["skipped_bad_batch"]) == 1
    assert int(state["n_accepted"]) == 0  # skipped steps stay out of the windows


def test_update_norm_clipped_to_window_threshold():
    cfg = GuardConfig(window=8, min_history=4, update_clip_sigma=2.0)
    state = init_guard_state(cfg)
    state["update_norm"] = jnp.array([1.0, 1.0, 1.0, 1.0, 0, 0, 0, 0])
    state["n_accepted"] = jnp.int32(4)
    updates = {"w": jnp.full((4,), 5.0)}  # norm 10, limit = 1 + 2*0 = 1
    clipped, norm, flag = clip_updates(cfg, state, updates)
    assert bool(flag) and float(norm) == pytest.approx(1.0)
    assert float(jnp.linalg.norm(clipped["w"])) == pytest.approx(1.0, rel=1e-5)
    small = {"w": jnp.full((4,), 0.25)}  # norm 0.5 < limit: untouched
    out, _, flag = clip_updates(cfg, state, small)
    assert not bool(flag) and np.array_equal(out["w"], small["w"])


# ---- each knob on its own: one knob moved off its default, the others left there ----------------------
# The history has spread (mean 2, std 1), so every sigma gives its own threshold (2 + sigma), and the
# defaults (grad_clip 1, both sigmas 6, window 128, min_history 16, 8 consecutive spikes) give other answers.

CALM = [1.0, 3.0] * 8


def calm_state(cfg):
    """16 accepted steps whose loss, grad norm and update norm all alternate 1, 3."""
    state = init_guard_state(cfg)
    for v in CALM:
        d = should_skip(cfg, state, jnp.float32(v), jnp.float32(v), True)
        state = record(cfg, state, d, v, v, v, jnp.bool_(False), jnp.bool_(False))
    assert int(state["n_accepted"]) == 16
    return state


def skips(cfg, state, loss, grad_norm=2.0) -> bool:
    return bool(should_skip(cfg, state, jnp.float32(loss), jnp.float32(grad_norm), True)["skip"])


def update_clipped(cfg, state, norm) -> tuple[bool, float]:
    _, out_norm, flag = clip_updates(cfg, state, {"w": jnp.full((4,), norm / 2)})  # 4 equal entries: norm
    return bool(flag), float(out_norm)


def test_grad_clip_knob_alone():
    cfg = GuardConfig(grad_clip=2.5)
    big = {"w": jnp.full((4,), 2.0)}  # norm 4
    out, flag = clip_grads(cfg, big, global_norm(big), jnp.bool_(False))
    assert bool(flag) and float(global_norm(out)) == pytest.approx(2.5, rel=1e-6)
    small = {"w": jnp.full((4,), 0.75)}  # norm 1.5: above the default clip of 1, below 2.5
    out, flag = clip_grads(cfg, small, global_norm(small), jnp.bool_(False))
    assert not bool(flag) and np.array_equal(out["w"], small["w"])
    off = GuardConfig(grad_clip=0.0)  # 0 disables
    out, flag = clip_grads(off, big, global_norm(big), jnp.bool_(False))
    assert not bool(flag) and np.array_equal(out["w"], big["w"])


def test_update_clip_sigma_knob_alone():
    cfg = GuardConfig(update_clip_sigma=2.0)
    state = calm_state(cfg)
    flag, norm = update_clipped(cfg, state, 4.5)
    assert flag and norm == pytest.approx(4.0, rel=1e-6)  # clipped to 2 + 2 * 1
    assert update_clipped(cfg, state, 3.9) == (False, pytest.approx(3.9, rel=1e-6))
    assert not skips(cfg, state, 4.5) and not skips(cfg, state, 2.0, grad_norm=4.5)  # the spike test keeps sigma 6
    off = GuardConfig(update_clip_sigma=0.0)  # 0 disables update clipping, and only that
    state = calm_state(off)
    assert update_clipped(off, state, 50.0) == (False, pytest.approx(50.0, rel=1e-6))
    assert skips(off, state, 50.0)


def test_skip_sigma_knob_alone():
    cfg = GuardConfig(skip_sigma=2.0)
    state = calm_state(cfg)
    assert skips(cfg, state, 4.5) and skips(cfg, state, 2.0, grad_norm=4.5)  # above 2 + 2 * 1, loss or grad norm
    assert not skips(cfg, state, 3.9, grad_norm=3.9)
    assert update_clipped(cfg, state, 4.5) == (False, pytest.approx(4.5, rel=1e-6))  # update clipping keeps sigma 6
    off = GuardConfig(skip_sigma=0.0)  # 0 disables the spike test, and only that
    state = calm_state(off)
    assert not skips(off, state, 50.0, grad_norm=50.0) and skips(off, state, float("nan"))
    assert update_clipped(off, state, 50.0) == (True, pytest.approx(8.0, rel=1e-6))


def test_window_knob_alone():
    cfg = GuardConfig(window=20)  # not min_history's 16, so a ring indexed by the wrong knob shows
    assert init_guard_state(cfg)["loss"].shape == (20,)
    state = feed(cfg, [1000.0] * 20 + [101.0, 103.0] * 10)  # 20 early high losses, then 20 calm ones
    assert int(state["n_accepted"]) == 40 and int(state["counts"]["skipped_spike"]) == 0
    # every slot now holds a calm loss (the 1000s are forgotten): 109 is above 102 + 6 * 1, which it
    # would not be over 128 steps, nor with slots left at 0 by a ring that wraps at another length
    assert skips(cfg, state, 109.0, grad_norm=1.0)
    assert not skips(cfg, state, 107.9, grad_norm=1.0)


def test_min_history_knob_alone():
    cfg = GuardConfig(min_history=4)
    four, three = feed(cfg, CALM[:4]), feed(cfg, CALM[:3])  # feed() records update norms of 0.1
    assert skips(cfg, four, 9.0, grad_norm=1.0)  # 9 > 2 + 6 * 1 once 4 steps were accepted
    assert not skips(cfg, three, 9.0, grad_norm=1.0)  # 3 steps: no statistical test yet
    assert update_clipped(cfg, four, 0.5) == (True, pytest.approx(0.1, rel=1e-5))
    assert update_clipped(cfg, three, 0.5) == (False, pytest.approx(0.5, rel=1e-6))


def test_max_consecutive_spikes_knob_alone():
    cfg = GuardConfig(max_consecutive_spikes=2)
    state = calm_state(cfg)
    skipped = []
    for _ in range(3):  # a lasting jump to 50
        d = should_skip(cfg, state, jnp.float32(50.0), jnp.float32(2.0), True)
        skipped.append(bool(d["skip"]))
        state = record(cfg, state, d, 50.0, 2.0, 2.0, jnp.bool_(False), jnp.bool_(False))
    assert skipped == [True, True, False]  # the default cap of 8 would skip all three
    assert int(state["counts"]["skipped_spike"]) == 2
