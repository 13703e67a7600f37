"""A seq_len change (a context phase) over the same caches: the data position is counted in tokens, so the
new phase reads exactly the stream's tokens after the old phase's last one (none skipped, none repeated)."""

import numpy as np
import pytest

from marin_assets.train.data.batches import DataPosition, MixedLoader
from marin_assets.train.data.token_caches import TokenCache


def _read(loader: MixedLoader, position: DataPosition, batches: int) -> tuple[np.ndarray, DataPosition]:
    rows = []
    for _ in range(batches):
        tokens, ok, position = loader.next_batch(position)
        assert ok
        rows.append(tokens.reshape(-1))
    return np.concatenate(rows), position


def _cache_offsets(loader: MixedLoader, name: str, block: int, tokens: int) -> np.ndarray:
    """Cache offset of each of the first ``tokens`` stream tokens of ``name`` (blocks in shuffled order)."""
    t = np.arange(tokens)
    return loader._block_starts(name, block, t // block) + t % block


@pytest.mark.parametrize("a_batches", [3, 4])  # 3: phase A ends mid-block of B's length
def test_longer_phase_reads_the_tokens_after_the_last_one(caches, a_batches):
    one = {"license": caches["license"]}
    a = MixedLoader(one, seq_len=32, batch_size=4, seed=5)
    seen_a, pos_a = _read(a, DataPosition(), a_batches)
    pos_a = DataPosition.from_json(pos_a.to_json())  # the checkpoint's round trip
    b = MixedLoader(one, seq_len=64, batch_size=2, seed=5)  # same tokens per batch
    seen_b, pos_b = _read(b, pos_a, 4)
    stream, _ = _read(a, DataPosition(), a_batches + 4)  # phase A's order, had it gone on
    assert np.array_equal(np.concatenate([seen_a, seen_b]), stream)
    flat = TokenCache(caches["license"]).read([0], TokenCache(caches["license"]).num_tokens)[0]
    offsets = _cache_offsets(a, "license", 32, stream.size)
    assert np.array_equal(stream, flat[offsets]) and np.unique(offsets).size == offsets.size  # no token twice
    assert pos_b.tokens(64) == {"license": stream.size} and pos_b.block_tokens == 32
    assert b.tokens_left(pos_b)["license"] == a.tokens_left(DataPosition())["license"] - stream.size


def test_shorter_phase_and_resume_keep_the_token_count(caches):
    one = {"docs": caches["docs"]}
    a = MixedLoader(one, seq_len=64, batch_size=2)
    seen_a, pos = _read(a, DataPosition(), 3)
    b = MixedLoader(one, seq_len=48, batch_size=3)  # 48 divides no block: pieces cross block ends
    seen_b, pos = _read(b, pos, 2)
    seen_c, pos = _read(a, DataPosition.from_json(pos.to_json()), 1)  # back to 64 after a resume
    stream, _ = _read(a, DataPosition(), 7)  # 896 tokens in phase A's order, had it gone on
    assert np.array_equal(np.concatenate([seen_a, seen_b, seen_c]), stream[: 384 + 288 + 128])
    assert pos.unit_tokens == 16 and pos.tokens(64) == {"docs": 384 + 288 + 128}


def test_block_set_up_front_keeps_every_longer_window_contiguous(caches):
    one = {"license": caches["license"]}
    flat = TokenCache(caches["license"]).read([0], TokenCache(caches["license"]).num_tokens)[0]
    a = MixedLoader(one, seq_len=32, batch_size=4, block_tokens=128)
    seen_a, pos = _read(a, DataPosition(), 2)  # 256 tokens: two whole blocks
    b = MixedLoader(one, seq_len=128, batch_size=1)
    windows, _ = _read(b, pos, 3)
    starts = a._block_starts("license", 128, np.arange(5))
    assert np.array_equal(seen_a, np.concatenate([flat[s : s + 128] for s in starts[:2]]))
    for row, start in zip(windows.reshape(3, 128), starts[2:], strict=True):
        assert np.array_equal(row, flat[start : start + 128])  # the next block of the cache, whole and in order


def test_legacy_position_reads_as_windows_of_its_seq_len(caches):
    """A checkpoint written before context phases (no unit, no block) resumes where it was."""
    one = {"license": caches["license"]}
    loader = MixedLoader(one, seq_len=32, batch_size=4)
    _, pos = _read(loader, DataPosition(), 2)
    legacy = DataPosition.from_json({"batches": pos.batches, "consumed": dict(pos.consumed)})
    assert np.array_equal(loader.next_batch(legacy)[0], loader.next_batch(pos)[0])
    assert dict(pos.consumed) == {"license": 8} and pos.unit_tokens == 32 and pos.block_tokens == 32


def test_changing_the_block_mid_run_is_refused(caches):
    one = {"license": caches["license"]}
    _, pos = _read(MixedLoader(one, seq_len=32, batch_size=4), DataPosition(), 1)
    with pytest.raises(ValueError, match="shuffle blocks of 32 tokens, the loader asks for 64"):
        MixedLoader(one, seq_len=32, batch_size=4, block_tokens=64).next_batch(pos)
    with pytest.raises(ValueError, match="unit_tokens must be a positive int"):
        DataPosition(0, (), unit_tokens=0)


def test_a_legacy_checkpoint_warm_started_into_a_longer_phase_counts_in_its_own_windows(caches):
    """A checkpoint from before context phases counts windows of the seq_len its config records; a
    warm start into a phase at twice that length must not read them as windows of the new length."""
    from marin_assets.train.restore import checkpoint_position

    one = {"license": caches["license"]}
    _, pos = _read(MixedLoader(one, seq_len=32, batch_size=4), DataPosition(), 2)
    meta = {"data_position": {"batches": pos.batches, "consumed": dict(pos.consumed)}, "config": {"seq_len": 32}}
    legacy = checkpoint_position(meta)
    assert legacy == pos and legacy.tokens(64) == {"license": 8 * 32}
    longer = MixedLoader(one, seq_len=64, batch_size=2)
    assert np.array_equal(longer.next_batch(legacy)[0], longer.next_batch(pos)[0])


def test_the_train_config_sets_the_runs_shuffle_block(caches):
    from marin_assets.train.config import config_from_dict
    from marin_assets.train.data.sources import open_sources, train_loader
    from tests.support.configs import TINY_TRAIN

    config = config_from_dict({**TINY_TRAIN, "data_block_tokens": 128})
    loader = train_loader(config, open_sources({"license": caches["license"]}))
    _, pos = _read(loader, DataPosition(), 1)
    assert pos.block_tokens == 128 and pos.unit_tokens == config.seq_len
    with pytest.raises(ValueError, match="data_block_tokens must be a positive int"):
        config_from_dict({**TINY_TRAIN, "data_block_tokens": 0})
