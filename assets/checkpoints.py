"""checkpoints/demo: one partition per committed checkpoint of the demo run ("<phase>.<step:09d>").

Nothing materialises it: train/demo reports each checkpoint as it commits (an external asset, like a
sensor-reported one), with a version chained to its parent checkpoint (marin_assets/orchestration/
checkpoint_assets.py). What reads a checkpoint depends on it, so an eval's or an export's lineage reaches
its checkpoint and, through train/demo, the mixture, datasets and shards. A warm start cannot be an edge
(checkpoints/demo -> train/demo would close a cycle): the phase records the checkpoint it read as metadata.
"""

from __future__ import annotations

import dagster as dg

from assets.partitions import CHECKPOINT_PARTITIONS, CheckpointsOfPhase, FinalCheckpointOfPhase, demo_checkpoints
from assets.run_plan import CHECKPOINTS_KEY, TRAIN_KEY
from marin_assets.orchestration import StageConfig, StageContext
from marin_assets.orchestration.checkpoint_assets import (
    CheckpointLineage,
    CheckpointReporter,
    config_version,
    final_checkpoint,
)

checkpoints_spec = dg.AssetSpec(
    key=dg.AssetKey(CHECKPOINTS_KEY.split("/")),
    deps=[dg.AssetDep(dg.AssetKey(TRAIN_KEY.split("/")), partition_mapping=CheckpointsOfPhase())],
    partitions_def=demo_checkpoints,
    group_name="checkpoints",
    kinds={"marin"},
    description="Every committed checkpoint of the demo run, one partition <phase>.<step> each, reported by train/demo "
    "as it commits; its data version chains its parent checkpoint's, the phase config's, the data's and the code's.",
)


def final_checkpoint_dep() -> dg.AssetDep:
    """What a phase-partitioned reader of a phase's final checkpoint (eval/demo, export/demo) depends on."""
    return dg.AssetDep(checkpoints_spec.key, partition_mapping=FinalCheckpointOfPhase())


def warm_start_checkpoint(warm_dir: str | None, warm_version: str) -> tuple[str, str]:
    """(partition key, version) of the checkpoint a warm start from ``warm_dir`` (a phase artifact) reads: its
    newest reported one. An artifact that predates checkpoint assets has no record: its phase version stands
    in, so the chain still changes with it. ("", "") for no warm start."""
    if warm_dir is None:
        return "", ""
    found = final_checkpoint(warm_dir)
    return (found[0], found[1]["version"]) if found else ("", f"phase:{warm_version}")


def phase_reporter(
    ctx: StageContext, config: StageConfig, phase: str, data_versions: dict[str, str], code_version: str, warm_version: str
) -> CheckpointReporter:
    """The reporter of one phase version's checkpoints into ``checkpoints/demo``; its config version leaves out
    the warm start's version, which enters through the first checkpoint's parent."""
    if ctx.dagster_context is None:  # only a range run's worker lacks one; a phase is one partition
        raise ValueError(f"phase {phase}: reporting its checkpoints needs the run's Dagster context")
    fields = {k: v for k, v in config.versioned_fields().items() if k != "warm_start_version"}
    lineage = CheckpointLineage(
        CHECKPOINTS_KEY, CHECKPOINT_PARTITIONS, phase, code_version, config_version(fields), data_versions, warm_version
    )
    return CheckpointReporter(ctx.dagster_context, lineage, ctx.scratch_dir)


def checkpoint_metadata(reporter: CheckpointReporter, warm_key: str) -> dict[str, str]:
    """What the phase's materialisation says of its checkpoints: its final one and the one it warm-started from."""
    final = reporter.final()
    return {
        "final_checkpoint": final[0] if final else "",
        "final_checkpoint_version": final[1]["version"] if final else "",
        "warm_start_checkpoint": warm_key,
        "warm_start_checkpoint_version": reporter.lineage.first_parent,
    }
