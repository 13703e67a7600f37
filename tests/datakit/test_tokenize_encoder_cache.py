"""The per-process Encoder cache and the batched tokenize path: a cached Encoder follows the
tokenizer.json's bytes (never its path), reads a file as text mode does, and the cache a
shard gets does not depend on how its documents are batched."""

import json
import os

import pyarrow as pa
import pytest

from marin_assets.datakit.normalize import doc_id
from marin_assets.datakit.shards import write_table
from marin_assets.datakit.tokenize import BYTES, TokenizeConfig, byte_tokenizer_json, load_encoder, tokenize, tokenizer_text


def test_one_encoder_per_tokenizer_bytes_and_a_rewritten_file_gets_a_new_one(tmp_path):
    assert load_encoder("olmo") is load_encoder("olmo")
    path = tmp_path / "tokenizer.json"
    path.write_text(byte_tokenizer_json())
    first = load_encoder(str(path))
    assert first is load_encoder(BYTES)  # the same bytes under another name
    spec = json.loads(byte_tokenizer_json())
    spec["model"]["vocab"] = {char: 255 - i for char, i in spec["model"]["vocab"].items()}
    path.write_text(json.dumps(spec))  # same path, other bytes
    second = load_encoder(str(path))
    assert second is not first and second.sha256 != first.sha256
    assert second.encode("a") == [255 - ord("a")] and first.encode("a") == [ord("a")]


def test_a_tokenizer_file_reads_as_text_mode_does(tmp_path):
    path = tmp_path / "crlf.json"
    path.write_bytes(json.dumps(json.loads(byte_tokenizer_json()), indent=1).replace("\n", "\r\n").encode("utf-8"))
    with open(path, encoding="utf-8") as f:  # universal newlines, as fsspec's mode="r"
        expected = f.read()
    assert "\r" not in expected and tokenizer_text(str(path)) == expected
    import hashlib

    assert load_encoder(str(path)).sha256 == hashlib.sha256(expected.encode("utf-8")).hexdigest()


def _shard(path: str, texts: list) -> str:
    write_table(
        pa.table(
            {
                "id": [doc_id(t if t is not None else f"null-{i}") for i, t in enumerate(texts)],
                "text": pa.array(texts, pa.string()),
            }
        ),
        path,
    )
    return path


def _files(root) -> dict[str, bytes]:
    return {
        os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f), "rb").read()
        for d, _, files in os.walk(root)
        for f in files
    }


@pytest.mark.parametrize("tokenizer", [BYTES, "olmo"])
def test_the_cache_does_not_depend_on_the_batch_size(tmp_path, tokenizer):
    texts = [f"document {i} " + "words and more words " * (i % 13) for i in range(60)]
    shards = [_shard(str(tmp_path / "a.parquet"), texts[:35]), _shard(str(tmp_path / "b.parquet"), texts[35:])]
    small = tokenize(shards, tokenizer, str(tmp_path / "small"), TokenizeConfig(validation_fraction=0.3, batch_docs=4))
    whole = tokenize(shards, tokenizer, str(tmp_path / "whole"), TokenizeConfig(validation_fraction=0.3, batch_docs=1000))
    assert small == whole and small["validation"]["documents"] > 0
    assert _files(tmp_path / "small") == _files(tmp_path / "whole")


def test_a_document_without_text_is_an_error_naming_the_shard(tmp_path):
    shard = _shard(str(tmp_path / "nulls.parquet"), ["fine text", None, "more"])
    with pytest.raises(ValueError, match=r"nulls\.parquet: 1 documents have no text"):
        tokenize([shard], BYTES, str(tmp_path / "out"))
