"""export/demo: a phase's final checkpoint as a Hugging Face model folder, one partition per phase, on request.

It reads the phase's final checkpoint (through the phase artifact, whose newest checkpoint it is) and depends on
checkpoints/demo for it, so its lineage reaches the checkpoint and, through train/demo, the data. The model card
names the datasets (their versions and the tokens taken from each), the tokens trained and the checkpoint. Not
automated: an export is a release step, asked for in the UI or a job; `make demo` asks for it once, for the main
run's newest phase (demo/export.py). The demo's model is Qwen3-MoE-shaped (assets/train_base.py ModelShapeConfig), so
it maps exactly onto the qwen3_moe layout. A model with no exact HF layout (e.g. our own MoE: sigmoid routing, a
shared expert, a quantile balancing bias) fails the step with export_hf's one-line reason.
"""

from __future__ import annotations

import dagster as dg

from assets.checkpoints import final_checkpoint_dep
from assets.datakit.datasets import MIXTURE_KEY, read_mixture
from assets.partitions import demo_phases
from assets.run_plan import RUN, TRAIN_KEY
from assets.training import TRAIN_CODE_VERSION
from marin_assets.datakit.shards import join
from marin_assets.orchestration import StageConfig, StageContext, versioned, versioned_asset
from marin_assets.store import ArtifactRef

EXPORT_KEY = f"export/{RUN}"


class ExportConfig(StageConfig):
    # export_hf checks it (marin_assets.hf.LAYOUTS; importing that here would load JAX into the code location).
    layout: str = versioned(
        "auto", description="the HF layout: llama, qwen3, mixtral, qwen3_moe or auto (the one the model maps to)"
    )


def model_card_lineage(phase: ArtifactRef, mixture: ArtifactRef) -> dict:
    """The card's lineage (marin_assets/hf/card.py's schema) from the phase's counts and the mixture's datasets."""
    _, datasets = read_mixture(mixture)
    consumed = phase.counts.get("tokens_consumed") or {}
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
    }


@versioned_asset(
    key=EXPORT_KEY,
    code_version="1",
    config_cls=ExportConfig,
    ins={"phase": TRAIN_KEY, "tok": "tokenizer", "mixture": MIXTURE_KEY},
    deps=[final_checkpoint_dep()],
    partitions_def=demo_phases,
    group_name="models",
)
def export_phase(ctx: StageContext, config: ExportConfig, phase: ArtifactRef, tok: ArtifactRef, mixture: ArtifactRef):
    """The phase's final checkpoint as a Hugging Face model folder (config.json, safetensors, tokenizer, model card)."""
    from marin_assets.hf import export_hf

    lineage = model_card_lineage(phase, mixture)
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
