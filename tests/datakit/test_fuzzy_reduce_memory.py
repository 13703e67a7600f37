"""Acceptance (issue 12, memory): the fuzzy band reduce's peak heap does not grow with the
number of shards.

A band partition of shards/fuzzy_candidates cuts its band into band_reduce_ranges(docs,
docs_per_reduce) key ranges and reduces them one at a time, so each range holds about
docs_per_reduce keys however many shards there are. Measured with peak_heap_bytes (numpy
via tracemalloc + the Arrow pool: what the reduce allocates, not the import floor of RSS)
at two shard counts. The unsliced reduce (one range) over the same maps is the control: it
must grow with the shard count, or the measurement could not tell the two apart.
"""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from marin_assets.datakit.fuzzy_dedup import FuzzyDedupConfig, band_reduce_ranges, fuzzy_band_reduce, fuzzy_map
from marin_assets.datakit.memory import peak_heap_bytes
from marin_assets.datakit.normalize import doc_id
from marin_assets.datakit.shards import write_table

DOCS_PER_SHARD = 150
DOCS_PER_REDUCE = 1200  # 8 shards: one range; 32 shards: four
SIZES = (8, 32)
# The stated bound of one range: ~80 bytes per key measured (94-103 KB at 1,200 keys), 2x that.
BOUND_BYTES = 160 * DOCS_PER_REDUCE
MAX_GROWTH = 1.5  # 4x the shards may cost at most this factor
CONFIG = FuzzyDedupConfig()


@pytest.fixture(scope="module")
def maps(tmp_path_factory) -> dict[int, list[str]]:
    """{shard count: fuzzy_map roots}: the larger set extends the smaller one (same first shards)."""
    root = tmp_path_factory.mktemp("fuzzy_memory")
    rng = random.Random(3)
    vocab = [f"w{i}" for i in range(5000)]
    roots = []
    for s in range(max(SIZES)):
        texts = [" ".join(rng.choice(vocab) for _ in range(12)) for _ in range(DOCS_PER_SHARD)]
        texts[:3] = texts[3:6] if s % 2 else texts[:3]  # a few duplicates, so there are pairs
        path = str(root / "in" / f"s{s:04d}.parquet")
        write_table(pa.table({"id": [doc_id(t) for t in texts], "text": texts}), path)
        roots.append(str(root / "map" / f"s-{s:05d}"))
        fuzzy_map(f"s-{s:05d}", path, roots[-1], CONFIG)
    return {n: roots[:n] for n in SIZES}


def _sliced_peak(roots: list[str], out: str) -> tuple[int, int, int]:
    """(worst range's peak heap, its keys, ranges) of band 0 cut as a band partition cuts it."""
    ranges = band_reduce_ranges(len(roots) * DOCS_PER_SHARD, DOCS_PER_REDUCE)
    worst = (0, 0)
    for r in range(ranges):
        counts, peak = peak_heap_bytes(lambda: fuzzy_band_reduce(0, (r, ranges), roots, out, CONFIG))
        worst = max(worst, (peak, counts["keys"]))
    return (*worst, ranges)


def test_band_reduce_peak_heap_stays_under_a_bound_that_does_not_grow_with_shards(maps, tmp_path):
    sliced = {n: _sliced_peak(roots, str(tmp_path / f"sliced-{n}")) for n, roots in maps.items()}
    unsliced = {
        n: peak_heap_bytes(lambda: fuzzy_band_reduce(0, (0, 1), roots, str(tmp_path / f"one-{n}"), CONFIG))[1]
        for n, roots in maps.items()
    }
    small, large = SIZES
    print({"sliced": sliced, "unsliced": unsliced})  # the measured figures, for the report (-s)
    assert [sliced[n][2] for n in SIZES] == [1, 4]
    # every range holds about DOCS_PER_REDUCE keys at both sizes (the slices are even)
    for n in SIZES:
        assert 0.6 * DOCS_PER_REDUCE <= sliced[n][1] <= 1.5 * DOCS_PER_REDUCE, (n, sliced[n])
    for n in SIZES:
        assert 0 < sliced[n][0] < BOUND_BYTES, (n, sliced[n])
    assert sliced[large][0] <= MAX_GROWTH * sliced[small][0], sliced
    # the control: one range over 4x the shards holds 4x the keys, and the heap shows it
    assert unsliced[large] >= 2.5 * unsliced[small], unsliced
    assert unsliced[large] > 2 * sliced[large][0], (unsliced, sliced)
