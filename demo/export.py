"""The demo's release step: the main run's newest phase exported as a Hugging Face folder (export/demo), one
Dagster run, so the export has its run and its lineage (checkpoints/demo, train/demo, the tokenizer, the mixture)."""

from __future__ import annotations

import dagster as dg

from demo.progress import Execute, run_directly
from demo.sample import newest_main_phase


def _failure(result) -> str:
    """The first step failure's one line (export/demo's dg.Failure says why the model was not exported)."""
    for event in result.all_events:
        if event.is_step_failure:
            data = event.step_failure_data
            message = (data.user_failure_data.description if data.user_failure_data else None) or data.error.message
            return message.strip().splitlines()[0]
    return f"run {result.run_id} failed"


def export_main_run(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    train_key: dg.AssetKey,
    phases: dg.DynamicPartitionsDefinition,
    *,
    execute: Execute = run_directly,
    tags: dict[str, str] | None = None,
) -> dict | None:
    """Materialise export/demo for the main run's newest phase (the one the demo samples): {phase, path (the HF
    folder), layout, step, parameters}, or {phase, error} when the export failed; None when no phase was trained."""
    from assets.export import EXPORT_KEY

    found = newest_main_phase(instance, train_key, phases)
    if found is None:
        return None
    phase = found[0]
    key = dg.AssetKey.from_user_string(EXPORT_KEY)
    job = defs.resolve_implicit_global_asset_job_def()
    result = execute(
        lambda final_tags: job.execute_in_process(
            instance=instance, partition_key=phase, asset_selection=[key], raise_on_error=False, tags=final_tags
        ),
        dict(tags or {}),
    )
    if not result.success:
        return {"phase": phase, "error": _failure(result)}
    [event] = [e for e in result.get_asset_materialization_events() if e.asset_key == key]
    meta = {k: getattr(v, "value", v) for k, v in event.materialization.metadata.items()}
    return {
        "phase": phase,
        "path": f"{meta['path']}/data",
        "layout": meta["count/layout"],
        "step": meta["count/step"],
        "parameters": meta["count/parameters"],
    }
