"""evaluate(checkpoint) -> bits-per-byte per tagged set + multiple-choice accuracies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Mapping, Sequence

from marin_assets.evaluation.bpb import bits_per_byte
from marin_assets.evaluation.multiple_choice import accuracy, model_pair_scorer
from marin_assets.evaluation.scoring import byte_encode, model_token_logprobs


def load_model_from_checkpoint(checkpoint_dir: str | Path):
    """(params, ModelConfig, router_bias, meta) from a train checkpoint (or an out dir)."""
    import jax

    from marin_assets.model import init_params, init_router_bias
    from marin_assets.train import checkpoint as ckpt
    from marin_assets.train.config import config_from_dict
    from marin_assets.train.loop import resolve_checkpoint

    folder = resolve_checkpoint(checkpoint_dir)
    arrays, meta = ckpt.load(folder)
    config = config_from_dict(meta["config"], where=f"{folder}/meta.json")
    template = jax.eval_shape(lambda: init_params(config.model, jax.random.PRNGKey(0)))
    params = ckpt.restore_like(template, arrays, "['params']", str(folder))
    bias = ckpt.restore_like(init_router_bias(config.model), arrays, "['router_bias']", str(folder))
    return params, config.model, bias, meta


def evaluate(checkpoint_dir: str | Path, bpb_sets: Mapping[str, Sequence[str]] | None = None,
             tasks: Sequence[str] = ("hellaswag", "arc_easy"), limit: int | None = 100,
             encode: Callable[[str], list[int]] = byte_encode, bos_id: int = 0,
             seq_len: int | None = None, batch_size: int = 16, out_path: str | Path | None = None) -> dict:
    """Score a checkpoint. ``encode``/``bos_id`` must be the tokenizer the model trained with
    (default: raw bytes with EOS 0, the tiny test/demo setup)."""
    params, model_cfg, bias, meta = load_model_from_checkpoint(checkpoint_dir)
    seq_len = seq_len or min(model_cfg.max_seq_len, int(meta["config"]["seq_len"]))
    logprobs = model_token_logprobs(params, model_cfg, bias)
    result: dict = {"step": int(meta["step"]), "phase": meta.get("phase")}
    if bpb_sets:
        result["bpb"] = bits_per_byte(bpb_sets, logprobs, encode, bos_id, seq_len, batch_size)
    scorer = model_pair_scorer(logprobs, encode, bos_id, seq_len, batch_size)
    if tasks:
        from marin_assets.datakit.eval_sets import load_multiple_choice

        result["multiple_choice"] = {}
        for name in tasks:
            scored = accuracy(load_multiple_choice(name, limit), scorer)
            scored.pop("predictions")
            result["multiple_choice"][name] = scored
    if out_path is not None:
        Path(out_path).write_text(json.dumps(result, indent=1))
    return result
