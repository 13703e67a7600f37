"""Mixture schedules and the deterministic block sampler."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from marin_assets.datakit.mixture import MixtureSampler, MixtureSchedule


def test_schedule_normalises_and_switches_at_steps():
    schedule = MixtureSchedule([(0, {"web": 3, "code": 1}), (100, {"web": 1, "math": 1})])
    assert schedule.sources == ["code", "math", "web"]
    assert schedule.weights_at(0) == {"code": 0.25, "math": 0.0, "web": 0.75}
    assert schedule.weights_at(99) == schedule.weights_at(0)
    assert schedule.weights_at(100) == {"code": 0.0, "math": 0.5, "web": 0.5}
    assert schedule.weights_at(10**9) == schedule.weights_at(100)


@pytest.mark.parametrize(
    "stages, message",
    [
        ([], "at least one"),
        ([(5, {"a": 1})], "start at step 0"),
        ([(0, {"a": 1}), (10, {"a": 1}), (10, {"a": 2})], "strictly ascending"),
        ([(0, {"a": -1, "b": 2})], "'a' must be finite and >= 0"),
        ([(0, {"a": float("nan")})], "finite"),
        ([(0, {"a": 0.0})], "sum to zero"),
    ],
)
def test_schedule_validation(stages, message):
    with pytest.raises(ValueError, match=message):
        MixtureSchedule(stages)


def test_block_proportions_match_weights():
    schedule = MixtureSchedule.constant({"a": 0.5, "b": 0.3, "c": 0.2})
    sampler = MixtureSampler(schedule, {"a": 1000, "b": 50, "c": 7}, seed=1)
    counts = Counter(src for src, _ in sampler.sample(4 * 2048))
    for name, w in schedule.weights_at(0).items():
        assert abs(counts[name] / (4 * 2048) - w) <= 1 / 2048
    assert sampler.block_counts(0) == {"a": 1024, "b": 614, "c": 410}  # largest remainder of 2048


def test_indices_cover_each_source_once_per_epoch():
    # 32 of each source per block of 64: every block is exactly one epoch of "a".
    sampler = MixtureSampler(MixtureSchedule.constant({"a": 1, "b": 1}), {"a": 32, "b": 1024}, seed=2, block_size=64)
    blocks = [sampler.block(t) for t in range(32)]
    a_epochs = [[i for s, i in blk if s == "a"] for blk in blocks]
    for epoch in a_epochs:
        assert sorted(epoch) == list(range(32))
    assert a_epochs[0] != a_epochs[1]  # each epoch is reshuffled
    b = [i for blk in blocks for s, i in blk if s == "b"]
    assert sorted(b) == list(range(1024))  # one full epoch of b, no repeats
    assert b[:50] != sorted(b[:50])  # not read in storage order


def test_sampler_is_deterministic_and_random_access():
    schedule = MixtureSchedule([(0, {"a": 1, "b": 1}), (3, {"a": 1, "b": 3})])
    make = lambda seed: MixtureSampler(schedule, {"a": 37, "b": 90}, seed=seed, block_size=32, examples_per_step=8)
    sequential = make(5).sample(32 * 10)
    assert sequential == make(5).sample(32 * 10)
    assert make(5).block(7) == sequential[7 * 32 : 8 * 32]  # block 7 without replaying 0..6
    assert make(6).sample(32 * 10) != sequential


def test_schedule_switch_changes_block_proportions():
    # 8 examples per step, blocks of 32 = 4 steps; stage 2 begins at step 12 = block 3.
    schedule = MixtureSchedule([(0, {"a": 1, "b": 0}), (12, {"a": 1, "b": 3})])
    sampler = MixtureSampler(schedule, {"a": 50, "b": 50}, seed=3, block_size=32, examples_per_step=8)
    per_block = [Counter(s for s, _ in sampler.block(t)) for t in range(6)]
    assert [c["b"] for c in per_block] == [0, 0, 0, 24, 24, 24]
    assert [c["a"] for c in per_block] == [32, 32, 32, 8, 8, 8]
    # Source a keeps reading its shuffled order across the switch (no restart, no repeat).
    a = [i for t in range(6) for s, i in sampler.block(t) if s == "a"]
    assert len(a) == 120 and set(Counter(a).values()) == {2, 3}  # 120 draws of 50 docs


def test_missing_documents_for_a_weighted_source_is_an_error():
    with pytest.raises(ValueError, match="'b' has positive weight but 0 documents"):
        MixtureSampler(MixtureSchedule.constant({"a": 1, "b": 1}), {"a": 10, "b": 0}, seed=0)
    # A source with zero weight everywhere may be empty.
    MixtureSampler(MixtureSchedule.constant({"a": 1, "b": 0}), {"a": 10}, seed=0)
    assert np.isclose(sum(MixtureSchedule.constant({"x": 2, "y": 2}).weights_at(5).values()), 1.0)
