"""What the trainer refuses to train on: a cache whose write did not finish, and (on a resume or
warm start) tokens of another tokenizer than the checkpoint's, even with the same vocabulary size."""

import json

import pytest

from marin_assets.datakit.levanter_cache import CacheWriter
from marin_assets.datakit.normalize import NormalizeConfig, normalize
from marin_assets.datakit.shards import list_shards
from marin_assets.datakit.tokenize import TokenizeConfig, byte_tokenizer_json, tokenize
from marin_assets.train.config import replace


def _permuted_byte_tokenizer(path) -> str:
    """A byte tokenizer whose ids are the bytes reversed (b -> 255 - b): 257 ids like ours, other ids."""
    spec = json.loads(byte_tokenizer_json())
    spec["model"]["vocab"] = {char: 255 - i for char, i in spec["model"]["vocab"].items()}
    path.write_text(json.dumps(spec))
    return str(path)


@pytest.fixture(scope="module")
def two_caches(tmp_path_factory):
    """The same documents tokenized by two tokenizers of one vocabulary size (257)."""
    tmp = tmp_path_factory.mktemp("identity")
    docs = [f"document number {i} about the weather and rivers and mountains " * 4 for i in range(60)]
    (tmp / "in.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    normalize(str(tmp / "in.jsonl"), str(tmp / "norm"), NormalizeConfig(source="t"))
    shards = list_shards(str(tmp / "norm"))
    config = TokenizeConfig(validation_fraction=0.1)
    tokenize(shards, "bytes", str(tmp / "bytes"), config)
    tokenize(shards, _permuted_byte_tokenizer(tmp / "reversed.json"), str(tmp / "reversed"), config)
    return tmp


def test_a_cache_whose_write_did_not_finish_is_refused_before_any_step(tiny_config, tmp_path):
    from marin_assets.train.loop import train

    writer = CacheWriter(str(tmp_path / "cache"))
    writer.write_batch({"input_ids": [[1, 2, 3] * 50] * 20})  # rows written, then the writer "died": no ledger
    with pytest.raises(ValueError, match=r"unfinished token cache .* the write failed or was killed"):
        train(tiny_config, str(tmp_path / "cache"), tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoints").exists()
    writer.__exit__(None, None, None)  # a clean exit writes the ledger: now it trains
    result = train(replace(tiny_config, num_steps=2), str(tmp_path / "cache"), tmp_path / "run")
    assert result.final_step == 2


@pytest.mark.slow
def test_a_resume_onto_another_tokenizers_tokens_stops_unless_allowed(two_caches, tiny_config, tmp_path):
    from marin_assets.train.loop import train

    config = replace(tiny_config, model={"vocab_size": 257}, num_steps=4, checkpoint_every_steps=2)
    first = train(replace(config, num_steps=2), str(two_caches / "bytes"), tmp_path / "run")
    assert first.final_step == 2
    with pytest.raises(ValueError, match=r"tokenized by tokenizer \w{12}, but the data given now was tokenized by \w{12}"):
        train(config, str(two_caches / "reversed"), tmp_path / "run", resume=True)
    # The same tokenizer resumes silently; another one only when the caller says so.
    again = train(config, str(two_caches / "bytes"), tmp_path / "again_src", resume=False)
    assert again.final_step == 4
    allowed = train(config, str(two_caches / "reversed"), tmp_path / "run", resume=True, allow_tokenizer_change=True)
    assert allowed.final_step == 4


def test_a_warm_start_onto_another_tokenizers_tokens_stops_too(two_caches, tiny_config, tmp_path):
    from marin_assets.train.loop import train

    config = replace(tiny_config, model={"vocab_size": 257}, num_steps=2)
    train(config, str(two_caches / "bytes"), tmp_path / "a")
    with pytest.raises(ValueError, match="warm start .* was trained on 'train' tokenized by"):
        train(config, str(two_caches / "reversed"), tmp_path / "b", warm_start=tmp_path / "a")
