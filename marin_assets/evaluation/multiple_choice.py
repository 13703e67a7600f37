"""Score an eval task by log-likelihood: multiple-choice accuracy and gold-answer bits-per-byte.

Each choice of an item is a (context, continuation) pair scored as the sum of its
continuation tokens' log-probs given the context (Winogrande's choices differ in context,
the others in continuation). ``acc`` picks the highest sum; ``acc_norm`` divides each sum by
the continuation's length in characters first (lm-evaluation-harness's acc_norm, OLMES's
acc_per_char), so long answers are not penalised for having more tokens. ``bpb`` is the
bits per UTF-8 byte of the gold continuations (total nats / total bytes / ln 2): a smooth
number a ladder of small models can extrapolate where accuracy still sits at chance.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from marin_assets.datakit.eval_sets import TaskItem, load_task, task
from marin_assets.evaluation.scoring import TokenLogprobs, score_spans

# [(context, continuation)] -> [sum of continuation log-probs]
PairScorer = Callable[[Sequence[tuple[str, str]]], Sequence[float]]


def score_task(items: Sequence[TaskItem], score: PairScorer, kind: str = "mc") -> dict:
    """{"n", "bpb"} plus, for ``kind`` "mc": "acc", "acc_norm", "chance" and "predictions"
    [(id, pred, pred_norm, gold)]."""
    if not items:
        raise ValueError("score_task: no items")
    if kind not in ("mc", "bpb"):
        raise ValueError(f"score_task: kind must be 'mc' or 'bpb', got {kind!r}")
    pairs = [pair for item in items for pair in item.pairs]
    sums = list(score(pairs))
    if len(sums) != len(pairs):
        raise ValueError(f"scorer returned {len(sums)} scores for {len(pairs)} pairs")
    nats = gold_bytes = 0.0
    correct = correct_norm = 0
    chance = 0.0
    predictions = []
    i = 0
    for item in items:
        k = len(item.pairs)
        if kind == "mc" and k < 2:
            raise ValueError(f"item {item.id}: {k} choice(s); multiple choice needs at least 2")
        s = sums[i : i + k]
        i += k
        nats -= s[item.gold]
        gold_bytes += len(item.pairs[item.gold][1].encode("utf-8"))
        if kind == "bpb":
            continue
        chars = [max(1, len(continuation)) for _, continuation in item.pairs]
        pred = max(range(k), key=lambda j: s[j])
        pred_norm = max(range(k), key=lambda j: s[j] / chars[j])
        correct += pred == item.gold
        correct_norm += pred_norm == item.gold
        chance += 1.0 / k
        predictions.append((item.id, pred, pred_norm, item.gold))
    n = len(items)
    out: dict = {"n": n, "bpb": nats / max(gold_bytes, 1.0) / math.log(2)}
    if kind == "mc":
        out |= {"acc": correct / n, "acc_norm": correct_norm / n, "chance": chance / n, "predictions": predictions}
    return out


def model_pair_scorer(
    token_logprobs: TokenLogprobs, encode: Callable[[str], list[int]], bos_id: int, seq_len: int, batch_size: int = 16
) -> PairScorer:
    """A PairScorer over the model: context and continuation tokenized apart (as OLMES and
    lm-evaluation-harness do), the context after a BOS/EOS token."""

    def score(pairs):
        items = [([bos_id] + encode(ctx), encode(cont)) for ctx, cont in pairs]
        return [s for s, _ in score_spans(items, token_logprobs, seq_len, batch_size)]

    return score


def evaluate_task(name: str, score: PairScorer, limit: int | None = None) -> dict:
    """Load the first ``limit`` items of a registered task (all when None) and score them."""
    return score_task(load_task(name, limit), score, task(name).kind)
