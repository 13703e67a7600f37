"""Keyed pseudo-random permutations of [0, N) for shuffling, and the LCG they replace.

Marin found a GSM8K leak hidden by an LCG shuffle ``p(x) = (a x + b) mod N``: an LCG maps
adjacent inputs to points a constant stride apart, so local structure survives. A Feistel
network is a bijection for any round function, so we get a keyed pseudo-random permutation:

- round the domain up to the power of two ``2^b >= N`` and split each value into halves
  of ``b // 2`` and ``b - b // 2`` bits;
- 5 rounds of ``L, R = R, L xor F(R, k_i)`` with ``F`` a keyed splitmix64 hash;
- cycle-walking: re-apply the permutation until the value falls inside [0, N). Because the
  domain is below ``2 N``, fewer than 2 applications are expected; it terminates because the
  cycle through any x < N returns to x.

Everything is vectorised over numpy arrays of indices.
"""

from __future__ import annotations

import numpy as np

from marin_assets.datakit.hashing import mix64

ROUNDS = 5
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def round_keys(key: int, rounds: int = ROUNDS) -> np.ndarray:
    """Per-round 64-bit keys derived from one integer key."""
    base = np.uint64(key & 0xFFFFFFFFFFFFFFFF)
    return mix64(base + _GOLDEN * np.arange(1, rounds + 1, dtype=np.uint64))


def _feistel(x: np.ndarray, bits: int, keys: np.ndarray, tweak: np.ndarray | int = 0) -> np.ndarray:
    """One pass of the Feistel network on ``bits``-bit values.

    The value splits into a left half of ``bits // 2`` and a right half of the remaining
    bits; each round ``L, R = R, L xor F(R, k_i)`` with ``F`` truncated to the width of
    ``L``, so for odd ``bits`` the two widths swap every round and each round stays
    invertible. ``tweak`` (scalar or per-element uint64) is folded into every round key,
    so one call can apply a different permutation to each element.
    """
    tweak = np.asarray(tweak, dtype=np.uint64)
    lw, rw = bits // 2, bits - bits // 2
    left = x >> np.uint64(rw)
    right = x & np.uint64((1 << rw) - 1)
    for k in keys:
        f = mix64(right ^ (k ^ tweak)) & np.uint64((1 << lw) - 1)
        left, right = right, left ^ f
        lw, rw = rw, lw
    return (left << np.uint64(rw)) | right


def _domain_bits(n: int) -> int:
    """Bits of the power-of-two domain >= n (at least 2, so both halves are non-empty)."""
    return max(2, int(n - 1).bit_length())


def _check_indices(indices: np.ndarray | int, n: int) -> np.ndarray:
    x = np.asarray(indices)
    if x.size and (not np.issubdtype(x.dtype, np.integer) or x.min() < 0 or x.max() >= n):
        raise ValueError(f"indices must be integers in [0, {n}); got range [{x.min()}, {x.max()}]")
    return x.astype(np.uint64)


class FeistelPermutation:
    """A keyed bijection of [0, n): ``permute(indices)`` is vectorised and deterministic."""

    def __init__(self, n: int, key: int, rounds: int = ROUNDS):
        if n < 1:
            raise ValueError(f"permutation domain must be >= 1, got {n}")
        if rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {rounds}")
        self.n = n
        self.key = key
        self.bits = _domain_bits(n)
        self.keys = round_keys(key, rounds)

    def permute(self, indices: np.ndarray | int) -> np.ndarray:
        x = _check_indices(indices, self.n)
        y = _cycle_walk(x.reshape(-1), self.n, self.bits, self.keys)
        return y.astype(np.int64).reshape(x.shape)

    def __call__(self, indices: np.ndarray | int) -> np.ndarray:
        return self.permute(indices)


