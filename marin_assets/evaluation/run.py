"""evaluate(checkpoint) -> bits-per-byte per held-out domain + the scores of eval tasks."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from marin_assets.datakit import eval_sets
from marin_assets.datakit.datasets import held_out_texts, read_dataset
from marin_assets.evaluation import generative
from marin_assets.evaluation.bpb import bits_per_byte
from marin_assets.evaluation.multiple_choice import evaluate_task, model_pair_scorer
from marin_assets.evaluation.scoring import byte_encode, model_token_logprobs
from marin_assets.knobs import knob
from marin_assets.numeric_checks import check_int
from marin_assets.store.fsutil import filesystem, write_json_atomic
from marin_assets.store.names import validate_segment
from marin_assets.train.compile_cache import ensure_compile_cache

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SamplingSettings:
    """How ``marin generate`` samples (``marin_assets.model.decode.generate``'s arguments, which check the
    values before any compute)."""

    max_new_tokens: int = knob(64, help="tokens to generate per prompt at most")
    temperature: float = knob(0.0, help="0: greedy (argmax); else sample at this temperature")
    top_p: float = knob(1.0, help="sample only from the smallest set of tokens with this probability mass")
    seed: int = knob(0, help="the sampling seed (each row draws from its own key)")
    compute_dtype: str = knob("float32", help="the matmuls' dtype: float32 or bfloat16")


@dataclass(frozen=True)
class EvalSettings:
    """What an evaluation scores. Knobs (marin_assets/knobs.py): the ``eval/<run>`` and
    ``eval/<run>/tasks`` asset configs and ``marin eval``'s flags are generated from them."""

    tasks: list[str] = knob(
        [],
        help="eval tasks a phase's eval/<run> also scores (each task has its own eval/<run>/tasks "
        "partition; marin_assets.datakit.eval_sets.TASK_NAMES)",
    )
    limit: int | None = knob(None, help="items per task: the first this many (none: every item, the task's full size)")
    # eval/<run> scores every phase as it ends: at 256 x 4000 the demo's four domains were 487k bytes (20x the tokens
    # its longest phase trains on) and ~12 s a phase on 2 CPUs; 64 x 2000 (148k bytes) took ~5 s (measured).
    docs_per_source: int = knob(64, help="held-out documents per source (domain) for bits-per-byte; all of them when fewer")
    chars_per_doc: int = knob(2000, help="bits-per-byte scores the first this many characters of each held-out document")
    batch_size: int = knob(16, versioned=False, help="rows of seq_len tokens per model call (shorter windows: more rows)")

    def __post_init__(self) -> None:
        if self.limit is not None:
            check_int("limit (items per task)", self.limit, 1, 10**9)
        check_int("docs_per_source", self.docs_per_source, 0, 10**9)
        check_int("chars_per_doc", self.chars_per_doc, 1, 10**9)
        check_int("batch_size", self.batch_size, 1, 10**6)
        for name in self.tasks:
            check_task_name(name)


def check_task_name(name: str) -> None:
    """ValueError naming an unknown task and the known ones (log-likelihood and generative)."""
    if name not in eval_sets.TASKS and name not in generative.GEN_TASKS:
        known = f"known: {', '.join(eval_sets.TASK_NAMES)}; generative: {', '.join(generative.GEN_TASK_NAMES)}"
        raise ValueError(f"unknown eval task {name!r}; {known}")


_DEFAULTS = EvalSettings()


def check_model_tokenizer(encoder, meta: Mapping, config, where: str) -> None:
    """ValueError unless ``encoder`` is the tokenizer ``where``'s checkpoint trained with (its meta records the
    data tokenizers' sha256s; a checkpoint that records none is taken at its word) and its ids fit the model's
    vocabulary: an id past it is clamped silently by the embedding gather, scoring garbage (NaN bits-per-byte)."""
    recorded = set((meta.get("data_tokenizers") or {}).values())
    if recorded and encoder.sha256 not in recorded:
        raise ValueError(
            f"the tokenizer given (sha256 {encoder.sha256[:12]}) is not the one {where} trained with "
            f"({', '.join(sorted(s[:12] for s in recorded))}): pass --tokenizer with that one (bytes, olmo or its tokenizer.json)"
        )
    if encoder.vocab_size > config.vocab_size:
        raise ValueError(
            f"the tokenizer given has {encoder.vocab_size} ids, more than the model's vocab_size {config.vocab_size} "
            f"in {where}: pass --tokenizer with the one it trained with"
        )


