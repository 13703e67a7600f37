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


def _split_ids(out, shards):
    """The ids of each split, recovered by matching cache rows to the shards' documents."""
    tok = load_tokenizer(str(out.parent / "tokenizer" / "tokenizer.json"))
    eos = tok.token_to_id(EOS)
    by_tokens = {tuple(tok.encode(r["text"], add_special_tokens=False).ids + [eos]): r["id"]
                 for s in shards for r in read_table(s).to_pylist()}  # fmt: skip
    ids = {}
    for split in ("train", "validation"):
        cache = open_cache(str(out / split))
        rows = cache.get_batch_sync(list(range(len(cache)))) if len(cache) else []  # Levanter: max() of []
        ids[split] = sorted(by_tokens[tuple(r["input_ids"].tolist())] for r in rows)
    return ids



@pytest.mark.parametrize("fraction, wanted, expected", [
    (1e-9, 1, "one smallest"),   # the slice picks none of 120: the smallest id is held out
    (1e-9, 3, "three smallest"),
    (0.0, 1, "none"),            # a fraction of 0 asks for no validation: none is forced
    (1e-9, 0, "none"),           # off by default: the pure hash split
    (0.25, 1, "hash slice"),     # the slice already picks some: nothing moves
])
def test_min_validation_docs_tops_up_a_small_split(corpus, fraction, wanted, expected):
    tmp, shards = corpus
    all_ids = sorted(r["id"] for s in shards for r in read_table(s).to_pylist())
    assert not any(is_validation(i, 1e-9) for i in all_ids)  # the premise of the 1e-9 cases
    out = tmp / f"cache_topup_{fraction}_{wanted}"
    stats = tokenize(shards, str(tmp / "tokenizer" / "tokenizer.json"), str(out),
                     TokenizeConfig(validation_fraction=fraction, min_validation_docs=wanted))
    ids = _split_ids(out, shards)
    want_validation = {
        "one smallest": all_ids[:1], "three smallest": all_ids[:3], "none": [],
        "hash slice": [i for i in all_ids if is_validation(i, 0.25)],
    }[expected]
    assert (len(want_validation) > 0) == (expected != "none")
    assert ids["validation"] == want_validation
    assert ids["train"] == sorted(set(all_ids) - set(want_validation))
    assert stats["validation"]["documents"] == len(want_validation)


@pytest.mark.parametrize("n_docs, wanted, split_docs", [(1, 1, (1, 0)), (3, 5, (1, 2)), (3, 2, (1, 2)), (4, 2, (2, 2))])
def test_min_validation_docs_never_empties_train(corpus, n_docs, wanted, split_docs):
    import pyarrow.parquet as pq

    tmp, shards = corpus
    few = tmp / f"few_{n_docs}.parquet"
    pq.write_table(pq.read_table(shards[0]).slice(0, n_docs), few)
    stats = tokenize([str(few)], str(tmp / "tokenizer" / "tokenizer.json"), str(tmp / f"cache_few_{n_docs}_{wanted}"),
                     TokenizeConfig(validation_fraction=1e-9, min_validation_docs=wanted))
    assert (stats["train"]["documents"], stats["validation"]["documents"]) == split_docs


def test_min_validation_docs_is_checked():
    with pytest.raises(ValueError, match="min_validation_docs"):
        TokenizeConfig(min_validation_docs=-1)


def test_cache_writer_writes_the_bytes_levanter_writes(tmp_path):
    """CacheWriter (no levanter import) and Levanter's SerialCacheWriter, same rows in the
    same batches: every file of the two caches is byte-identical."""
    from levanter.store.cache import SerialCacheWriter

    from marin_assets.datakit.tokenize import CacheWriter, exemplar

    rng = np.random.default_rng(0)
    batches = [[rng.integers(0, 300, size=int(n), dtype=np.int32) for n in rng.integers(1, 50, size=k)] for k in (7, 1, 30)]
    ours, theirs = CacheWriter(str(tmp_path / "ours")), SerialCacheWriter(str(tmp_path / "theirs"), exemplar())
    for batch in batches:
        ours.write_batch({"input_ids": batch})
        theirs.write_batch({"input_ids": batch})
    ours.__exit__(None, None, None)
    theirs.__exit__(None, None, None)
    files = sorted(p.relative_to(tmp_path / "theirs") for p in (tmp_path / "theirs").rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(tmp_path / "ours") for p in (tmp_path / "ours").rglob("*") if p.is_file())
    assert "shard_ledger.json" in map(str, files) and len(files) == 5
    for f in files:
        assert (tmp_path / "ours" / f).read_bytes() == (tmp_path / "theirs" / f).read_bytes(), f
    rows = open_cache(str(tmp_path / "ours")).get_batch_sync(list(range(38)))
    assert [r["input_ids"].tolist() for r in rows] == [a.tolist() for b in batches for a in b]


def test_tokenize_on_a_local_path_does_not_import_levanter(corpus):
    import subprocess
    import sys

    tmp, shards = corpus
    code = ("import sys; from marin_assets.datakit.tokenize import tokenize; "
            f"tokenize({[str(s) for s in shards]!r}, {str(tmp / 'tokenizer' / 'tokenizer.json')!r}, {str(tmp / 'noimport')!r}); "
            "print(sorted(m for m in ('levanter', 'jax', 'ray') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
    assert len(open_cache(str(tmp / "noimport" / "train"))) > 0
