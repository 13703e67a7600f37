"""eval/demo and eval/demo/tasks: what each phase of the run scores. eval/demo shares the phase's partition
(the phase controller requests train + eval under one phase key); eval/demo/tasks has a partition per task of
the suite, scored on the newest main phase."""

from __future__ import annotations

import dagster as dg

from assets.checkpoints import final_checkpoint_dep
from assets.datakit.datasets import MIXTURE_KEY, read_mixture
from assets.partitions import NewestMainPhase, demo_phases
from assets.run_plan import CHECKPOINTS_KEY, RUN, TRAIN_KEY
from marin_assets.datakit.eval_sets import TASK_NAMES
from marin_assets.datakit.shards import join
from marin_assets.datakit.tokenize import load_encoder
from marin_assets.evaluation.run import EvalSettings, evaluate, held_out_domains, result_metadata
from marin_assets.orchestration import StageContext, versioned_asset
from marin_assets.orchestration.knob_configs import library_config, stage_config
from marin_assets.store import ArtifactRef

EVAL_KEY = f"eval/{RUN}"
TASKS_KEY = f"eval/{RUN}/tasks"


class EvalConfig(stage_config("EvalConfig", (EvalSettings, ["tasks", "limit", "docs_per_source", "chars_per_doc"]))):
    """What eval/<run> scores: the knobs of marin_assets.evaluation.run.EvalSettings (one declaration each)."""


@versioned_asset(
    key=EVAL_KEY,
    code_version="5",
    config_cls=EvalConfig,
    ins={"ckpt": TRAIN_KEY, "tok": "tokenizer", "mixture": MIXTURE_KEY},
    partitions_def=demo_phases,
    group_name="training",
    deps=[final_checkpoint_dep()],
)
def eval_phase(ctx: StageContext, config: EvalConfig, ckpt: ArtifactRef, tok: ArtifactRef, mixture: ArtifactRef):
    """Bits-per-byte per held-out domain (every source of the mixture, Paloma-style; micro and macro) and any
    tasks the config names (the task suite has its own partitions: eval/<run>/tasks)."""

    settings = library_config(config, EvalSettings)  # its checks run here
    encoder = load_encoder(join(tok.data_path, "tokenizer.json"))
    _, datasets = read_mixture(mixture)
    domains = held_out_domains({s: d["index"] for s, d in datasets.items() if d["validation_tokens"] > 0}, settings)
    result = evaluate(
        ckpt.data_path,
        bpb_sets=domains,
        tasks=settings.tasks,
        limit=settings.limit,
        encode=encoder.encode,
        bos_id=encoder.eos_id,
        batch_size=settings.batch_size,
        out_path=join(ctx.out_dir, "eval.json"),
    )
    return result_metadata(result)


# One static partition per task of the suite (marin_assets.datakit.eval_sets.TASKS), scoring the run's newest main
# phase (NewestMainPhase, never a branch): a phase x task MultiPartitionsDefinition would name partitions "kestrel|copa",
# which the store refuses, and the phase controller requests train + eval/<run> under one phase key. Scored on
# request (the UI, a job, `marin eval score`), not by automation: the full suite is ~10 CPU-minutes per phase
# here (measured: 606 s for 42 tasks), too much to start behind a user's back; the store keeps each phase's
# scores as older versions.
class TaskEvalConfig(stage_config("TaskEvalConfig", (EvalSettings, ["limit"]))):
    """How much of its task an eval/<run>/tasks partition scores (default: all of it)."""


@versioned_asset(
    key=TASKS_KEY,
    code_version="2",
    config_cls=TaskEvalConfig,
    ins={
        "ckpt": dg.AssetIn(
            key=dg.AssetKey(TRAIN_KEY.split("/")),
            partition_mapping=NewestMainPhase(materialised=dg.AssetKey(TRAIN_KEY.split("/"))),
        ),
        "tok": "tokenizer",
    },
    deps=[dg.AssetDep(dg.AssetKey(CHECKPOINTS_KEY.split("/")), partition_mapping=NewestMainPhase())],
    partitions_def=dg.StaticPartitionsDefinition(TASK_NAMES),
    group_name="evaluation",
)
def eval_task(ctx: StageContext, config: TaskEvalConfig, ckpt: dict[str, ArtifactRef], tok: ArtifactRef):
    """One eval task (the partition) at its full size on the run's newest main phase: accuracy and length-normalised
    accuracy (multiple choice), bits-per-byte of the gold answers."""

    settings, name, ((phase, ref),) = library_config(config, EvalSettings), str(ctx.partition_key), ckpt.items()
    encoder = load_encoder(join(tok.data_path, "tokenizer.json"))
    result = evaluate(
        ref.data_path,
        tasks=[name],
        limit=settings.limit,
        encode=encoder.encode,
        bos_id=encoder.eos_id,
        batch_size=settings.batch_size,
        out_path=join(ctx.out_dir, "eval.json"),
    )
    return {"task": name, "phase": phase, "step": result["step"], **result["tasks"][name]}


eval_assets = [eval_phase, eval_task]
