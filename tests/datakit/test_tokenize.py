import json

import numpy as np
import pytest

from marin_assets.datakit.normalize import NormalizeConfig, normalize
from marin_assets.datakit.shards import list_shards, read_table
from marin_assets.datakit.tokenize import (
    EOS,
    TokenizeConfig,
    TokenizerTrainConfig,
    is_validation,
    load_tokenizer,
    open_cache,
    tokenize,
    train_tokenizer,
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    import random

    tmp = tmp_path_factory.mktemp("tok")
    rng = random.Random(0)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 60))) + f" #{i}" for i in range(120)]
    (tmp / "in.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    normalize(str(tmp / "in.jsonl"), str(tmp / "norm"), NormalizeConfig(source="t", shard_docs=50))
    shards = list_shards(str(tmp / "norm"))
    train_tokenizer(shards, str(tmp / "tokenizer"), TokenizerTrainConfig(vocab_size=300, min_frequency=1))
    return tmp, shards


def test_trained_tokenizer_roundtrips_text(corpus):
    tmp, _ = corpus
    tok = load_tokenizer(str(tmp / "tokenizer"))
    assert tok.get_vocab_size() == 300 and tok.token_to_id(EOS) is not None
    text = "gamma delta — ünïcode stays byte-level"
    assert tok.decode(tok.encode(text).ids) == text


def test_levanter_reader_opens_cache_with_exact_tokens(corpus):
    tmp, shards = corpus
    out = tmp / "cache"
    stats = tokenize(shards, str(tmp / "tokenizer" / "tokenizer.json"), str(out), TokenizeConfig(validation_fraction=0.25))
    tok = load_tokenizer(str(tmp / "tokenizer" / "tokenizer.json"))
    eos = tok.token_to_id(EOS)
    expected = {"train": [], "validation": []}
    for shard in shards:
        for row in read_table(shard).to_pylist():
            split = "validation" if is_validation(row["id"], 0.25) else "train"
            expected[split].append(tok.encode(row["text"], add_special_tokens=False).ids + [eos])
    assert 0 < len(expected["validation"]) < len(expected["train"])
    for split in ("train", "validation"):
        cache = open_cache(str(out / split))  # Levanter's own TreeCache.load
        assert len(cache) == len(expected[split]) == stats[split]["documents"]
        rows = cache.get_batch_sync(list(range(len(cache))))
        assert [r["input_ids"].tolist() for r in rows] == expected[split]
        assert rows[0]["input_ids"].dtype == np.int32
        assert stats[split]["tokens"] == sum(len(e) for e in expected[split])
        assert stats[split]["bytes_per_token"] == pytest.approx(stats[split]["bytes"] / stats[split]["tokens"])
    on_disk = json.loads((out / "stats.json").read_text())
    assert on_disk["train"]["tokens"] == stats["train"]["tokens"]


def test_split_is_a_function_of_the_id():
    ids = [f"{i:08x}" + "0" * 24 for i in range(0, 2**32, 2**22)]
    flags = [is_validation(i, 0.1) for i in ids]
    assert flags == [is_validation(i, 0.1) for i in ids]
    assert 0.05 < sum(flags) / len(flags) < 0.15
    assert not any(is_validation(i, 0.0) for i in ids)


def test_configs_validate():
    with pytest.raises(ValueError, match="vocab_size"):
        TokenizerTrainConfig(vocab_size=10)
    with pytest.raises(ValueError, match="validation_fraction"):
        TokenizeConfig(validation_fraction=1.0)


def test_rerun_replaces_the_cache_and_a_failed_run_leaves_no_finished_ledger(corpus):
    tmp, shards = corpus
    tok_path = str(tmp / "tokenizer" / "tokenizer.json")
    out = tmp / "cache_rerun"
    tokenize(shards, tok_path, str(out), TokenizeConfig(validation_fraction=0.25))
    smaller = tokenize(shards[:1], tok_path, str(out), TokenizeConfig(validation_fraction=0.25))
    assert len(open_cache(str(out / "train"))) == smaller["train"]["documents"] < 100  # not appended to run 1

    def fail_after_first_batch(done):
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        tokenize(shards, tok_path, str(out), TokenizeConfig(batch_docs=10), progress=fail_after_first_batch)
    # Neither split claims to be finished, and the old stats.json is gone with the old cache.
    assert not (out / "train" / "shard_ledger.json").exists()
    assert not (out / "validation" / "shard_ledger.json").exists()
    assert not (out / "stats.json").exists()
