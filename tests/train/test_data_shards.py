"""A dataset of many shard caches reads as the concatenation of its shards: the trainer's
batches from the shard caches equal those from one cache holding the same tokens, window for
window, and both equal the flat token stream (windows crossing shard boundaries, an empty
shard, a second epoch and a process's share of the rows included)."""

import json

import numpy as np
import pytest

from marin_assets.datakit.datasets import Dataset, ShardCache, write_dataset
from marin_assets.datakit.levanter_cache import CacheWriter
from marin_assets.train.data.batches import DataPosition, MixedLoader
from marin_assets.train.data.token_caches import open_source

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
                rows = ends[b : min(b + 7, hi)]
                start = int(ends[b - 1]) if b else 0
                writer.write_rows(data[start : int(rows[-1])], rows - start)
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
    flat = np.stack([data[s : s + SEQ_LEN] for s in starts])
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


def _set_ledger_unfinished(shard):
    ledger = shard / "train" / "shard_ledger.json"
    ledger.write_text(ledger.read_text().replace('"is_finished": true', '"is_finished": false'))


def _claim_more_tokens(index):
    path = index / "dataset.json"
    data = json.loads(path.read_text())
    data["shards"][1]["train_tokens"] += 100
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    "damage,file,reason",
    [
        (lambda shard, index: (shard / "train/input_ids/data/c/0").unlink(), "train/input_ids/data/c/0", "missing"),
        (
            lambda shard, index: (shard / "train/input_ids/offsets/c/0").unlink(),
            "train/input_ids/offsets",
            "shard_ledger.json says",
        ),
        (lambda shard, index: _set_ledger_unfinished(shard), "train/shard_ledger.json", "does not say is_finished"),
        (lambda shard, index: _claim_more_tokens(index), "train/input_ids/offsets", "the index says"),
    ],
)
def test_a_damaged_shard_is_refused_on_its_first_read_naming_shard_file_and_reason(tmp_path, damage, file, reason):
    # Before: a deleted chunk read as zeros (the zarr fill value; 0 is a token id), and so did a shard the
    # index claims more tokens of; an unfinished ledger went unnoticed once the shard was in an index.
    data, ends = _documents()
    index = _dataset(tmp_path, data, ends, [0, 30, len(ends)])
    damage(tmp_path / "shard-1", tmp_path / "index")
    stream = open_source(index).train  # opening stays lazy: nothing is checked or read yet
    assert np.array_equal(stream.read([0], 8)[0], data[:8])  # shard 0 is whole
    with pytest.raises(ValueError) as err:
        stream.read([int(ends[40])], 8)
    message = str(err.value)
    assert message.startswith("dataset shard k001: ") and file in message and reason in message
    assert "\n" not in message


def test_a_shard_in_the_store_is_checked_against_its_manifest(tmp_path):
    from marin_assets.store import ArtifactStore, compute_version

    data, ends = _documents()
    store = ArtifactStore(str(tmp_path / "store"))

    def compute(out_dir):
        with CacheWriter(f"{out_dir}/train") as writer:
            writer.write_rows(data, ends)
        return {}

    ref = store.materialize("shards/tokenized", "s0", compute_version("shards/tokenized", "1", {}), compute, {}).ref
    write_dataset(
        Dataset("t", (ShardCache("s0", ref.version, ref.data_path, data.size, 0, len(ends), 0),), {}), str(tmp_path / "index")
    )
    assert np.array_equal(open_source(str(tmp_path / "index")).train.read([5], 4)[0], data[5:9])
    meta = tmp_path / "store" / "shards/tokenized/s0" / ref.version[:16] / "data/train/input_ids/data/zarr.json"
    meta.write_text(meta.read_text().replace('"clevel":5', '"clevel":4'))  # same size, other bytes
    with pytest.raises(ValueError, match=r"^dataset shard s0: .*/data/train/input_ids/data/zarr.json: its sha256 differs"):
        open_source(str(tmp_path / "index")).train.read([5], 4)
