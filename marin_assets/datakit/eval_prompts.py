"""How each eval task's items become prompts: ``(context, continuation)`` pairs per choice,
the gold index, and the item's plain text (what decontamination matches).

Raw rows (``hf_datasets/``) are formulated as cloze prompts after OLMES (Gu et al. 2024,
arXiv:2406.08446) and lm-evaluation-harness; oe-eval request dumps already hold OLMES's prompts,
so only their plain text is put together here. ``eval_sets`` reads the files and keeps the
registry of tasks; this module holds no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple


class Formulated(NamedTuple):
    pairs: list[tuple[str, str]]
    gold: int
    text: str


# ---- formulations of raw rows (hf_datasets) --------------------------------------------------


def _qa(question: str, choices: list[str], gold: int) -> Formulated:
    """The cloze prompt OLMES uses for ARC, CSQA, OpenBookQA, SciQ and Social IQa."""
    context = f"Question: {question}\nAnswer:"
    return Formulated([(context, f" {c}") for c in choices], gold, f"{question} {choices[gold]}")


def _lettered(row: dict, question_field: str = "question") -> Formulated:
    """ARC-style rows: choices {"text", "label"} and the gold label in answerKey."""
    labels = list(row["choices"]["label"])
    return _qa(row[question_field], list(row["choices"]["text"]), labels.index(row["answerKey"]))


def _hellaswag_clean(text: str) -> str:
    """HellaSwag's WikiHow rows carry "[title]"-style markers: a title becomes a sentence break
    (none added after a full stop, as OLMES's requests have it), the others go (lm-eval-harness)."""
    text = text.strip().replace(". [title]", ". ").replace(" [title]", ". ")
    return re.sub(r"\[.*?\]", "", text).replace("  ", " ")


def _hellaswag(row: dict) -> Formulated:
    context = _hellaswag_clean(f"{row['activity_label']}: {row['ctx_a']} {row['ctx_b'].capitalize()}")
    endings = [_hellaswag_clean(e) for e in row["endings"]]
    gold = int(row["label"])
    return Formulated([(context, f" {e}") for e in endings], gold, f"{context} {endings[gold]}")


def _boolq(row: dict) -> Formulated:
    """A yes/no answer to a question about the passage: " yes" is choice 0, " no" choice 1."""
    context = f"{row['passage']}\nQuestion: {row['question']}?\nAnswer:"
    gold = 0 if row["answer"] else 1
    return Formulated([(context, " yes"), (context, " no")], gold, f"{row['passage']}\n{row['question']}? {('yes', 'no')[gold]}")


def _piqa(row: dict) -> Formulated:
    solutions = [row["sol1"], row["sol2"]]
    gold = int(row["label"])
    return Formulated([(f"Goal: {row['goal']}\nAnswer:", f" {s}") for s in solutions], gold, f"{row['goal']} {solutions[gold]}")


def _social_iqa(row: dict) -> Formulated:
    return _qa(f"{row['context']} {row['question']}", [row["answerA"], row["answerB"], row["answerC"]], int(row["label"]) - 1)


def _sciq(row: dict) -> Formulated:
    """The supporting paragraph (when the row has one), then the question; the right answer is the last choice."""
    support = row["support"].strip()
    question = f"{support}\nQuestion: {row['question']}" if support else f"Question: {row['question']}"
    choices = [row["distractor1"], row["distractor2"], row["distractor3"], row["correct_answer"]]
    plain = f"{support}\n{row['question']} {row['correct_answer']}".strip()
    return Formulated([(f"{question}\nAnswer:", f" {c}") for c in choices], 3, plain)


def _winogrande(row: dict) -> Formulated:
    """Partial scoring: each option fills the blank at the end of its own context; the rest of
    the sentence (the same for both) is the continuation, so the options compete on how well
    they predict what follows them, not on their own probability."""
    before, blank, after = row["sentence"].partition("_")
    if not blank:
        raise ValueError("sentence has no '_' blank")
    options = [row["option1"], row["option2"]]
    rest = f" {after.strip()}"
    gold = int(row["answer"]) - 1
    return Formulated([(before + o, rest) for o in options], gold, before + options[gold] + after)


def _copa(row: dict) -> Formulated:
    """The premise (its full stop dropped) joined to the lower-cased choice by its connective."""
    connective = {"cause": "because", "effect": "therefore"}[row["question"]]
    context = f"{row['premise'].strip()[:-1]} {connective}"
    choices = [row["choice1"], row["choice2"]]
    gold = int(row["label"])
    return Formulated([(context, f" {c[0].lower()}{c[1:]}") for c in choices], gold, f"{row['premise']} {choices[gold]}")


def _labelled(template: str, answers: tuple[str, ...]) -> Callable[[dict], Formulated]:
    """GLUE-style classification as lm-eval-harness prompts it: ``template`` filled from the
    row, the label names as the choices, ``label`` the gold index."""

    def formulate(row: dict) -> Formulated:
        context = template.format(**row)
        gold = int(row["label"])
        plain = "\n".join(str(v) for k, v in row.items() if k.startswith(("sentence", "premise", "hypothesis")))
        return Formulated([(context, f" {a}") for a in answers], gold, plain)

    return formulate


def _answer(question: str, answer: str) -> Formulated:
    return Formulated([(f"Question: {question}\nAnswer:", f" {answer}")], 0, f"{question} {answer}")


HF_FORMULATIONS: dict[str, tuple[str, Callable[[dict], Formulated]]] = {
    # name: (Arrow files under hf_datasets/, formulation)
    "arc_easy": ("ai2_arc/ARC-Easy/validation", _lettered),
    "arc_challenge": ("ai2_arc/ARC-Challenge/validation", _lettered),
    "boolq": ("boolq/none/validation", _boolq),
    "hellaswag": ("hellaswag/none/validation", _hellaswag),
    "openbookqa": ("openbookqa/main/validation", lambda r: _lettered(r, "question_stem")),
    "piqa": ("piqa/plain_text/validation", _piqa),
    "sciq": ("sciq/none/validation", _sciq),
    "social_iqa": ("social_i_qa/none/validation", _social_iqa),
    "winogrande": ("winogrande/winogrande_xl/validation", _winogrande),
    "commonsense_qa": ("tau/commonsense_qa/none/validation", _lettered),
    "copa": ("super_glue/copa/validation", _copa),
    "mmlu": ("hails/mmlu_no_train/*/test", lambda r: _qa(r["question"], list(r["choices"]), int(r["answer"]))),
    "rte": ("glue/rte/validation", _labelled("{sentence1}\nQuestion: {sentence2} True or False?\nAnswer:", ("True", "False"))),
    "mrpc": (
        "glue/mrpc/validation",
        _labelled(
            "Sentence 1: {sentence1}\nSentence 2: {sentence2}\nQuestion: Do both sentences mean the same thing?\nAnswer:",
            ("no", "yes"),
        ),
    ),
    "sst2": (
        "glue/sst2/validation",
        _labelled("{sentence}\nQuestion: Is this sentence positive or negative?\nAnswer:", ("negative", "positive")),
    ),
    "cb": (
        "super_glue/cb/validation",
        _labelled("{premise}\nQuestion: {hypothesis}. True, False, or Neither?\nAnswer:", ("True", "False", "Neither")),
    ),
    "basic_arithmetic": ("allenai/basic_arithmetic/none/validation", _lettered),
    "trivia_qa": ("trivia_qa/rc.wikipedia.nocontext/validation", lambda r: _answer(r["question"], r["answer"]["value"])),
    "nq_open": ("nq_open/none/validation", lambda r: _answer(f"{r['question']}?", r["answer"][0])),
}


# ---- oe-eval request dumps -------------------------------------------------------------------

_TEMPLATE = re.compile(r"^\s*(Question|Goal|Problem):\s*|\s*(Answer|Solution):\s*$")
# Fields of an oe-eval doc that hold the item's own text (the request context adds few-shot examples).
_PASSAGE_FIELDS = ("story", "passage", "context")
_QUESTION_FIELDS = ("question", "problem", "prompt", "text")


def _doc_text(doc: dict, answer: str, seen_passages: set[str]) -> str:
    """The item's own text (its passage and question, never the few-shot examples) and answer.
    A passage several items ask about (CoQA's stories: ~15 turns each) enters the first one's
    text only: the same n-grams again would name more ids of the same task, at the cost of
    a third of every eval n-gram the index hashes."""
    parts = []
    for field in (*_PASSAGE_FIELDS, *_QUESTION_FIELDS):
        value = doc.get(field)
        if not isinstance(value, str) or not value.strip() or (field in _PASSAGE_FIELDS and value in seen_passages):
            continue
        parts.append(value)
        if field in _PASSAGE_FIELDS:
            seen_passages.add(value)
    if not parts:
        parts = [_TEMPLATE.sub("", str(doc.get("query", "")))]
    return "\n".join(parts) + f" {answer.strip()}"


def oe_eval_item(requests: list[dict], kind: str, where: str, seen_passages: set[str]) -> Formulated:
    """One doc's requests (one per choice, in choice order) as pairs, gold and text."""
    requests = sorted(requests, key=lambda r: int(r.get("idx", 0)))
    pairs = [(str(r["request"]["context"]), str(r["request"]["continuation"])) for r in requests]
    doc = requests[0]["doc"]
    if kind == "bpb":
        if len(pairs) != 1:
            raise ValueError(f"{where}: {len(pairs)} requests for a bits-per-byte item (want 1)")
        return Formulated(pairs, 0, _doc_text(doc, pairs[0][1], seen_passages))
    gold = int(doc.get("gold", requests[0].get("label", -1)))
    if len(pairs) != len(doc.get("choices", pairs)):
        raise ValueError(f"{where}: {len(pairs)} requests for {len(doc['choices'])} choices")
    if not 0 <= gold < len(pairs):
        raise ValueError(f"{where}: gold index {gold} outside {len(pairs)} choices")
    return Formulated(pairs, gold, _doc_text(doc, pairs[gold][1], seen_passages))
