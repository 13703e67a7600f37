import json

import numpy as np
import pytest

from marin_assets.datakit.levanter_cache import is_finished_cache, open_cache
from marin_assets.datakit.normalize import NormalizeConfig, normalize
from marin_assets.datakit.shards import list_shards, read_table
from marin_assets.datakit.tokenize import (
    BYTES,
    EOS,
    VALIDATION_DOCS,
    TokenizeConfig,
    TokenizerChoice,
    byte_tokenizer_json,
    is_validation,
    load_encoder,
    tokenize,
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    import random

    tmp = tmp_path_factory.mktemp("tok")
    rng = random.Random(0)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 60))) + f" #{i}" for i in range(120)]
    texts[7] = "ünïcode — and a literal <|endoftext|> inside the text"
    (tmp / "in.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    normalize(str(tmp / "in.jsonl"), str(tmp / "norm"), NormalizeConfig(source="t", shard_docs=50))
    shards = list_shards(str(tmp / "norm"))
    (tmp / "bytes.json").write_text(byte_tokenizer_json())
    return tmp, shards


def test_the_byte_tokenizer_is_one_id_per_utf8_byte_and_hf_reads_the_same():
    from tokenizers import Tokenizer

    enc = load_encoder(BYTES)
    text = "gamma — ünïcode"
    assert enc.is_bytes and enc.vocab_size == 257 and enc.eos_id == 256
    assert enc.encode(text) == list(text.encode("utf-8"))
    hf = Tokenizer.from_str(byte_tokenizer_json())  # the tokenizer.json a user can load elsewhere
    assert hf.encode(text, add_special_tokens=False).ids == list(text.encode("utf-8"))
    assert hf.decode(enc.encode(text)) == text and hf.token_to_id(EOS) == 256


def test_the_pinned_olmo_tokenizer_is_the_packaged_one():
    import hashlib

    from marin_assets.datakit.tokenize import PRETRAINED, _pretrained_path

    enc = load_encoder("olmo")
    assert (enc.vocab_size, enc.eos_id) == (50280, 50279)
    assert enc.sha256 == hashlib.sha256(open(_pretrained_path("olmo"), encoding="utf-8").read().encode()).hexdigest()
    assert "olmo_eval" in PRETRAINED["olmo"][0]
    # "Hello world" in GPT-NeoX/OLMo ids: a pinned vocabulary, not one fitted on our corpus.
    assert enc.encode("Hello world") == [12092, 1533]


def test_an_eos_string_inside_a_document_is_text_not_the_eos_id():
    for name in ("olmo", BYTES):
        enc = load_encoder(name)
        ids = enc.encode("a<|endoftext|>b")
        assert enc.eos_id not in ids and len(ids) > 3, name


def test_a_named_tokenizer_is_read_once_and_a_users_file_every_time(tmp_path, monkeypatch):
    from marin_assets.datakit import tokenize as tok

    load_encoder("olmo")
    reads = []
    monkeypatch.setattr(tok, "_tokenizer_bytes", lambda spec: reads.append(spec) or b"")
    assert load_encoder("olmo").vocab_size == 50280 and reads == []  # a package's file: fixed for the process
    monkeypatch.undo()
    path = tmp_path / "tokenizer.json"
    path.write_text(byte_tokenizer_json())
    first = load_encoder(str(path))
    path.write_text(tok.Encoder(byte_tokenizer_json()).tokenizer.to_str(pretty=True))  # new bytes, same model
    assert load_encoder(str(path)).sha256 != first.sha256  # a user's file: read again


def test_a_bad_tokenizer_is_a_clear_error(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="bad.json is not a tokenizer.json"):
        load_encoder(str(tmp_path / "bad.json"))
    with pytest.raises(FileNotFoundError, match="nope.json does not exist"):
        load_encoder(str(tmp_path / "nope.json"))
    with pytest.raises(ValueError, match="tokenizer must be a name"):
        TokenizerChoice("")


@pytest.mark.parametrize("tokenizer", [BYTES, "olmo"])
def test_levanter_reader_opens_cache_with_exact_tokens(corpus, tokenizer):
    tmp, shards = corpus
    out = tmp / f"cache_{tokenizer}"
    stats = tokenize(shards, tokenizer, str(out), TokenizeConfig(validation_fraction=0.25, min_validation_docs=0))
    enc = load_encoder(tokenizer)
    expected = {"train": [], "validation": []}
    held = []
    for shard in shards:
        for row in read_table(shard).to_pylist():
            split = "validation" if is_validation(row["id"], 0.25) else "train"
            expected[split].append(enc.encode(row["text"]) + [enc.eos_id])
            if split == "validation":
                held.append((row["id"], row["text"]))
    assert 0 < len(expected["validation"]) < len(expected["train"])
    for split in ("train", "validation"):
        cache = open_cache(str(out / split))  # Levanter's own TreeCache.load
        assert len(cache) == len(expected[split]) == stats[split]["documents"]
        rows = cache.get_batch_sync(list(range(len(cache))))
        assert [r["input_ids"].tolist() for r in rows] == expected[split]
        assert rows[0]["input_ids"].dtype == np.int32
        assert stats[split]["tokens"] == sum(len(e) for e in expected[split])
        assert stats[split]["bytes_per_token"] == pytest.approx(stats[split]["bytes"] / stats[split]["tokens"])
        assert is_finished_cache(str(out / split))
    on_disk = json.loads((out / "stats.json").read_text())
    assert on_disk["train"]["tokens"] == stats["train"]["tokens"]
    assert on_disk["tokenizer"] == {"sha256": enc.sha256, "vocab_size": enc.vocab_size, "eos_id": enc.eos_id}
    # The held-out documents' text, for bits-per-byte evals: exactly the validation split's documents.
    assert list(zip(*(read_table(str(out / VALIDATION_DOCS)).column(c).to_pylist() for c in ("id", "text")))) == held


def test_split_is_a_function_of_the_id():
    ids = [f"{i:08x}" + "0" * 24 for i in range(0, 2**32, 2**22)]
    flags = [is_validation(i, 0.1) for i in ids]
    assert flags == [is_validation(i, 0.1) for i in ids]
    assert 0.05 < sum(flags) / len(flags) < 0.15
    assert not any(is_validation(i, 0.0) for i in ids)


def test_configs_validate():
    with pytest.raises(ValueError, match="validation_fraction"):
        TokenizeConfig(validation_fraction=1.0)


def test_rerun_replaces_the_cache_and_a_failed_run_leaves_no_finished_ledger(corpus):
    tmp, shards = corpus
    tok_path = str(tmp / "bytes.json")
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
    enc = load_encoder(BYTES)
    by_tokens = {tuple(enc.encode(r["text"]) + [enc.eos_id]): r["id"] for s in shards for r in read_table(s).to_pylist()}
    ids = {}
    for split in ("train", "validation"):
        cache = open_cache(str(out / split))
        rows = cache.get_batch_sync(list(range(len(cache)))) if len(cache) else []  # Levanter: max() of []
        ids[split] = sorted(by_tokens[tuple(r["input_ids"].tolist())] for r in rows)
    return ids


@pytest.mark.parametrize(
    "fraction, wanted, expected",
    [
        (1e-9, 1, "one smallest"),  # the slice picks none of 120: the smallest id is held out
        (1e-9, 3, "three smallest"),
        (0.0, 1, "none"),  # a fraction of 0 asks for no validation: none is forced
        (1e-9, 0, "none"),  # off: the pure hash split
        (0.25, 1, "hash slice"),  # the slice already picks some: nothing moves
    ],
)
def test_min_validation_docs_tops_up_a_small_split(corpus, fraction, wanted, expected):
    tmp, shards = corpus
    all_ids = sorted(r["id"] for s in shards for r in read_table(s).to_pylist())
    assert not any(is_validation(i, 1e-9) for i in all_ids)  # the premise of the 1e-9 cases
    out = tmp / f"cache_topup_{fraction}_{wanted}"
    stats = tokenize(shards, BYTES, str(out), TokenizeConfig(validation_fraction=fraction, min_validation_docs=wanted))
    ids = _split_ids(out, shards)
    want_validation = {
        "one smallest": all_ids[:1],
        "three smallest": all_ids[:3],
        "none": [],
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
    stats = tokenize(
        [str(few)],
        BYTES,
        str(tmp / f"cache_few_{n_docs}_{wanted}"),
        TokenizeConfig(validation_fraction=1e-9, min_validation_docs=wanted),
    )
    assert (stats["train"]["documents"], stats["validation"]["documents"]) == split_docs


def test_min_validation_docs_is_checked():
    with pytest.raises(ValueError, match="min_validation_docs"):
        TokenizeConfig(min_validation_docs=-1)


def test_cache_writer_writes_the_bytes_levanter_writes(tmp_path):
    """CacheWriter (no levanter import) and Levanter's SerialCacheWriter, same rows in the
    same batches: every file of the two caches is byte-identical."""
    from levanter.store.cache import SerialCacheWriter

    from marin_assets.datakit.levanter_cache import CacheWriter, exemplar

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


def test_cache_writer_rows_past_the_first_offsets_shard_read_back(tmp_path, monkeypatch):
    """Below the offsets' first shard file the ends and the count go in one transaction; past it,
    ends then count. With shard files of 8 elements (chunks of 4), batches that cross into the
    second and third read back whole."""
    from marin_assets.datakit import levanter_cache

    monkeypatch.setattr(levanter_cache, "_CHUNK", 4)
    monkeypatch.setattr(levanter_cache, "_WRITE_CHUNK", 8)
    rng = np.random.default_rng(1)
    batches = [[rng.integers(0, 300, size=int(n), dtype=np.int32) for n in rng.integers(1, 6, size=k)] for k in (5, 5, 9)]
    writer = levanter_cache.CacheWriter(str(tmp_path / "c"))
    for batch in batches:
        writer.write_batch({"input_ids": batch})
    writer.__exit__(None, None, None)
    assert sorted(p.name for p in (tmp_path / "c" / "input_ids" / "offsets" / "c").iterdir()) == ["0", "1", "2"]
    tokens = sum(a.size for b in batches for a in b)
    assert levanter_cache.check_cache(str(tmp_path / "c")) == (19, tokens)
    import tensorstore as ts

    def read(name: str) -> np.ndarray:
        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(tmp_path / "c" / "input_ids" / name)}}
        return ts.open(spec, open=True).result()[: {"offsets": 20, "data": tokens}[name]].read().result()

    offsets, data = read("offsets"), read("data")
    assert offsets[0] == 19
    rows = np.split(data, offsets[1:-1])  # Levanter's reader wants its own chunk shapes: read as it reads
    assert [r.tolist() for r in rows] == [a.tolist() for b in batches for a in b]


