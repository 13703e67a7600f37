import numpy as np
import pytest

from marin_assets.train.data.batches import DataPosition, MixedLoader
from marin_assets.train.data.token_caches import TokenCache
from tests.support.byte_tokens import VOCAB_SIZE, byte_ids, token_count
from tests.support.caches import stdlib_paragraphs


def test_reader_matches_levanter(caches):
    """The test caches (the DataKit's CacheWriter) read alike in Levanter's reader and ours:
    one row per document, its byte ids."""
    from levanter.store.jagged_array import JaggedArrayStore

    docs = stdlib_paragraphs()
    ours = TokenCache(caches["license"])
    theirs = JaggedArrayStore.open(str(caches["license"] / "input_ids"), mode="r", dtype=np.int32)
    assert len(theirs) == len(docs)
    assert [theirs[i].tolist() for i in (0, len(docs) - 1)] == [byte_ids(docs[0]), byte_ids(docs[-1])]
    assert ours.num_tokens == theirs.data_size == token_count(docs)
    flat = np.concatenate([theirs[i] for i in range(len(theirs))])
    assert np.array_equal(ours.read([0, 100], 50), np.stack([flat[:50], flat[100:150]]))


def test_one_epoch_visits_every_window_once_in_shuffled_order(caches):
    loader = MixedLoader({"license": caches["license"]}, seq_len=32, batch_size=4)
    n = loader.windows["license"]
    starts = loader._window_starts("license", np.arange(n))
    assert sorted(starts.tolist()) == [i * 32 for i in range(n)]
    assert starts.tolist() != sorted(starts.tolist())  # actually shuffled
    # the next epoch is a different order of the same windows
    again = loader._window_starts("license", np.arange(n, 2 * n))
    assert sorted(again.tolist()) == sorted(starts.tolist()) and again.tolist() != starts.tolist()


def test_batches_are_a_pure_function_of_position(caches):
    loader = MixedLoader(caches, seq_len=16, batch_size=8, seed=3, vocab_size=VOCAB_SIZE)
    pos = DataPosition()
    for _ in range(3):
        _, _, pos = loader.next_batch(pos)
    a, ok, after = loader.next_batch(pos)
    b, _, _ = loader.next_batch(DataPosition.from_json(pos.to_json()))
    assert ok and np.array_equal(a, b) and after.batches == 4
    assert sum(dict(after.consumed).values()) == 4 * 8


def test_mixture_weights_and_stages_respected(caches):
    mix = {"stages": [[0, {"license": 0.8, "docs": 0.2}], [50, {"docs": 1.0}]]}
    loader = MixedLoader(caches, seq_len=16, batch_size=10, mixture=mix)
    pos = DataPosition()
    for _ in range(50):
        _, _, pos = loader.next_batch(pos)
    share = pos.get("license") / 500
    assert 0.72 < share < 0.88
    before = pos.get("license")
    for _ in range(5):
        _, _, pos = loader.next_batch(pos)
    assert pos.get("license") == before  # stage 2 is docs only


def test_iterate_prefetch_equals_next_batch(caches):
    loader = MixedLoader(caches, seq_len=16, batch_size=4)
    it = loader.iterate(DataPosition(), prefetch=3)
    pos = DataPosition()
    for _ in range(4):
        got, _, got_pos = next(it)
        want, _, pos = loader.next_batch(pos)
        assert np.array_equal(got, want) and got_pos == pos
    it.close()


def test_out_of_vocab_batch_flagged(caches):
    loader = MixedLoader({"license": caches["license"]}, seq_len=16, batch_size=4, vocab_size=100)
    tokens, ok, _ = loader.next_batch(DataPosition())
    assert not ok and tokens.max() < 100  # ids >= 100 (lower-case letters) are out of this vocab


def test_bad_configs_fail_before_compute(caches, tmp_path):
    with pytest.raises(ValueError, match="fewer than one sequence"):
        MixedLoader({"license": caches["license"]}, seq_len=10**6, batch_size=2)
    with pytest.raises(ValueError, match="unknown sources"):
        MixedLoader({"license": caches["license"]}, seq_len=16, batch_size=2, mixture={"web": 1.0})
    with pytest.raises(FileNotFoundError, match="not a Levanter token cache"):
        MixedLoader({"x": tmp_path}, seq_len=16, batch_size=2)


def test_tokens_left_counts_down(caches):
    loader = MixedLoader({"license": caches["license"]}, seq_len=16, batch_size=4)
    start = loader.tokens_left(DataPosition())["license"]
    _, _, pos = loader.next_batch(DataPosition())
    assert loader.tokens_left(pos)["license"] == start - 4 * 16