def evaluate(
    checkpoint_dir: str | Path,
    bpb_sets: Mapping[str, Sequence[str]] | None = None,
    tasks: Sequence[str] = tuple(_DEFAULTS.tasks),
    limit: int | None = _DEFAULTS.limit,
    encode: Callable[[str], list[int]] = byte_encode,
    bos_id: int = 0,
    seq_len: int | None = None,
    batch_size: int = _DEFAULTS.batch_size,
    out_path: str | Path | None = None,
    telemetry_root: str | None = None,
    telemetry_run: str | None = None,
    decode: Callable[[list[int]], str] | None = None,
    eos_id: int | None = None,
    generate_fn=None,
    allow_code_execution: bool = False,
    encoder=None,
) -> dict:
    """Score a checkpoint: bits-per-byte of each held-out set in ``bpb_sets`` (a domain each)
    and every task of ``tasks`` (its first ``limit`` items). ``encode``/``bos_id`` must be the
    tokenizer the model trained with (default: raw bytes with EOS 0, the tiny test/demo setup).

    The scores are appended to the telemetry store (default ``$MARIN_PREFIX/telemetry``) at
    the checkpoint's step, as ``eval.*`` metrics of ``telemetry_run`` (default: the run the
    checkpoint's training logged under; a checkpoint from before telemetry names none, and
    then nothing is appended, with a log line saying so).

    Generative tasks (``marin_assets.evaluation.generative``) decode with ``decode`` (default: raw
    bytes), stop at ``eos_id`` (default ``bos_id``) and generate with ``generate_fn`` (default:
    ``marin_assets.model.decode.generate``, imported here; where it is missing they report
    ``skipped``). Code tasks run model-written code only with ``allow_code_execution``. ``encoder`` (the
    tokenizer behind ``encode``, when the caller has one) is checked against the checkpoint first."""
    from marin_assets.train.restore import load_model_from_checkpoint  # deferred (import cost): jax, optax

    EvalSettings(tasks=list(tasks), limit=limit, batch_size=batch_size)  # unknown tasks fail before the model loads
    ensure_compile_cache()
    params, model_cfg, bias, meta = load_model_from_checkpoint(checkpoint_dir)
    if encoder is not None:
        check_model_tokenizer(encoder, meta, model_cfg, str(checkpoint_dir))
    telemetry_run = telemetry_run or meta.get("telemetry_run")
    if telemetry_run is not None:  # names checked before the scoring, not after
        _check_metric_names(bpb_sets or {}, tasks)
    seq_len = seq_len or min(model_cfg.max_seq_len, int(meta["config"]["seq_len"]))
    logprobs = model_token_logprobs(params, model_cfg, bias)
    result: dict = {"step": int(meta["step"]), "phase": meta.get("phase")}
    if bpb_sets:
        result["bpb"] = bits_per_byte(bpb_sets, logprobs, encode, bos_id, seq_len, batch_size)
    if tasks:
        scorer = model_pair_scorer(logprobs, encode, bos_id, seq_len, batch_size)
        generative = _GenerativeRunner(
            params,
            model_cfg,
            bias,
            generate_fn,
            encode,
            decode,
            bos_id,
            bos_id if eos_id is None else eos_id,
            allow_code_execution,
        )
        result["tasks"] = {}
        for name in tasks:
            scored = generative.run(name, limit, batch_size) if generative.handles(name) else evaluate_task(name, scorer, limit)
            scored.pop("predictions", None)
            result["tasks"][name] = scored
    if out_path is not None:  # a path or fsspec URL (an eval asset's out dir on GCS)
        fs, path = filesystem(str(out_path))
        write_json_atomic(fs, path, result)
    if telemetry_run is None:
        log.info("evaluation of %s not appended to telemetry: the checkpoint names no telemetry run", checkpoint_dir)
    else:
        from marin_assets.telemetry import TelemetryWriter, default_root  # deferred (import cost): polars, pyarrow

        with TelemetryWriter(telemetry_root or default_root(), telemetry_run) as writer:
            writer.log(result["step"], telemetry_metrics(result), phase=result["phase"])
    return result


