"""train/demo and eval/demo: one dynamic partition per phase of the run; eval/demo/tasks: one per eval task.

Phases are not planned in advance (Tootsie): the phase controller sensor decides the next
phase, adds its partition and requests a run whose config carries the phase spec and
the content version of the checkpoint it warm-starts from, so a phase's version chains
to its predecessor's. Training writes into the version's scratch directory and resumes
from its newest valid checkpoint after a kill; the artifact: checkpoints, metrics.jsonl, plots.
"""

from __future__ import annotations

import json

import pydantic

from assets.checkpoints import checkpoint_metadata, checkpoints_spec, phase_reporter, warm_start_checkpoint
from assets.datakit.datasets import MIXTURE_KEY, dataset_versions, read_mixture
from assets.partitions import demo_phases
from assets.run_plan import DEMO_PLAN, RUN, TRAIN_KEY
from assets.train_base import PhaseSpecConfig, TrainBaseConfig
from marin_assets.datakit.shards import join
from marin_assets.orchestration import StageContext, png_markdown, versioned, versioned_asset
from marin_assets.orchestration.knob_configs import library_config, stage_config
from marin_assets.orchestration.training_backends import TrainingBackend
from marin_assets.phases.job import base_config, phase_job, phase_mixture, phase_spec
from marin_assets.phases.plan import PhaseSpec, spec_record
from marin_assets.phases.switch import drop_transplanted
from marin_assets.store import ArtifactRef
from marin_assets.store.artifact_files import read_bytes
from marin_assets.store.fsutil import filesystem, is_local
from marin_assets.train.checkpoints.retention import RetentionSettings
from marin_assets.train.metrics import DROP_RATE, read_metrics


def _as_json(value) -> str:
    return json.dumps(value, sort_keys=True)


class PhaseConfig(stage_config("PhaseRetention", (RetentionSettings, {"keep_last": "keep_last_checkpoints"}))):
    phase: PhaseSpecConfig = versioned(PhaseSpecConfig.of(DEMO_PLAN.first), description="the phase chosen by the controller")
    base: TrainBaseConfig = versioned(TrainBaseConfig(), description="base training config of every phase")
    warm_start_version: str = versioned("", description="content version of the warm-start phase")
    attempt: int = versioned(0, description="bumped by a roll-back so the retry draws fresh randomness")
    # Not versioned: where the budget is read from is no part of what the phase computes.
    budget_file: str = pydantic.Field(
        "",
        description="the run's budget file (the phase controller's): a cut ends the "
        "phase at the first permanent checkpoint step it no longer covers; empty: none",
    )

    # These two were JSON strings (sort_keys=True) before they became nested configs: hashing
    # the same text keeps every phase's version.
    version_as = {"phase": lambda phase: _as_json(spec_record(phase)), "base": _as_json}


def _train_metadata(ref: ArtifactRef) -> dict:
    fs, data = filesystem(ref.data_path)
    drawn = {"loss_curve": "Loss curve", "moe_telemetry": "MoE telemetry"}  # <key>.png, when the run drew it
    return {k: png_markdown(t, read_bytes(ref, f"{k}.png")) for k, t in drawn.items() if fs.exists(join(data, f"{k}.png"))}


def _own_sources(config: PhaseConfig) -> list[str] | None:
    """The sources a phase's own mix trains on, or None when it trains on the mixture asset's schedule."""
    if config.phase.mixture is None:
        return None
    return sorted(name for name, weight in config.phase.mixture.items() if weight > 0)


def _version_inputs(config: PhaseConfig, partition: str | None, inputs) -> dict[str, str]:
    """What a phase's data is: the mixture (its schedule and datasets) when the phase trains on
    its schedule; with a mix of its own, only the datasets that mix names, so editing the
    schedule or adding files to another source does not retrain it."""
    own = _own_sources(config)
    if own is None:
        return {MIXTURE_KEY: inputs["mixture"].version}
    return dataset_versions(inputs["mixture"], own)


# 6: the phase reports its checkpoints (checkpoints/demo) and keeps their versions in checkpoint_versions.json.
# 7: tokens_consumed names every dataset the weights saw, an earlier phase's too (carried from the warm start).
# 8: tokens_available names every dataset of the mixture, the ones the phase did not train on too.
# 9: the blockwise attention kernel skips the key blocks a query block cannot see; its key and value
#    gradients sum over query blocks (rounding-level changes where a phase trains on it).
TRAIN_CODE_VERSION = "9"


