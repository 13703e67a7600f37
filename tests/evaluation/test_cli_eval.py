"""`marin eval tasks` and `marin eval score`: full task sizes, capped here by --limit."""

from __future__ import annotations

import json

import pytest

from marin_assets.cli import main
from marin_assets.datakit import eval_sets
from marin_assets.evaluation import generative
from tests.support.checkpoints import save_untrained


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """An untrained dense model over the byte tokenizer's 257 ids (EOS 256)."""
    return save_untrained(tmp_path_factory.mktemp("run"), {"vocab_size": 257})


def test_tasks_lists_each_task_at_its_full_size(monkeypatch, capsys):
    monkeypatch.setattr(eval_sets, "TASKS", {n: eval_sets.TASKS[n] for n in ("copa", "cb", "codex_humaneval")})
    monkeypatch.setattr(generative, "GEN_TASKS", {})  # listed in tests/evaluation/test_generative.py
    assert main(["eval", "tasks", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {
        "tasks": [
            {"task": "copa", "kind": "mc", "format": "hf", "items": 100},
            {"task": "cb", "kind": "mc", "format": "hf", "items": 56},
            {"task": "codex_humaneval", "kind": "bpb", "format": "oe_eval", "items": 164},
        ],
        "total_items": 320,
    }


def test_score_a_checkpoint_on_tasks_and_a_dataset(checkpoint, tmp_path, capsys):
    from marin_assets.datakit.datasets import Dataset, write_dataset
    from tests.support.datasets import write_shard

    shard = write_shard(str(tmp_path / "ds"), "web-00000", ["train text"], [f"held-out page {i}" for i in range(5)])
    write_dataset(Dataset("web", (shard,), {}), str(tmp_path / "ds"))
    argv = [
        "eval",
        "score",
        str(checkpoint),
        "--task",
        "copa",
        "--task",
        "lambada",
        "--limit",
        "3",
        "--tokenizer",
        "bytes",
        "--dataset",
        f"web={tmp_path / 'ds'}",
        "--docs-per-source",
        "4",
        "--json",
        "--out",
        str(tmp_path / "eval.json"),
    ]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["step"] == 7 and set(out["tasks"]) == {"copa", "lambada"}
    assert out["tasks"]["copa"]["n"] == 3 and "acc" in out["tasks"]["copa"] and "acc" not in out["tasks"]["lambada"]
    assert out["bpb"]["sets"]["web"]["docs"] == 4
    assert json.loads((tmp_path / "eval.json").read_text()) == out


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--task", "hellaswagg"], "unknown eval task 'hellaswagg'"),
        (["--limit", "0"], "limit"),
        (["--dataset", "web"], "want NAME=PATH"),
        (["--no-tasks"], "nothing to score"),
    ],
)
def test_score_refuses_bad_flags_with_exit_2(checkpoint, capsys, argv, message):
    assert main(["eval", "score", str(checkpoint), "--tokenizer", "bytes", *argv]) == 2
    assert message in capsys.readouterr().err


def test_score_refuses_a_tokenizer_with_more_ids_than_the_model(checkpoint, capsys):
    """The OLMo tokenizer's 50,280 ids on a 257-id model: the embedding gather clamps ids past the vocabulary,
    so scoring went on and printed NaN bits-per-byte with exit 0."""
    assert main(["eval", "score", str(checkpoint), "--tokenizer", "olmo", "--task", "copa", "--limit", "2"]) == 2
    err = capsys.readouterr().err
    assert "more than the model's vocab_size 257" in err and "Traceback" not in err


def test_score_names_a_dataset_without_held_out_documents(checkpoint, tmp_path, capsys):
    from marin_assets.datakit.datasets import Dataset, write_dataset
    from tests.support.datasets import write_shard

    write_dataset(Dataset("web", (write_shard(str(tmp_path), "web-00000", ["train text"], []),), {}), str(tmp_path))
    argv = ["eval", "score", str(checkpoint), "--tokenizer", "bytes", "--no-tasks", "--dataset", f"web={tmp_path}"]
    assert main(argv) == 2
    assert "dataset web" in capsys.readouterr().err


def test_score_names_a_missing_checkpoint(tmp_path, capsys):
    assert main(["eval", "score", str(tmp_path / "nothing"), "--tokenizer", "bytes", "--task", "copa"]) == 2
    assert "marin eval score:" in capsys.readouterr().err