def _cycle_walk(x: np.ndarray, n: int | np.ndarray, bits: int, keys: np.ndarray, tweak: np.ndarray | int = 0) -> np.ndarray:
    """Apply the Feistel pass, re-applying it to the elements that land outside [0, n)."""
    n = np.asarray(n, dtype=np.uint64)
    tweak = np.asarray(tweak, dtype=np.uint64)
    y = _feistel(x, bits, keys, tweak)
    out_of_range = y >= n
    while out_of_range.any():
        idx = np.flatnonzero(out_of_range)
        t = tweak if tweak.ndim == 0 else tweak[idx]
        y[idx] = _feistel(y[idx], bits, keys, t)
        out_of_range[idx] = y[idx] >= (n if n.ndim == 0 else n[idx])
    return y


class LcgPermutation:
    """``p(x) = (a x + b) mod n`` with ``gcd(a, n) = 1``: a bijection, but adjacent inputs
    land a constant stride apart. Kept only as the comparison case for tests."""

    def __init__(self, n: int, key: int):
        if n < 1:
            raise ValueError(f"permutation domain must be >= 1, got {n}")
        rng = np.random.default_rng(key)
        self.n = n
        self.b = int(rng.integers(0, n))
        a = int(rng.integers(1, max(2, n)))
        while np.gcd(a, n) != 1:
            a = a % n + 1
        self.a = a

    def permute(self, indices: np.ndarray | int) -> np.ndarray:
        x = np.asarray(indices, dtype=object)  # Python ints: a * x must not overflow
        return ((x * self.a + self.b) % self.n).astype(np.int64)

    def __call__(self, indices: np.ndarray | int) -> np.ndarray:
        return self.permute(indices)


class BlockShuffle:
    """Marin's default shuffle of ``n`` examples: permute blocks of ``block_size`` examples,
    then permute examples within windows of ``window_blocks`` blocks.

    ``self(i)`` is the source example that lands at output position ``i``; it is a bijection
    of [0, n). Only whole blocks take part in the block permutation (a trailing partial block
    stays last), and the last window may be shorter than the others.
    """

    def __init__(self, n: int, key: int, block_size: int = 256, window_blocks: int = 512):
        if n < 1:
            raise ValueError(f"shuffle size must be >= 1, got {n}")
        if block_size < 1 or window_blocks < 1:
            raise ValueError(f"block_size and window_blocks must be >= 1, got {block_size}, {window_blocks}")
        self.n = n
        self.block_size = block_size
        self.window = block_size * window_blocks
        self.full_blocks = n // block_size
        self.blocks = FeistelPermutation(max(1, self.full_blocks), key)
        self.window_keys = round_keys(key ^ 0x5EED5EED5EED5EED)

    def __call__(self, indices: np.ndarray | int) -> np.ndarray:
        shape = np.shape(indices)
        i = _check_indices(indices, self.n).reshape(-1)
        # Stage 2 (applied to output positions first): a permutation inside each window,
        # tweaked by the window number so every window is shuffled differently.
        w = i // np.uint64(self.window)
        start = w * np.uint64(self.window)
        length = np.minimum(np.uint64(self.window), np.uint64(self.n) - start)
        tweak = mix64(w + np.uint64(1))
        offset = np.empty_like(i)
        # Full windows share one domain size; a short last window gets its own so that
        # cycle-walking stays within 4x of its length.
        for part in (length == np.uint64(self.window), length != np.uint64(self.window)):
            if part.any():
                size = int(length[part][0])
                offset[part] = _cycle_walk(i[part] - start[part], size, _domain_bits(size), self.window_keys, tweak[part])
        j = start + offset
        # Stage 1: which source block sits at block position j // block_size.
        b = (j // np.uint64(self.block_size)).astype(np.int64)
        r = j % np.uint64(self.block_size)
        in_full = b < self.full_blocks
        src_block = b.copy()
        if in_full.any():
            src_block[in_full] = self.blocks.permute(b[in_full])
        out = src_block.astype(np.uint64) * np.uint64(self.block_size) + r
        return out.astype(np.int64).reshape(shape)


def shuffled_index(i: int | np.ndarray, n: int, key: int) -> np.ndarray | int:
    """Source index at output position ``i`` under the default block shuffle of ``n``."""
    out = BlockShuffle(n, key)(np.asarray(i))
    return int(out) if np.ndim(i) == 0 else out