@versioned_asset(
    key=TRAIN_KEY,
    code_version=TRAIN_CODE_VERSION,
    config_cls=PhaseConfig,
    ins={"mixture": MIXTURE_KEY},
    partitions_def=demo_phases,
    group_name="training",
    extra_metadata=_train_metadata,
    tags={"marin/accelerator": "cpu"},
    resources={"training_backend": TrainingBackend},
    version_inputs=_version_inputs,
)
def train_phase(ctx: StageContext, config: PhaseConfig, mixture: ArtifactRef, training_backend: TrainingBackend):
    """One phase of the run on the ``training_backend`` resource: warm-started from its predecessor, data position kept."""
    schedule, datasets = read_mixture(mixture)
    data_mixture = phase_mixture(config.phase.mixture, schedule)
    spec = phase_spec(config.phase.model_dump(), data_mixture)
    if spec.name != ctx.partition_key:
        raise ValueError(f"phase config names {spec.name!r} but the partition is {ctx.partition_key!r}")
    warm_ref = _warm_start(ctx, spec, config.warm_start_version)
    warm_dir = warm_ref.data_path if warm_ref is not None else None
    job = phase_job(
        spec,
        base_config(config.base.model_dump(), mixture.counts["vocab_size"]),
        data_mixture,
        datasets,
        out_dir=ctx.scratch_dir,
        run=RUN,
        attempt=config.attempt,
        warm_start=warm_dir,
        budget_file=config.budget_file or None,
    )
    warm_key, warm_version = warm_start_checkpoint(warm_dir, config.warm_start_version)
    reporter = phase_reporter(
        ctx, config, spec.name, _version_inputs(config, ctx.partition_key, {"mixture": mixture}), TRAIN_CODE_VERSION, warm_version
    )
    reporter.scan()  # committed by an earlier attempt that did not live to report it: before any newer one
    outcome = training_backend.run_announcing(reporter.context, job, reporter.committed)
    reporter.scan()  # what the backend could not announce (workers behind Pipes report only at the end)
    deleted = reporter.retain(library_config(config, RetentionSettings).keep_last)
    drop_transplanted(ctx.scratch_dir)
    _move_contents(ctx.scratch_dir, ctx.out_dir)  # the finished run becomes the artifact
    ctx.log(
        f"{spec.name}: step {outcome.final_step} on {outcome.backend}, {outcome.tokens:,} tokens in the run, "
        f"last loss {outcome.last_loss}"
    )
    consumed = _tokens_consumed(warm_ref, datasets, job.caches, outcome.tokens_left)
    return {
        "phase": spec.name,
        "backend": outcome.backend,
        "final_step": outcome.final_step,
        "tokens_trained": outcome.tokens,
        "phase_start_step": outcome.phase_start_step,
        "phase_tokens": (outcome.final_step - outcome.phase_start_step) * job.config.tokens_per_step,
        "last_loss": outcome.last_loss,
        **_recent(ctx.out_dir, spec.name, outcome),
        "tokens_consumed": consumed,
        "tokens_available": _tokens_available(datasets, consumed, outcome.tokens_left),
        "guard_events": dict(outcome.counts),
        "steps_reported": len(outcome.metrics),
        "is_cooldown": spec.is_cooldown,
        "stopped_by": outcome.stopped_by or "",
        **checkpoint_metadata(reporter, warm_key),
        "checkpoints_deleted": deleted,
    }


def _warm_start(ctx: StageContext, spec: PhaseSpec, version: str) -> ArtifactRef | None:
    """The artifact of the phase ``spec`` warm-starts from, at the version the controller named (None: a first phase)."""
    if not spec.warm_start_from:
        return None
    ref = ctx.store.load(TRAIN_KEY, spec.warm_start_from, version)
    if ref is None:
        raise FileNotFoundError(f"warm start {spec.warm_start_from!r} version {version[:16]} is not materialised")
    return ref


def _tokens_consumed(warm_ref: ArtifactRef | None, datasets: dict, sources, tokens_left: dict[str, int]) -> dict[str, int]:
    """Tokens the run has taken from each dataset up to this phase's end: this phase's sources from the data
    position, and every dataset only an earlier phase trained on as its warm start reported it (a model card
    lists every dataset the weights saw, not only the last phase's mix)."""
    earlier = dict(warm_ref.counts.get("tokens_consumed") or {}) if warm_ref is not None else {}
    return earlier | {s: datasets[s]["train_tokens"] - tokens_left.get(s, datasets[s]["train_tokens"]) for s in sources}


def _tokens_available(datasets: dict, consumed: dict[str, int], tokens_left: dict[str, int]) -> dict[str, int]:
    """Tokens not yet seen of every dataset of the mixture, not only the phase's: the controller re-warms or cools
    down onto a source this phase did not train on (a user's new files, say) only if it sees that source's data."""
    untrained = {s: max(0, d["train_tokens"] - consumed.get(s, 0)) for s, d in datasets.items() if s not in tokens_left}
    return untrained | dict(tokens_left)


def _move_contents(src: str, dst: str) -> None:
    """Every entry of the scratch dir into the staging dir (same filesystem: the store's)."""
    fs, src_path = filesystem(src)
    if not fs.exists(src_path):
        return
    dst_path = filesystem(dst)[1]
    for entry in fs.ls(src_path, detail=False):
        fs.mv(entry, join(dst_path, entry.rstrip("/").rsplit("/", 1)[-1]), recursive=True)


def _recent(out_dir: str, phase: str, outcome, keep: int = 64) -> dict[str, list[float]]:
    """The phase's last losses and MoE drop rates (rows without the column left out: a dense model has none):
    from the committed metrics.jsonl (it spans resumed attempts), else from the rows the backend reported (a
    worker that wrote its metrics elsewhere)."""
    import tempfile

    fs, path = filesystem(join(out_dir, "metrics.jsonl"))
    if is_local(fs):
        rows = read_metrics(path) or list(outcome.metrics)
    elif fs.exists(path):
        with tempfile.TemporaryDirectory() as tmp:  # one parser (torn last line and all) for every filesystem
            fs.get(path, f"{tmp}/metrics.jsonl")
            rows = read_metrics(f"{tmp}/metrics.jsonl")
    else:
        rows = list(outcome.metrics)
    rows = [r for r in rows if r.get("phase", phase) == phase]
    return {
        name: [r[column] for r in rows if column in r][-keep:]
        for name, column in (("recent_losses", "loss"), ("recent_drop_rates", DROP_RATE))
    }


training_assets = [train_phase, checkpoints_spec]
