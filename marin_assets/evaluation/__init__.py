"""Evaluation: bits-per-byte per tagged held-out set and log-likelihood multiple choice.

Public API
----------
evaluate(checkpoint_dir, bpb_sets={tag: [text]}, tasks=("hellaswag", "arc_easy"), limit=40,
         encode=byte_encode, bos_id=0) -> {"step", "bpb": {...}, "multiple_choice": {...}}
bits_per_byte(sets, token_logprobs, encode, bos_id, seq_len) -> {"sets", "micro_bpb", "macro_bpb"}
accuracy(examples, score_pairs) -> {"acc", "acc_norm", "n", "chance", "predictions"}
"""

from marin_assets.evaluation.bpb import bits_per_byte
from marin_assets.evaluation.multiple_choice import accuracy, model_pair_scorer
from marin_assets.evaluation.run import evaluate, load_model_from_checkpoint
from marin_assets.evaluation.scoring import byte_encode, model_token_logprobs, score_spans

__all__ = ["evaluate", "bits_per_byte", "accuracy", "model_pair_scorer", "load_model_from_checkpoint",
           "byte_encode", "model_token_logprobs", "score_spans"]
