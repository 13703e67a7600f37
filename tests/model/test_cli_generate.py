"""`marin generate` end to end on a saved checkpoint: the tokenizer found from the checkpoint's
record, text in and out, stops, and one-line refusals (exit 2)."""

from __future__ import annotations

import json

import pytest

from marin_assets.cli import main
from tests.support.byte_tokens import EOS
from tests.support.checkpoints import save_untrained


def _save(folder, data_tokenizers: dict | None):
    meta = {} if data_tokenizers is None else {"data_tokenizers": data_tokenizers}
    return save_untrained(folder, {"vocab_size": 257, "init_std": 0.5}, meta)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """An untrained dense model whose data was tokenized by the byte tokenizer (257 ids, EOS 256)."""
    from marin_assets.datakit.tokenize import load_encoder

    return _save(tmp_path_factory.mktemp("run"), {"web": load_encoder("bytes").sha256})


def _run(argv, capsys) -> tuple[int, str, str]:
    code = main(["generate", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def _expected_ids(checkpoint, text: str, n: int) -> list[int]:
    """What the library generates for ``text`` (EOS first, as the CLI starts each prompt), stopping at EOS."""
    from marin_assets.model.decode import generate
    from marin_assets.train.restore import load_model_from_checkpoint

    params, config, bias, _ = load_model_from_checkpoint(checkpoint)
    return generate(params, config, bias, [[EOS, *text.encode()]], max_new_tokens=n, stop_sequences=[[EOS]])[0]


def test_generate_finds_the_byte_tokenizer_and_matches_the_library(checkpoint, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("second prompt\n\n")
    code, out, err = _run(
        [
            "--checkpoint",
            str(checkpoint),
            "--prompt",
            "Once upon",
            "--prompt-file",
            str(prompts),
            "--max-new-tokens",
            "12",
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    result = json.loads(out)
    assert result["step"] == 7 and [s["prompt"] for s in result["samples"]] == ["Once upon", "second prompt"]
    for sample in result["samples"]:
        ids = _expected_ids(checkpoint, sample["prompt"], 12)
        assert sample["tokens"] == len(ids) and 0 < len(ids) <= 12
        assert sample["completion"] == bytes(ids).decode("utf-8", errors="replace")


def test_a_stop_text_ends_the_completion_before_it(checkpoint, capsys):
    ids = _expected_ids(checkpoint, "Once upon", 12)
    first_ascii = next(i for i, t in enumerate(ids) if 32 <= t < 127)  # the fixed init emits one (checked here)
    code, out, err = _run(
        [
            "--checkpoint",
            str(checkpoint),
            "--prompt",
            "Once upon",
            "--max-new-tokens",
            "12",
            "--stop",
            chr(ids[first_ascii]),
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    sample = json.loads(out)["samples"][0]
    assert sample["tokens"] == first_ascii
    assert sample["completion"] == bytes(ids[:first_ascii]).decode("utf-8", errors="replace")


def test_a_checkpoint_without_a_recorded_tokenizer_asks_for_one(tmp_path, capsys):
    folder = _save(tmp_path, None)
    code, _, err = _run(["--checkpoint", str(folder), "--prompt", "x", "--max-new-tokens", "2"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "records no tokenizer: pass --tokenizer PATH|bytes" in err
    code, out, err = _run(
        ["--checkpoint", str(folder), "--prompt", "x", "--max-new-tokens", "2", "--tokenizer", "bytes", "--json"], capsys
    )
    assert code == 0, err
    assert json.loads(out)["samples"][0]["tokens"] <= 2


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--top-p", "0"], "top_p must be in (0, 1]"),
        (["--temperature", "nan"], "temperature must be a finite number"),
        (["--max-new-tokens", "64"], "max_seq_len 64"),
        (["--stop", ""], "a stop text must not be empty"),
        (["--tokenizer", "olmo"], "is not the one"),
    ],
)
def test_bad_flags_are_one_line_exit_2(checkpoint, capsys, argv, message):
    code, _, err = _run(["--checkpoint", str(checkpoint), "--prompt", "hello", *argv], capsys)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("marin generate: ") and message in err


def test_an_hf_export_generates_what_its_checkpoint_does(checkpoint, tmp_path, capsys):
    """``hf:PATH`` loads through the importer with the folder's tokenizer.json: the same text as the checkpoint."""
    exported = tmp_path / "hf"
    assert main(["export", "hf", str(checkpoint), str(exported)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    argv = ["--prompt", "Once upon", "--max-new-tokens", "12", "--json"]
    code, out, err = _run(["--checkpoint", f"hf:{exported}", *argv], capsys)
    assert code == 0, err
    code, direct, err = _run(["--checkpoint", str(checkpoint), *argv], capsys)
    assert code == 0, err
    assert json.loads(out)["samples"] == json.loads(direct)["samples"]


@pytest.mark.parametrize("source,message", [("missing", "no valid checkpoint"), ("hf:/some/folder", "no config.json")])
def test_a_missing_or_unsupported_source_is_named(tmp_path, capsys, source, message):
    where = source if source.startswith("hf:") else str(tmp_path / source)
    code, _, err = _run(["--checkpoint", where, "--prompt", "x"], capsys)
    assert code == 2 and message in err and err.count("\n") == 1
