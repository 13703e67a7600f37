"""A Bloom filter over 64-bit hashes: a numpy bit array, vectorised insert/query, bit-OR merge.

Sizing for ``capacity`` items at false-positive rate ``p``: ``m = -capacity ln p / (ln 2)^2``
bits and ``k = round(m / capacity * ln 2)`` probes (for p = 1e-9: ~43 bits per item, 30
probes). Probe positions use double hashing, ``h1 + i * h2 mod m``, with ``h1, h2`` two
splitmix64 mixes of the item hash. Two filters with the same ``m`` and ``k`` merge by OR.
"""

from __future__ import annotations

import math

import numpy as np

from marin_assets.datakit.hashing import mix64
from marin_assets.numeric_checks import check_float


def bloom_size(capacity: int, false_positive_rate: float) -> tuple[int, int]:
    """(bits, probes) for ``capacity`` items at ``false_positive_rate``."""
    if capacity < 1:
        capacity = 1
    check_float("false_positive_rate", false_positive_rate, 0.0, 1.0, lo_open=True, hi_open=True)
    bits = math.ceil(-capacity * math.log(false_positive_rate) / math.log(2) ** 2)
    bits = max(64, (bits + 63) // 64 * 64)
    probes = max(1, round(bits / capacity * math.log(2)))
    return bits, probes


class BloomFilter:
    def __init__(self, num_bits: int, num_probes: int, bits: np.ndarray | None = None):
        if num_bits < 8 or num_bits % 8:
            raise ValueError(f"num_bits must be a positive multiple of 8, got {num_bits}")
        if num_probes < 1:
            raise ValueError(f"num_probes must be >= 1, got {num_probes}")
        self.num_bits = num_bits
        self.num_probes = num_probes
        if bits is None:
            bits = np.zeros(num_bits // 8, dtype=np.uint8)
        if bits.dtype != np.uint8 or bits.shape != (num_bits // 8,):
            raise ValueError(f"bit array must be uint8 of shape ({num_bits // 8},), got {bits.dtype} {bits.shape}")
        self.bits = bits

    @classmethod
    def for_capacity(cls, capacity: int, false_positive_rate: float) -> BloomFilter:
        return cls(*bloom_size(capacity, false_positive_rate))

    def _positions(self, hashes: np.ndarray) -> np.ndarray:
        """(items, probes) bit positions, chunk-free: callers pass bounded batches."""
        h = np.asarray(hashes, dtype=np.uint64)
        h1 = mix64(h ^ np.uint64(0x243F6A8885A308D3))
        h2 = mix64(h ^ np.uint64(0x13198A2E03707344)) | np.uint64(1)
        i = np.arange(self.num_probes, dtype=np.uint64)
        return (h1[:, None] + i[None, :] * h2[:, None]) % np.uint64(self.num_bits)

    def add(self, hashes: np.ndarray, batch: int = 1 << 16) -> None:
        """Set the bits of ``hashes``: on a one-byte-per-bit view (bit j of byte i is flag
        8i+j, as in ``contains``), where a plain scatter replaces the slow ``bitwise_or.at``."""
        hashes = np.asarray(hashes, dtype=np.uint64)
        if hashes.size == 0:
            return
        flags = np.unpackbits(self.bits, bitorder="little")
        for s in range(0, hashes.size, batch):
            flags[self._positions(hashes[s : s + batch]).ravel().astype(np.int64)] = 1
        self.bits = np.packbits(flags, bitorder="little")

    def contains(self, hashes: np.ndarray, batch: int = 1 << 16) -> np.ndarray:
        hashes = np.asarray(hashes, dtype=np.uint64)
        out = np.zeros(hashes.size, dtype=bool)
        for s in range(0, hashes.size, batch):
            pos = self._positions(hashes[s : s + batch])
            byte = self.bits[(pos >> np.uint64(3)).astype(np.int64)]
            bit = (byte >> (pos & np.uint64(7)).astype(np.uint8)) & np.uint8(1)
            out[s : s + batch] = bit.all(axis=1)
        return out

    def union(self, other: BloomFilter) -> BloomFilter:
        if (self.num_bits, self.num_probes) != (other.num_bits, other.num_probes):
            raise ValueError(
                "cannot merge Bloom filters of different shapes: "
                f"({self.num_bits} bits, {self.num_probes} probes) vs ({other.num_bits}, {other.num_probes})"
            )
        return BloomFilter(self.num_bits, self.num_probes, self.bits | other.bits)

    def fill_ratio(self) -> float:
        return float(np.unpackbits(self.bits).mean())
