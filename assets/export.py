"""export/demo: a phase's final checkpoint as a Hugging Face model folder, one partition per phase, on request.

It reads the phase's final checkpoint (through the phase artifact, whose newest checkpoint it is) and depends on
checkpoints/demo for it, so its lineage reaches the checkpoint and, through train/demo, the data. The model card
names the datasets (their versions and the tokens taken from each), the tokens trained, the checkpoint and, read
from the store when the export runs, the scores that were taken of exactly this phase artifact: eval/demo's results
and, when a ladder's observed target scored it, the frozen prediction and its outcome. Those are not inputs (an
input would make every export wait for the ladder; the eval as an input left the export node out of the UI's
lineage graph, tests/e2e/test_ui.py), so they do not enter the export's version: export after scoring, as
`make demo` does. Not
automated: an export is a release step, asked for in the UI or a job; `make demo` asks for it once, for the main
run's newest phase (demo/export.py). The demo's model is Qwen3-MoE-shaped (assets/run_plan.py DEMO_BASE["model"]), so
it maps exactly onto the qwen3_moe layout. A model with no exact HF layout (e.g. our own MoE: sigmoid routing, a
shared expert, a quantile balancing bias) fails the step with export_hf's one-line reason.
"""

from __future__ import annotations

import dagster as dg

from assets.checkpoints import final_checkpoint_dep
from assets.datakit.datasets import MIXTURE_KEY, read_mixture
from assets.evals import EVAL_KEY
from assets.partitions import demo_phases
from assets.run_plan import RUN, TRAIN_KEY
from assets.scaling_ladders import MOE_LADDER
from assets.training import TRAIN_CODE_VERSION
from marin_assets.datakit.shards import join
from marin_assets.orchestration import StageConfig, StageContext, versioned, versioned_asset
from marin_assets.store import ArtifactRef, ArtifactStore
from marin_assets.store.artifact_files import read_json
from marin_assets.store.fsutil import read_json as read_json_file

EXPORT_KEY = f"export/{RUN}"


class ExportConfig(StageConfig):
    # export_hf checks it (marin_assets.hf.LAYOUTS; importing that here would load JAX into the code location).
    layout: str = versioned(
        "auto", description="the HF layout: llama, qwen3, mixtral, qwen3_moe or auto (the one the model maps to)"
    )


def model_card_lineage(phase: ArtifactRef, mixture: ArtifactRef, store: ArtifactStore) -> dict:
    """The card's lineage (marin_assets/hf/card.py's schema): the phase's counts, the mixture's datasets, the
    phase's eval results and the frozen prediction that scored this phase, if one did."""
    _, datasets = read_mixture(mixture)
    consumed = phase.counts.get("tokens_consumed") or {}
    prediction = scored_prediction(store, phase)
    return {
        "run": RUN,
        "phase": str(phase.counts.get("phase", phase.partition)),
        "code_version": TRAIN_CODE_VERSION,
        "datasets": [
            {"name": name, "version": datasets[name]["version"], "tokens": int(consumed[name])}
            for name in sorted(consumed)
            if name in datasets
        ],
        **({"tokens": int(phase.counts["tokens_trained"])} if "tokens_trained" in phase.counts else {}),
        "evals": eval_results(store, phase),
        **({"prediction": prediction} if prediction else {}),
    }


def eval_results(store: ArtifactStore, phase: ArtifactRef) -> dict[str, float]:
    """The newest eval/<run> scores of exactly this phase artifact (bits-per-byte per domain, micro and macro, task
    accuracies; not its document counts), or {} when none was taken."""
    evals = store.read_pointer(EVAL_KEY, phase.partition)
    if evals is None:
        return {}
    scored = read_json_file(store.fs, join(evals.path, "provenance.json")) or {}
    if scored.get("version_payload", {}).get("upstream", {}).get(f"{TRAIN_KEY}[{phase.partition}]") != phase.version:
        return {}
    return {
        k: float(v)
        for k, v in evals.counts.items()
        if not k.startswith("docs/") and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def scored_prediction(store: ArtifactStore, phase: ArtifactRef) -> dict | None:
    """The frozen prediction and its outcome from the newest score of a ladder target observing this run, when that
    score read exactly ``phase`` (its run.json names the phase artifact's version); None otherwise."""
    for target in MOE_LADDER.targets:
        if target.observed != TRAIN_KEY:
            continue
        prefix = f"scaling/{MOE_LADDER.name}/{target.name}"
        scored, frozen = store.read_pointer(f"{prefix}/target", None), store.read_pointer(f"{prefix}/prediction", None)
        if scored is None or frozen is None or frozen.counts.get("frozen_hash") != scored.counts.get("frozen_hash"):
            continue
        if read_json(scored, "run.json").get("version") != phase.version:
            continue
        interval = read_json(frozen, "prediction.json").get("interval") or {}
        bounds = [interval.get("low"), interval.get("high")]  # a prediction may carry no interval
        return {
            "metric": "validation loss (mean over the ladder's held-out domains)",
            "predicted": float(frozen.counts["loss"]),
            "outcome": float(scored.counts["validation_loss"]),
            "lock": f"{scored.counts['experiment']} (hash {scored.counts['frozen_hash'][:16]})",
            **({"interval": bounds} if None not in bounds else {}),
        }
    return None


@versioned_asset(
    key=EXPORT_KEY,
    code_version="2",  # 2: the card carries the eval results and the scored prediction
    config_cls=ExportConfig,
    ins={"phase": TRAIN_KEY, "tok": "tokenizer", "mixture": MIXTURE_KEY},
    deps=[final_checkpoint_dep()],
    partitions_def=demo_phases,
    group_name="models",
)
def export_phase(ctx: StageContext, config: ExportConfig, phase: ArtifactRef, tok: ArtifactRef, mixture: ArtifactRef):
    """The phase's final checkpoint as a Hugging Face model folder (config.json, safetensors, tokenizer, model card)."""
    from marin_assets.hf import export_hf

    lineage = model_card_lineage(phase, mixture, ctx.store)
    try:
        result = export_hf(
            phase.data_path, ctx.out_dir, config.layout, tokenizer=join(tok.data_path, "tokenizer.json"), lineage=lineage
        )
    except ValueError as refused:  # NotExportable and every other refusal: one line naming the field
        raise dg.Failure(f"{EXPORT_KEY} {ctx.partition}: not exported: {refused}", allow_retries=False) from None
    return {
        "phase": lineage["phase"],
        "checkpoint": str(phase.counts.get("final_checkpoint", "")),
        "layout": result["layout"],
        "step": result["step"],
        "parameters": result["parameters"],
        "files": len(result["files"]),
    }


export_assets = [export_phase]
