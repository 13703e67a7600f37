"""evaluate(checkpoint) -> bits-per-byte per tagged set + multiple-choice accuracies."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from marin_assets.evaluation.bpb import bits_per_byte
from marin_assets.evaluation.multiple_choice import accuracy, model_pair_scorer
from marin_assets.evaluation.scoring import byte_encode, model_token_logprobs
from marin_assets.knobs import knob
from marin_assets.numeric_checks import check_int

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalSettings:
    """What an evaluation scores. Knobs (marin_assets/knobs.py): the ``eval/<run>`` asset's config
    is generated from them, and ``evaluate``'s defaults are theirs."""

    tasks: list[str] = knob(["hellaswag", "arc_easy"], help="multiple-choice tasks to score")
    limit: int = knob(40, help="multiple-choice items per task")
    docs_per_source: int = knob(8, help="held-out documents per source for bits-per-byte")
    chars_per_doc: int = knob(4000, help="bits-per-byte scores the first this many characters of each held-out document")

    def __post_init__(self) -> None:
        check_int("limit (multiple-choice items per task)", self.limit, 1, 10**9)
        check_int("docs_per_source", self.docs_per_source, 0, 10**9)
        check_int("chars_per_doc", self.chars_per_doc, 1, 10**9)


_DEFAULTS = EvalSettings()


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
             tasks: Sequence[str] = tuple(_DEFAULTS.tasks), limit: int | None = _DEFAULTS.limit,
             encode: Callable[[str], list[int]] = byte_encode, bos_id: int = 0,
             seq_len: int | None = None, batch_size: int = 16, out_path: str | Path | None = None,
             telemetry_root: str | None = None, telemetry_run: str | None = None) -> dict:
    """Score a checkpoint. ``encode``/``bos_id`` must be the tokenizer the model trained with
    (default: raw bytes with EOS 0, the tiny test/demo setup).

    The scores are appended to the telemetry store (default ``$MARIN_PREFIX/telemetry``) at
    the checkpoint's step, as ``eval.*`` metrics of ``telemetry_run`` (default: the run the
    checkpoint's training logged under; a checkpoint from before telemetry names none, and
    then nothing is appended, with a log line saying so)."""
    from marin_assets.train.compile_cache import ensure_compile_cache

    ensure_compile_cache()
    params, model_cfg, bias, meta = load_model_from_checkpoint(checkpoint_dir)
    telemetry_run = telemetry_run or meta.get("telemetry_run")
    if telemetry_run is not None:  # names checked before the scoring, not after
        _check_metric_names(bpb_sets or {}, tasks)
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
    if out_path is not None:  # a path or fsspec URL (an eval asset's out dir on GCS)
        from marin_assets.store.fsutil import filesystem, write_json_atomic

        fs, path = filesystem(str(out_path))
        write_json_atomic(fs, path, result)
    if telemetry_run is None:
        log.info("evaluation of %s not appended to telemetry: the checkpoint names no telemetry run", checkpoint_dir)
    else:
        from marin_assets.telemetry import TelemetryWriter, default_root

        with TelemetryWriter(telemetry_root or default_root(), telemetry_run) as writer:
            writer.log(result["step"], telemetry_metrics(result), phase=result["phase"])
    return result


def telemetry_metrics(result: dict) -> dict[str, float]:
    """eval.bpb.micro / eval.bpb.macro / eval.bpb.<set> / eval.acc.<task> / eval.acc_norm.<task>."""
    out = {}
    if "bpb" in result:
        out |= {"eval.bpb.micro": result["bpb"]["micro_bpb"], "eval.bpb.macro": result["bpb"]["macro_bpb"]}
        out |= {f"eval.bpb.{name}": v["bpb"] for name, v in result["bpb"]["sets"].items()}
    for task, scores in result.get("multiple_choice", {}).items():
        out |= {f"eval.{k}.{task}": scores[k] for k in ("acc", "acc_norm") if k in scores}
    return out


def _check_metric_names(bpb_sets: Mapping, tasks: Sequence[str]) -> None:
    from marin_assets.store.names import validate_segment

    for name in [*(f"eval.bpb.{s}" for s in bpb_sets), *(f"eval.acc_norm.{t}" for t in tasks)]:
        validate_segment(name, "telemetry metric name (from an eval set or task name)")
