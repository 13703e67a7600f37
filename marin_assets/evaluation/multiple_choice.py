"""Log-likelihood multiple choice (HellaSwag, ARC, ...), as lm-eval-harness scores it.

Each choice is scored as the sum of its continuation tokens' log-probs given the context.
``acc`` picks the highest sum; ``acc_norm`` divides each sum by the continuation's length
in bytes first (so long answers are not penalised for having more tokens).
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from marin_assets.evaluation.scoring import TokenLogprobs, score_spans

# [(context, continuation)] -> [sum of continuation log-probs]
PairScorer = Callable[[Sequence[tuple[str, str]]], Sequence[float]]


def continuation(choice: str) -> str:
    return " " + choice.lstrip()


def accuracy(examples: Sequence[Mapping], score: PairScorer) -> dict:
    """{"acc", "acc_norm", "n", "chance", "predictions": [(id, pred, pred_norm, gold)]}."""
    if not examples:
        raise ValueError("accuracy: no examples")
    pairs, owners = [], []
    for ex in examples:
        if not ex["choices"]:
            raise ValueError(f"example {ex.get('id')}: no choices")
        for c in ex["choices"]:
            pairs.append((ex["context"], continuation(c)))
            owners.append(ex)
    sums = list(score(pairs))
    if len(sums) != len(pairs):
        raise ValueError(f"scorer returned {len(sums)} scores for {len(pairs)} pairs")
    correct = correct_norm = 0
    chance = 0.0
    predictions = []
    i = 0
    for ex in examples:
        k = len(ex["choices"])
        s = sums[i:i + k]
        lengths = [max(1, len(continuation(c).encode("utf-8"))) for c in ex["choices"]]
        i += k
        pred = max(range(k), key=lambda j: s[j])
        pred_norm = max(range(k), key=lambda j: s[j] / lengths[j])
        correct += pred == ex["gold"]
        correct_norm += pred_norm == ex["gold"]
        chance += 1.0 / k
        predictions.append((ex.get("id"), pred, pred_norm, ex["gold"]))
    n = len(examples)
    return {"acc": correct / n, "acc_norm": correct_norm / n, "n": n, "chance": chance / n,
            "predictions": predictions}


def model_pair_scorer(token_logprobs: TokenLogprobs, encode: Callable[[str], list[int]], bos_id: int,
                      seq_len: int, batch_size: int = 8) -> PairScorer:
    def score(pairs):
        items = [([bos_id] + encode(ctx), encode(cont)) for ctx, cont in pairs]
        return [s for s, _ in score_spans(items, token_logprobs, seq_len, batch_size)]

    return score


def evaluate_task(name: str, score: PairScorer, limit: int | None = None) -> dict:
    from marin_assets.datakit.eval_sets import load_multiple_choice

    return accuracy(load_multiple_choice(name, limit), score)
