"""Data mixtures as weight schedules, and a deterministic block sampler.

Marin's mixtures are schedules: a list of ``(step, {source: weight})`` stages, each in force
from its step until the next. Sampling happens in blocks of 2048 examples: a block's source
counts follow the weights in force at the block's first example (largest-remainder rounding,
so each block is within one example per source of the exact proportions), the sources are
interleaved inside the block by a keyed Feistel permutation, and each source is read in a
Feistel-shuffled order that is reshuffled with a new key every epoch.

Every block can be computed on its own (``sampler.block(t)``): how many examples each source
used before block ``t`` is arithmetic over the schedule, so resuming at any block needs no
replay.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import xxhash

from marin_assets.datakit.feistel import FeistelPermutation


class MixtureSchedule:
    """Validated, normalised ``[(step, {source: weight})]`` stages."""

    def __init__(self, stages: Sequence[tuple[int, Mapping[str, float]]]):
        if not stages:
            raise ValueError("a mixture schedule needs at least one (step, weights) stage")
        steps = [s for s, _ in stages]
        if steps[0] != 0:
            raise ValueError(f"the first stage must start at step 0, got {steps[0]}")
        for prev, cur in zip(steps, steps[1:]):
            if cur <= prev:
                raise ValueError(f"stage steps must be strictly ascending, got {prev} then {cur}")
        self.sources = sorted({name for _, weights in stages for name in weights})
        self.steps = [int(s) for s in steps]
        self.stages: list[dict[str, float]] = []
        for step, weights in stages:
            if isinstance(step, bool) or int(step) != step or step < 0:
                raise ValueError(f"stage step must be a non-negative integer, got {step!r}")
            for name, w in weights.items():
                if not (isinstance(w, (int, float)) and math.isfinite(w) and w >= 0):
                    raise ValueError(f"stage at step {step}: weight of {name!r} must be finite and >= 0, got {w!r}")
            total = float(sum(weights.values()))
            if total <= 0:
                raise ValueError(f"stage at step {step}: weights sum to zero")
            self.stages.append({name: weights.get(name, 0.0) / total for name in self.sources})

    @classmethod
    def constant(cls, weights: Mapping[str, float]) -> "MixtureSchedule":
        return cls([(0, weights)])

    def stage_index(self, step: int) -> int:
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        return int(np.searchsorted(self.steps, step, side="right")) - 1

    def weights_at(self, step: int) -> dict[str, float]:
        """Normalised weights in force at ``step`` (every source, zeros included)."""
        return dict(self.stages[self.stage_index(step)])

    def to_json(self) -> list:
        return [[step, weights] for step, weights in zip(self.steps, self.stages)]


def _largest_remainder(weights: Sequence[float], total: int) -> np.ndarray:
    """Integer counts summing to ``total``, each within 1 of ``weight * total``; ties go to
    the earlier source so the result is deterministic."""
    quotas = np.asarray(weights, dtype=np.float64) * total
    counts = np.floor(quotas).astype(np.int64)
    short = total - int(counts.sum())
    if short > 0:
        order = np.lexsort((np.arange(len(quotas)), -(quotas - counts)))
        counts[order[:short]] += 1
    return counts


def _key(*parts: object) -> int:
    return xxhash.xxh3_64_intdigest("/".join(str(p) for p in parts).encode())


@dataclass
class MixtureSampler:
    """Deterministic ``(source, document index)`` stream for a schedule.

    ``examples_per_step`` converts example positions to training steps (the batch size);
    a block switches weights at the first block whose first example is at or past a stage's
    step.
    """

    schedule: MixtureSchedule
    doc_counts: Mapping[str, int]
    seed: int
    block_size: int = 2048
    examples_per_step: int = 1
    _counts: np.ndarray = field(init=False, repr=False)
    _first_block: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.examples_per_step < 1:
            raise ValueError(f"block_size and examples_per_step must be >= 1, got {self.block_size}, {self.examples_per_step}")
        for name in self.schedule.sources:
            used = any(stage[name] > 0 for stage in self.schedule.stages)
            n = self.doc_counts.get(name, 0)
            if used and (not isinstance(n, (int, np.integer)) or n < 1):
                raise ValueError(f"source {name!r} has positive weight but {n!r} documents")
        self._counts = np.array(
            [_largest_remainder([stage[s] for s in self.schedule.sources], self.block_size) for stage in self.schedule.stages]
        )
        self._first_block = np.array(
            [-(-step * self.examples_per_step // self.block_size) for step in self.schedule.steps], dtype=np.int64
        )

    def _stage_of_block(self, block: int) -> int:
        return int(np.searchsorted(self._first_block, block, side="right")) - 1

    def block_counts(self, block: int) -> dict[str, int]:
        """Examples each source contributes to ``block``."""
        counts = self._counts[self._stage_of_block(block)]
        return {s: int(c) for s, c in zip(self.schedule.sources, counts)}

    def _consumed_before(self, block: int) -> np.ndarray:
        """Examples each source used in blocks [0, block)."""
        ends = np.append(self._first_block[1:], np.iinfo(np.int64).max)
        blocks_in_stage = np.clip(np.minimum(ends, block) - self._first_block, 0, None)
        return (blocks_in_stage[:, None] * self._counts).sum(axis=0)

    def _source_indices(self, name: str, start: int, count: int) -> np.ndarray:
        """Document indices of draws ``start .. start+count-1`` from source ``name``."""
        n = int(self.doc_counts[name])
        draws = np.arange(start, start + count, dtype=np.int64)
        epochs = draws // n
        out = np.empty(count, dtype=np.int64)
        for epoch in np.unique(epochs):
            sel = epochs == epoch
            perm = FeistelPermutation(n, _key(self.seed, name, int(epoch)))
            out[sel] = perm.permute(draws[sel] - epoch * n)
        return out

    def block_arrays(self, block: int) -> tuple[np.ndarray, np.ndarray]:
        """(source number into ``schedule.sources``, document index), each (block_size,)."""
        if block < 0:
            raise ValueError(f"block must be >= 0, got {block}")
        counts = self._counts[self._stage_of_block(block)]
        consumed = self._consumed_before(block)
        sources = np.repeat(np.arange(len(counts)), counts)
        indices = np.concatenate(
            [
                self._source_indices(name, int(consumed[k]), int(counts[k]))
                for k, name in enumerate(self.schedule.sources)
                if counts[k]
            ]
        )
        order = FeistelPermutation(self.block_size, _key(self.seed, "block", block)).permute(np.arange(self.block_size))
        return sources[order], indices[order]

    def block(self, block: int) -> list[tuple[str, int]]:
        sources, indices = self.block_arrays(block)
        names = self.schedule.sources
        return [(names[s], int(i)) for s, i in zip(sources, indices)]

    def __iter__(self) -> Iterator[tuple[str, int]]:
        t = 0
        while True:
            yield from self.block(t)
            t += 1

    def sample(self, num_examples: int, start_block: int = 0) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        t = start_block
        while len(out) < num_examples:
            out.extend(self.block(t))
            t += 1
        return out[:num_examples]
