"""train/demo and eval/demo: one dynamic partition per phase of the run.

Phases are not planned in advance (Tootsie): the phase controller sensor decides the next
phase, adds its partition and requests a run whose config carries the phase spec and
the content version of the checkpoint it warm-starts from, so a phase's version chains
to its predecessor's. Training writes into the version's scratch directory and resumes
from its newest valid checkpoint after a kill; the committed artifact holds the
checkpoints, metrics.jsonl and the loss-curve PNG.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Optional

import dagster as dg

from assets.partitions import demo_phases
from marin_assets.datakit.shards import join, list_shards, read_table
from marin_assets.datakit.tokenize import is_validation
from marin_assets.orchestration import StageConfig, StageContext, png_markdown, versioned, versioned_asset
from marin_assets.phases.plan import PhasePlan, PhaseSpec, phase_train_config
from marin_assets.store import ArtifactRef

RUN = "demo"
TRAIN_KEY = f"train/{RUN}"
EVAL_KEY = f"eval/{RUN}"

DEMO_PLAN = PhasePlan(
    run=RUN,
    first=PhaseSpec(name="kestrel", warm_start_from=None, schedule="wsd", mixture={"sotu": 0.3, "shakespeare": 0.2, "spam_assassin": 0.5},
                    batch_size=8, hardware="cpu", token_budget=48 * 512, peak_lr=0.003),
    phase_names=("kestrel", "jellyfish", "phoenix", "starling", "heron", "ibis"),
    high_quality_sources=("sotu", "shakespeare"),
    cooldown_hq_fraction=0.3,
    cooldown_tokens=16 * 512,
    min_cooldown_tokens=4 * 512,
    low_data_tokens=12_288,
    rewarm_mixture={"sotu": 0.5, "shakespeare": 0.5},
    rewarm_tokens=32 * 512,
)


class PhaseSpecConfig(dg.Config):
    """A ``PhaseSpec`` (marin_assets/phases/plan.py), chosen by the controller for each phase."""

    name: str
    warm_start_from: Optional[str] = None
    schedule: str
    mixture: dict[str, float]
    batch_size: int
    hardware: str
    token_budget: int
    peak_lr: float
    is_cooldown: bool = False
    z_loss: Optional[float] = None
    warmup_start_fraction: float = 0.0
    start_fraction: float = 1.0

    @classmethod
    def of(cls, spec: PhaseSpec) -> PhaseSpecConfig:
        return cls(**dataclasses.asdict(spec))

    def to_spec(self) -> PhaseSpec:
        return PhaseSpec(**self.model_dump())  # PhaseSpec validates the values


# A tiny MoE that trains a phase in well under a minute on CPU (tokens/step = 8 x 64).
class ModelShapeConfig(dg.Config):
    vocab_size: int = 4096
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    d_ff: int = 128
    n_routed_experts: int = 4
    n_shared_experts: int = 1
    top_k: int = 2
    expert_d_ff: int = 64
    max_seq_len: int = 64


class OptimizerBaseConfig(dg.Config):
    name: str = "adamw"
    weight_decay: float = 0.1


class ScheduleBaseConfig(dg.Config):
    kind: str = "wsd"
    peak_lr: float = 0.003
    warmup_steps: int = 8
    decay_steps: int = 8


class TrainBaseConfig(dg.Config):
    """The TrainConfig (marin_assets/train/config.py) every phase starts from."""

    model: ModelShapeConfig = ModelShapeConfig()
    optimizer: OptimizerBaseConfig = OptimizerBaseConfig()
    schedule: ScheduleBaseConfig = ScheduleBaseConfig()
    seq_len: int = 64
    batch_size: int = 8
    num_steps: int = 48
    checkpoint_every_steps: int = 16
    checkpoint_every_seconds: float = 60.0


def _as_json(value) -> str:
    return json.dumps(value, sort_keys=True)


class PhaseConfig(StageConfig):
    phase: PhaseSpecConfig = versioned(PhaseSpecConfig.of(DEMO_PLAN.first), description="the phase chosen by the controller")
    base: TrainBaseConfig = versioned(TrainBaseConfig(), description="base training config of every phase")
    warm_start_version: str = versioned("", description="content version of the warm-start phase")
    attempt: int = versioned(0, description="bumped by a roll-back so the retry draws fresh randomness")

    # These two were JSON strings (sort_keys=True) before they became nested configs: hashing
    # the same text keeps every phase's version.
    version_as = {"phase": _as_json, "base": _as_json}


def _train_metadata(ref: ArtifactRef) -> dict:
    png = Path(ref.data_path, "loss_curve.png")
    return {"loss_curve": png_markdown("Loss curve", png.read_bytes())} if png.exists() else {}


@versioned_asset(key=TRAIN_KEY, code_version="1", config_cls=PhaseConfig, ins={"caches": "tokenized"}, partitions_def=demo_phases,
                 group_name="training", extra_metadata=_train_metadata, tags={"marin/accelerator": "cpu"})
def train_phase(ctx: StageContext, config: PhaseConfig, caches: ArtifactRef):
    """One phase of the run: warm-started from its predecessor, data position kept."""
    from marin_assets.train.config import config_from_dict
    from marin_assets.train.loop import train
    from marin_assets.train.metrics import read_metrics

    spec = config.phase.to_spec()
    if spec.name != ctx.partition_key:
        raise ValueError(f"phase config names {spec.name!r} but the partition is {ctx.partition_key!r}")
    train_config = phase_train_config(config_from_dict(config.base.model_dump(), "base"), spec)
    train_config = dataclasses.replace(train_config, seed=train_config.seed + config.attempt, data_seed=train_config.data_seed)
    cache_tokens = caches.counts["tokens"]
    cache_dirs = {s: join(caches.data_path, s, "train") for s in spec.mixture if s in cache_tokens}
    warm = None
    if spec.warm_start_from:
        warm_ref = ctx.store.load(TRAIN_KEY, spec.warm_start_from, config.warm_start_version)
        if warm_ref is None:
            raise FileNotFoundError(f"warm start {spec.warm_start_from!r} version {config.warm_start_version[:16]} is not materialised")
        warm = warm_ref.data_path
    result = train(train_config, cache_dirs, ctx.scratch_dir, resume=True, warm_start=warm,
                   log_fn=lambda row: row["step"] % 16 == 0 and ctx.log(f"{spec.name} step {row['step']}: loss {row['loss']:.4f}"))
    for name in os.listdir(ctx.scratch_dir):  # the finished run becomes the artifact
        shutil.move(os.path.join(ctx.scratch_dir, name), os.path.join(ctx.out_dir, name))
    losses = [r["loss"] for r in read_metrics(Path(ctx.out_dir, "metrics.jsonl")) if r.get("phase") == spec.name][-64:]
    consumed = {s: cache_tokens[s]["train"] - result.tokens_left.get(s, cache_tokens[s]["train"]) for s in cache_dirs}
    ctx.log(f"{spec.name}: step {result.final_step}, {result.tokens:,} tokens in the run, last loss {result.last_loss}")
    return {
        "phase": spec.name, "final_step": result.final_step, "tokens_trained": result.tokens,
        "phase_tokens": (result.final_step - result.phase_start_step) * train_config.tokens_per_step,
        "last_loss": result.last_loss, "recent_losses": losses, "tokens_consumed": consumed,
        "tokens_available": dict(result.tokens_left), "guard_events": dict(result.counts), "is_cooldown": spec.is_cooldown,
    }


class EvalConfig(StageConfig):
    tasks: list[str] = versioned(["hellaswag", "arc_easy"])
    limit: int = versioned(40, description="multiple-choice items per task")
    docs_per_source: int = versioned(8, description="held-out documents per source for bits-per-byte")


@versioned_asset(key=EVAL_KEY, code_version="1", config_cls=EvalConfig, ins={"ckpt": TRAIN_KEY, "tok": "tokenizer", "docs": "final_documents", "caches": "tokenized"},
                 partitions_def=demo_phases, group_name="training")
def eval_phase(ctx: StageContext, config: EvalConfig, ckpt: ArtifactRef, tok: ArtifactRef, docs: ArtifactRef, caches: ArtifactRef):
    """Bits-per-byte per held-out source (micro/macro) and multiple-choice accuracy."""
    from marin_assets.datakit.tokenize import load_tokenizer
    from marin_assets.evaluation.run import evaluate

    tokenizer = load_tokenizer(join(tok.data_path, "tokenizer.json"))
    held_out = _held_out_texts(docs, caches.counts["validation_fraction"], config.docs_per_source)
    result = evaluate(ckpt.data_path, bpb_sets=held_out, tasks=config.tasks, limit=config.limit,
                      encode=lambda text: tokenizer.encode(text, add_special_tokens=False).ids,
                      bos_id=tokenizer.token_to_id("<|endoftext|>") or 0, out_path=join(ctx.out_dir, "eval.json"))
    bpb = result["bpb"]
    return {"micro_bpb": bpb["micro_bpb"], "macro_bpb": bpb["macro_bpb"],
            **{f"bpb/{s}": v["bpb"] for s, v in bpb["sets"].items()},
            **{f"acc/{t}": v["acc"] for t, v in result["multiple_choice"].items()},
            **{f"acc_norm/{t}": v["acc_norm"] for t, v in result["multiple_choice"].items()}}


def _held_out_texts(docs: ArtifactRef, fraction: float, per_source: int) -> dict[str, list[str]]:
    """The validation split's documents (same id rule as tokenize), a few per source."""
    sets: dict[str, list[str]] = {}
    for path in list_shards(docs.data_path):
        table = read_table(path, columns=["id", "text", "source"])
        for doc_id, text, source in zip(*(table.column(c).to_pylist() for c in ("id", "text", "source"))):
            if is_validation(doc_id, fraction) and len(sets.setdefault(source, [])) < per_source:
                sets[source].append(text[:4000])
    return sets


training_assets = [train_phase, eval_phase]
