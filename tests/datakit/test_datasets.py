"""marin_assets/datakit/datasets.py: the dataset index (relative paths that survive a move),
its checks, combining datasets, and the held-out texts bits-per-byte reads."""

from __future__ import annotations

import functools
import json
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marin_assets.datakit.datasets import (
    Dataset,
    ShardCache,
    combine,
    dataset_from_json,
    held_out_texts,
    read_dataset,
    relative,
    resolve,
    write_dataset,
)
from tests.support.byte_tokens import EOS, VOCAB_SIZE, byte_ids
from tests.support.datasets import write_shard

TOKENIZER = {"sha256": "bytes-test", "vocab_size": VOCAB_SIZE, "eos_id": EOS}
SEGMENT = st.text("abcxyz-_.0", min_size=1, max_size=6).filter(lambda s: s not in (".", ".."))


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["", "gs://bucket", "memory://m"]),
    st.lists(SEGMENT, min_size=1, max_size=4),
    st.lists(SEGMENT, min_size=1, max_size=4),
)
def test_relative_then_resolve_gives_the_target_back(root, base, target):
    base_dir, path = root + "/" + "/".join(base), root + "/" + "/".join(target)
    assert resolve(relative(path, base_dir), base_dir) == path


def test_a_target_on_another_bucket_stays_absolute():
    assert relative("gs://other/x/y", "gs://bucket/a") == "gs://other/x/y"
    assert relative("/local/x", "gs://bucket/a") == "/local/x"


def test_an_index_moved_with_its_caches_still_reads(tmp_path):
    store = tmp_path / "store"
    shards = tuple(write_shard(str(store / "tokenized"), f"s-{i}", [f"train {i}"], [f"held {i} " * 3]) for i in range(2))
    write_dataset(Dataset("src", shards, TOKENIZER), str(store / "datasets" / "src"))
    shutil.move(str(store), str(tmp_path / "moved"))
    moved = read_dataset(str(tmp_path / "moved" / "datasets" / "src"))
    assert [s.path for s in moved.shards] == [str(tmp_path / "moved" / "tokenized" / f"s-{i}") for i in range(2)]
    assert moved.train_tokens == sum(s.train_tokens for s in shards) > 0
    assert held_out_texts(moved, 5) == ["held 0 " * 3, "held 1 " * 3]


def test_held_out_texts_stop_at_the_limit_and_cut_each_text(tmp_path):
    shards = (write_shard(str(tmp_path), "a", ["t"], ["b-doc", "a-doc"]), write_shard(str(tmp_path), "b", ["t"], ["c-doc"]))
    dataset = Dataset("src", shards, TOKENIZER)
    ids_order = held_out_texts(dataset, 10)  # a shard's texts in id order, shards in index order
    assert ids_order[2] == "c-doc" and sorted(ids_order[:2]) == ["a-doc", "b-doc"]
    assert held_out_texts(dataset, 2) == ids_order[:2]
    assert held_out_texts(dataset, 10, max_chars=3) == [t[:3] for t in ids_order]


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda d: d.pop("shards"), "not a dataset index"),
        (lambda d: d["shards"][0].pop("path"), r"shards\[0\] needs a 'key' and a 'path'"),
        (lambda d: d["shards"][0].update(train_tokens=-1), r"shards\[0\]\.train_tokens must be a non-negative integer"),
        (lambda d: d["shards"][0].update(train_docs=True), r"shards\[0\]\.train_docs must be a non-negative integer"),
    ],
)
def test_a_damaged_index_names_the_file_and_field(mutate, message):
    data = {
        "name": "src",
        "tokenizer": TOKENIZER,
        "shards": [{"key": "k", "path": "p", "train_tokens": 1, "validation_tokens": 0, "train_docs": 1, "validation_docs": 0}],
    }
    mutate(data)
    with pytest.raises(ValueError, match=f"/x/dataset.json: .*{message}" if "shards" in message else message):
        dataset_from_json(data, "/x", "/x/dataset.json")


def test_read_dataset_names_a_missing_or_broken_index(tmp_path):
    with pytest.raises(FileNotFoundError, match="no dataset.json"):
        read_dataset(str(tmp_path))
    (tmp_path / "dataset.json").write_text("{broken")
    with pytest.raises(ValueError, match="dataset.json: not valid JSON"):
        read_dataset(str(tmp_path))


def test_combine_refuses_two_tokenizers_and_keeps_shard_order():
    shard = lambda key: ShardCache(key, "v", f"/c/{key}", 10, 0, 1, 0)  # noqa: E731
    a, b = Dataset("a", (shard("a1"), shard("a2")), TOKENIZER), Dataset("b", (shard("b1"),), TOKENIZER)
    assert [s.key for s in combine("ab", [a, b]).shards] == ["a1", "a2", "b1"]
    other = Dataset("c", (shard("c1"),), {**TOKENIZER, "sha256": "another"})
    with pytest.raises(ValueError, match="different tokenizers"):
        combine("ac", [a, other])
    assert json.loads(json.dumps(combine("ab", [a, b]).to_json("/c")))["train_tokens"] == 30


@functools.cache
def _bytes_encoder():
    from marin_assets.datakit.tokenize import load_encoder

    return load_encoder("bytes")


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=40) | st.just("a <|endoftext|> inside"))
def test_the_test_caches_ids_are_the_byte_tokenizers(text):
    """tests/support/byte_tokens.py (what every test cache holds) is the DataKit's `bytes`
    tokenizer: its ids for a document, then the EOS tokenize appends; its vocabulary."""
    encoder = _bytes_encoder()
    assert (encoder.vocab_size, encoder.eos_id) == (VOCAB_SIZE, EOS)
    assert byte_ids(text) == [*encoder.encode(text), encoder.eos_id]


def test_a_relative_out_dir_still_gets_relative_paths(tmp_path, monkeypatch):
    # `marin datakit run --prefix P` (relative): before, every shard path in P/cache/dataset.json was absolute.
    monkeypatch.chdir(tmp_path)
    shard = write_shard(str(tmp_path / "store" / "tokenized"), "s-0", ["train 0"], ["held 0"])
    assert relative(shard.path, "P/cache") == "../../store/tokenized/s-0"
    write_dataset(Dataset("src", (shard,), TOKENIZER), "P/cache")
    written = json.loads((tmp_path / "P" / "cache" / "dataset.json").read_text())["shards"][0]
    assert (written["path"], written["documents"]) == ("../../store/tokenized/s-0", "../../store/tokenized/s-0/documents.parquet")
    assert read_dataset(str(tmp_path / "P" / "cache")).shards[0].path == shard.path
