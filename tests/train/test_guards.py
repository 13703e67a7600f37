import jax.numpy as jnp
import numpy as np
import pytest

from marin_assets.train.guards import (GuardConfig, clip_updates, init_guard_state, record, should_skip,
                                       window_threshold)


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
    for loss, ok, kind in ((jnp.nan, True, "skipped_nonfinite"), (2.0, False, "skipped_bad_batch"),
                           (jnp.inf, True, "skipped_nonfinite")):
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
