"""A dataset of many shard caches reads as the concatenation of its shards: the trainer's
batches from the shard caches equal those from one cache holding the same tokens, window for
window, and both equal the flat token stream (windows crossing shard boundaries, an empty
shard, a second epoch and a process's share of the rows included)."""

import numpy as np
import pytest

from marin_assets.datakit.datasets import Dataset, ShardCache, write_dataset
from marin_assets.datakit.tokenize import CacheWriter
from marin_assets.train.data import DataPosition, MixedLoader
from marin_assets.train.token_caches import open_source

SEQ_LEN, BATCH = 48, 6


def _documents(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(ids back to back, each document's end) of 90 documents of 5-120 tokens, each ending in EOS = 999."""
    rng = np.random.default_rng(seed)
    ends = np.cumsum(rng.integers(5, 121, size=90), dtype=np.int64)
    data = rng.integers(0, 999, size=int(ends[-1]), dtype=np.int32)
    data[ends - 1] = 999
    return data, ends


def _dataset(root, data: np.ndarray, ends: np.ndarray, cuts: list[int]) -> str:
    """A dataset index over shard caches holding documents [cuts[i], cuts[i + 1]) each, written
    with CacheWriter in batches of 7 rows; returns the index folder."""
    shards = []
    for s, (lo, hi) in enumerate(zip(cuts, cuts[1:], strict=False)):
        first, last = (int(ends[lo - 1]) if lo else 0), (int(ends[hi - 1]) if hi else 0)
        path = root / f"shard-{s}"
        with CacheWriter(str(path / "train")) as writer:
            for b in range(lo, hi, 7):
                rows = ends[b:min(b + 7, hi)]
                start = int(ends[b - 1]) if b else 0
                writer.write_rows(data[start:int(rows[-1])], rows - start)
        shards.append(ShardCache(f"k{s:03d}", "v", str(path), last - first, 0, hi - lo, 0))
    write_dataset(Dataset("t", tuple(shards), {"vocab_size": 1000}), str(root / "index"))
    return str(root / "index")


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    data, ends = _documents()
    root = tmp_path_factory.mktemp("shard_identity")
    one = _dataset(root / "one", data, ends, [0, len(ends)])
    # Uneven shards, one of them empty (a shard whose documents were all removed).
    many = _dataset(root / "many", data, ends, [0, 1, 9, 9, 30, 31, 55, 80, len(ends)])
    return data, open_source(one).train, open_source(many).train


def test_shard_caches_read_as_the_flat_token_stream(sources):
    data, one, many = sources
    assert len(many.caches) == 8 and many.num_tokens == one.num_tokens == data.size
    starts = np.arange(0, data.size - SEQ_LEN, 17)  # every shard boundary is crossed by some window
    flat = np.stack([data[s:s + SEQ_LEN] for s in starts])
    assert np.array_equal(many.read(starts, SEQ_LEN), flat)
    assert np.array_equal(one.read(starts, SEQ_LEN), flat)


def test_the_loader_gives_the_same_batches_from_shard_caches_and_one_cache(sources):
    _, one, many = sources
    loaders = [MixedLoader({"t": stream}, SEQ_LEN, BATCH, seed=5, vocab_size=1000) for stream in (one, many)]
    epoch = loaders[0].windows["t"]
    assert epoch == loaders[1].windows["t"]
    positions = [DataPosition(), DataPosition()]
    for _ in range(2 * epoch // BATCH + 2):  # past the first epoch: a new permutation
        (a, ok_a, positions[0]), (b, ok_b, positions[1]) = (loaders[i].next_batch(positions[i]) for i in (0, 1))
        assert ok_a and ok_b and np.array_equal(a, b)
    assert positions[0] == positions[1]
    rows = slice(2, 5)  # one process's share of the global batch
    assert np.array_equal(loaders[0].next_batch(positions[0], rows)[0], loaders[1].next_batch(positions[1], rows)[0])


def test_closing_the_batch_iterator_stops_and_joins_its_prefetch_thread(sources):
    """A prefetch thread left inside a tensorstore read when the process exits aborts it; the
    trainer closes the iterator at the end of a phase, which must leave no thread behind."""
    import contextlib
    import threading

    _, _, many = sources
    loader = MixedLoader({"t": many}, SEQ_LEN, BATCH, seed=5, vocab_size=1000)
    with contextlib.closing(loader.iterate(DataPosition(0, ()), prefetch=2)) as batches:
        for _ in range(3):
            next(batches)
        assert any(t.name == "marin-data-prefetch" for t in threading.enumerate())
    assert not any(t.name == "marin-data-prefetch" and t.is_alive() for t in threading.enumerate())
