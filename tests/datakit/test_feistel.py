"""Feistel permutation: bijection, determinism, no local structure (unlike the LCG)."""

from __future__ import annotations

import numpy as np
import pytest

from marin_assets.datakit.feistel import BlockShuffle, FeistelPermutation, LcgPermutation, shuffled_index


@pytest.mark.parametrize("n", [1, 2, 3, 1000, 2**20 + 7])
def test_feistel_is_a_deterministic_bijection(n):
    x = np.arange(n)
    p = FeistelPermutation(n, key=1234).permute(x)
    assert p.dtype == np.int64 and p.shape == (n,)
    assert np.array_equal(np.sort(p), x)  # bijection onto [0, n)
    again = FeistelPermutation(n, key=1234).permute(x[::-1])
    assert np.array_equal(again, p[::-1])  # same key, same map, order-independent


def test_keys_give_different_permutations_and_identity_is_rare():
    n = 1000
    a = FeistelPermutation(n, key=1).permute(np.arange(n))
    b = FeistelPermutation(n, key=2).permute(np.arange(n))
    assert (a != b).mean() > 0.9
    assert (a == np.arange(n)).sum() < 10  # a random permutation has ~1 fixed point


def test_scalar_and_out_of_range_inputs():
    f = FeistelPermutation(10, key=3)
    assert int(f(4)) == f.permute(np.arange(10))[4]
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        f.permute(np.array([10]))
    with pytest.raises(ValueError, match="domain"):
        FeistelPermutation(0, key=1)


def _adjacent_statistics(p: np.ndarray, n: int) -> tuple[float, float]:
    """(distinct adjacent gaps / (n - 1), fraction of repeated strides)."""
    gaps = np.diff(p) % n
    distinct = np.unique(gaps).size / (n - 1)
    repeated_stride = float((gaps[1:] == gaps[:-1]).mean())
    return distinct, repeated_stride


def test_adjacent_inputs_land_far_apart_unlike_lcg():
    n = 1000
    x = np.arange(n)
    lcg = LcgPermutation(n, key=5).permute(x)
    feistel = FeistelPermutation(n, key=5).permute(x)
    assert np.array_equal(np.sort(lcg), x)  # the LCG is a bijection too ...
    lcg_distinct, lcg_stride = _adjacent_statistics(lcg, n)
    f_distinct, f_stride = _adjacent_statistics(feistel, n)
    # ... but every adjacent pair is the same stride apart: the local structure survives.
    assert lcg_distinct == 1 / (n - 1) and lcg_stride == 1.0
    # A uniform random permutation has ~(1 - 1/e) n distinct gaps and ~1/n repeated strides.
    assert 0.55 < f_distinct < 0.7
    assert f_stride < 0.01
    # Mean circular distance between images of neighbours: 1/4 of n for a random map.
    d = np.abs(np.diff(feistel))
    assert 0.2 < np.minimum(d, n - d).mean() / n < 0.3


@pytest.mark.parametrize("n", [1, 7, 1000, 4099])
def test_block_shuffle_is_a_bijection(n):
    shuffle = BlockShuffle(n, key=11, block_size=16, window_blocks=4)
    out = shuffle(np.arange(n))
    assert np.array_equal(np.sort(out), np.arange(n))
    assert np.array_equal(out, BlockShuffle(n, key=11, block_size=16, window_blocks=4)(np.arange(n)))


def test_block_shuffle_moves_whole_blocks_then_mixes_within_windows():
    n, block = 640, 16  # 40 whole blocks
    # One block per window: each output block holds exactly one source block, shuffled.
    out = BlockShuffle(n, key=4, block_size=block, window_blocks=1)(np.arange(n)).reshape(-1, block)
    source_blocks = out // block
    assert np.all(source_blocks == source_blocks[:, :1])
    assert not np.array_equal(source_blocks[:, 0], np.arange(n // block))  # blocks moved
    assert not np.array_equal(np.sort(out, axis=1), out)  # and shuffled inside
    # Four blocks per window: a window's outputs come from exactly four source blocks.
    out4 = BlockShuffle(n, key=4, block_size=block, window_blocks=4)(np.arange(n)).reshape(-1, 4 * block)
    for row in out4:
        assert np.unique(row // block).size == 4


def test_default_shuffled_index():
    n = 300_000  # more than one default window of 256 * 512 examples
    i = np.arange(0, n, 997)
    out = shuffled_index(i, n, key=9)
    assert out.shape == i.shape and out.min() >= 0 and out.max() < n
    one = shuffled_index(int(i[1]), n, key=9)
    assert isinstance(one, int) and one == out[1]
    full = BlockShuffle(n, key=9)(np.arange(n))
    assert np.array_equal(full[i], out)
    assert np.array_equal(np.sort(full), np.arange(n))


# ---- exact outputs: the bijection and statistics tests above pass with a round missing --------------

_MASK64 = (1 << 64) - 1


def _reference_mix64(x: int) -> int:
    """splitmix64's finaliser on a Python int, written out from its published constants."""
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _MASK64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _reference_feistel(x: int, n: int, key: int, rounds: int = 5) -> int:
    """The module docstring's algorithm, followed by hand in plain ints (no numpy, no shared code)."""
    bits = max(2, (n - 1).bit_length())
    keys = [_reference_mix64(((key & _MASK64) + 0x9E3779B97F4A7C15 * i) & _MASK64) for i in range(1, rounds + 1)]
    while True:  # cycle-walk until the value is back inside [0, n)
        lw, rw = bits // 2, bits - bits // 2
        left, right = x >> rw, x & ((1 << rw) - 1)
        for k in keys:
            left, right = right, left ^ (_reference_mix64(right ^ k) & ((1 << lw) - 1))
            lw, rw = rw, lw
        x = (left << rw) | right
        if x < n:
            return x


@pytest.mark.parametrize(
    "n,key,inputs,expected",
    [
        (10, 3, range(10), [4, 6, 3, 1, 5, 8, 7, 2, 9, 0]),
        (37, 0, range(8), [12, 21, 20, 19, 26, 18, 32, 8]),
        (1000, 1234, range(12), [609, 622, 701, 209, 732, 505, 278, 418, 291, 9, 758, 809]),
        (2**20 + 7, 2**63 + 5, [0, 1, 2, 2**20 + 6], [213173, 330486, 245041, 73864]),
        (2**20 + 7, -1, [0, 1, 2, 2**20 + 6], [691749, 377176, 7920, 280496]),  # key reduced mod 2^64
    ],
)
def test_feistel_exact_outputs_are_pinned(n, key, inputs, expected):
    """Shuffles must reproduce across releases: a changed round count, key schedule or half
    split gives another (equally random-looking) bijection, which only exact values catch."""
    got = FeistelPermutation(n, key=key).permute(np.asarray(list(inputs)))
    assert got.tolist() == expected


@pytest.mark.parametrize("n,key", [(10, 3), (37, 0), (1000, 1234), (4099, 2**64 - 1)])
def test_feistel_matches_an_independent_reference(n, key):
    expected = [_reference_feistel(x, n, key) for x in range(n)]
    assert FeistelPermutation(n, key=key).permute(np.arange(n)).tolist() == expected


def test_block_shuffle_exact_outputs_are_pinned():
    out = BlockShuffle(100, key=7, block_size=8, window_blocks=2)(np.arange(20))
    assert out.tolist() == [90, 60, 59, 61, 91, 56, 58, 57, 63, 95, 93, 94, 62, 88, 92, 89, 52, 49, 53, 55]
    assert shuffled_index(np.array([0, 1, 299_999]), 300_000, key=9).tolist() == [74519, 197036, 168002]