def test_tokenize_on_a_local_path_does_not_import_levanter(corpus):
    import subprocess
    import sys

    tmp, shards = corpus
    code = (
        "import sys; from marin_assets.datakit.tokenize import tokenize; "
        f"tokenize({[str(s) for s in shards]!r}, {str(tmp / 'bytes.json')!r}, {str(tmp / 'noimport')!r}); "
        "print(sorted(m for m in ('levanter', 'jax', 'ray') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
    assert len(open_cache(str(tmp / "noimport" / "train"))) > 0


@pytest.mark.parametrize("kind", ["string", "large_string"])
def test_utf8_sizes_come_from_the_column_offsets_of_a_sliced_batch(kind):
    import pyarrow as pa

    from marin_assets.datakit.tokenize import _utf8_sizes

    texts = ["héllo", "", "日本語", "x" * 5, "🙂"]
    column = pa.array(texts, getattr(pa, kind)()).slice(1, 3)  # a batch of a shard starts past offset 0
    assert _utf8_sizes(column, column.to_pylist()).tolist() == [0, 9, 5]
    as_binary = pa.array([t.encode() for t in texts]).slice(2)  # no UTF-8 offsets to trust: the texts are encoded
    assert _utf8_sizes(as_binary, texts[2:]).tolist() == [9, 5, 4]