class _GenerativeRunner:
    """The generative tasks of one evaluation: the model bound to ``generate_fn`` (imported once, when
    the first generative task runs)."""

    def __init__(self, params, model_cfg, bias, generate_fn, encode, decode, bos_id, eos_id, allow_code_execution):
        self.model = (params, model_cfg, bias)
        self.generate_fn, self.unavailable = generate_fn, None
        self.encode, self.decode, self.bos_id, self.eos_id = encode, decode, bos_id, eos_id
        self.allow_code_execution = allow_code_execution
        self.resolved = generate_fn is not None

    @staticmethod
    def handles(name: str) -> bool:
        return name in generative.GEN_TASKS

    def run(self, name: str, limit: int | None, batch_size: int) -> dict:
        if not self.resolved:
            self.generate_fn, self.unavailable = generative.default_generate_fn()
            self.resolved = True
        generate = None if self.generate_fn is None else generative.bind_model(self.generate_fn, *self.model)
        return generative.evaluate_generative(
            name,
            generate,
            self.encode,
            self.decode or generative.byte_decode,
            self.bos_id,
            self.eos_id,
            limit=limit,
            max_seq_len=self.model[1].max_seq_len,
            batch_size=batch_size,
            allow_code_execution=self.allow_code_execution,
            unavailable=self.unavailable,
        )


# Scores of generative tasks, as asset metadata and telemetry metrics (skipped tasks have none).
GENERATIVE_METRICS = ("exact_match", "f1", "pass_at_1")


def held_out_domains(indexes: Mapping[str, str], settings: EvalSettings = _DEFAULTS) -> dict[str, list[str]]:
    """{domain: texts}: up to ``docs_per_source`` held-out documents of each dataset index (every one
    when it has fewer), each cut to ``chars_per_doc``. ValueError naming a dataset without any, or
    when no dataset is given."""
    if not indexes:
        raise ValueError("no dataset with held-out documents to score")
    domains = {}
    for name, path in indexes.items():
        domains[name] = held_out_texts(read_dataset(path), settings.docs_per_source, settings.chars_per_doc)
        if not domains[name]:
            raise ValueError(f"dataset {name} ({path}) has no held-out documents to score")
    return domains


def result_metadata(result: dict) -> dict[str, float | int]:
    """An evaluation's scores as flat asset metadata: micro_bpb, macro_bpb, bpb/<domain>, docs/<domain>,
    acc/<task>, acc_norm/<task> (multiple choice), gold_bpb/<task> and, of generative tasks,
    exact_match/<task>, f1/<task> and pass_at_1/<task>."""
    out: dict[str, float | int] = {}
    if "bpb" in result:
        bpb = result["bpb"]
        out |= {"micro_bpb": bpb["micro_bpb"], "macro_bpb": bpb["macro_bpb"]}
        out |= {f"{k}/{domain}": v[k] for domain, v in bpb["sets"].items() for k in ("bpb", "docs")}
    for name, scores in result.get("tasks", {}).items():
        out |= {f"{k}/{name}": scores[k] for k in ("acc", "acc_norm", *GENERATIVE_METRICS) if k in scores}
        if "bpb" in scores:
            out[f"gold_bpb/{name}"] = scores["bpb"]
    return out


def telemetry_metrics(result: dict) -> dict[str, float]:
    """eval.bpb.micro / eval.bpb.macro / eval.bpb.<set> / eval.acc.<task> / eval.acc_norm.<task> /
    eval.gold_bpb.<task> / eval.exact_match.<task> / eval.f1.<task> / eval.pass_at_1.<task>. Results
    written before the bpb tasks named their scores "multiple_choice"."""
    out = {}
    if "bpb" in result:
        out |= {"eval.bpb.micro": result["bpb"]["micro_bpb"], "eval.bpb.macro": result["bpb"]["macro_bpb"]}
        out |= {f"eval.bpb.{name}": v["bpb"] for name, v in result["bpb"]["sets"].items()}
    for task, scores in result.get("tasks", result.get("multiple_choice", {})).items():
        out |= {f"eval.{k}.{task}": scores[k] for k in ("acc", "acc_norm", *GENERATIVE_METRICS) if k in scores}
        if "bpb" in scores:
            out[f"eval.gold_bpb.{task}"] = scores["bpb"]
    return out


def _check_metric_names(bpb_sets: Mapping, tasks: Sequence[str]) -> None:
    for name in [*(f"eval.bpb.{s}" for s in bpb_sets), *(f"eval.acc_norm.{t}" for t in tasks)]:
        validate_segment(name, "telemetry metric name (from an eval set or task name)")
