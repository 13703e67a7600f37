"""A ladder's per-target assets (``assets/scaling.py`` builds the ladder around them): the frozen prediction
of each target, the target's run (a planned config trained here, or the demo's main run scored at its newest
phase), and the judgement of the prediction against the run that the target's page shows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import dagster as dg

from assets.partitions import NewestMainPhase
from assets.scaling_configs import (
    DATA_KEY,
    PredictionConfig,
    SweepConfig,
    ladder_data,
    run_settings,
    target_version,
)
from marin_assets.orchestration import StageContext, png_markdown, versioned_asset
from marin_assets.orchestration.knob_configs import library_config
from marin_assets.scaling.extrapolation import (
    STAMP_KEY,
    as_json,
    compare,
    comparison_png,
    lock_name,
    register_prediction,
    require_frozen,
)
from marin_assets.scaling.ladder import (
    Ladder,
    SweepSettings,
    Target,
)
from marin_assets.scaling.ladder_predict import frozen_candidate, predict_target
from marin_assets.scaling.sweep import held_out_streams
from marin_assets.store import ArtifactRef
from marin_assets.store.artifact_files import read_bytes, read_json, write_file


def prediction_asset(ladder: Ladder, target: Target, prefix: str, common: Mapping[str, Any]) -> dg.AssetsDefinition:
    """``<prefix>/<target>/prediction``: the target's run and loss, registered with the lock as it is written."""

    @versioned_asset(
        key=f"{prefix}/{target.name}/prediction",
        code_version="3",
        config_cls=PredictionConfig,
        ins={"fit": f"{prefix}/fit"},
        **common,
    )
    def prediction(ctx: StageContext, config: PredictionConfig, fit: ArtifactRef):
        """The target's config, N*, D*, loss and seed interval, frozen by the experiment-record lock as it is written."""
        settings = library_config(config.sweep, SweepSettings, max_width=config.max_width)
        out = as_json(predict_target(read_json(fit, "fit.json"), ladder, target, settings))
        write_file(ctx.out_dir, "prediction.json", json.dumps(out, indent=1))
        stamp = register_prediction(ctx.store, lock_name(ladder.name, target.name, ctx.version), out)
        interval = out["interval"] or {}
        ctx.log(
            f"prediction {ladder.name}/{target.name} at C={out['budget']:.3g}: width {out['config']['width']}, "
            f"loss {out['loss']:.4f} [{interval.get('low', float('nan')):.4f}, {interval.get('high', float('nan')):.4f}], "
            f"registered as {stamp['experiment']}"
        )
        if out["off_optimum"]["extrapolated"]:
            ctx.log(
                f"prediction {ladder.name}/{target.name}: its model is {out['off_optimum']['decades']:+.2f} decades off N*, "
                f"past the ladder's runs ({out['off_optimum']['ladder_reach_decades']:.2f}): the off-optimum rise is "
                f"extrapolated, so this prediction is weaker than its interval says"
            )
        return {
            "budget": out["budget"],
            "loss": out["loss"],
            "width": out["config"]["width"],
            "params": out["config"]["params"],
            "params_opt": out["params_opt"],
            "lock": stamp["experiment"],
            "frozen_hash": stamp["frozen_hash"],
            "off_optimum_decades": out["off_optimum"]["decades"],
            "off_optimum_extrapolated": out["off_optimum"]["extrapolated"],
        }

    return prediction


def judged_prediction(ladder: Ladder, target: Target, pred: Mapping[str, Any], counts: Mapping[str, Any], out_dir: str) -> dict:
    """The target's frozen prediction against its run, as the target asset's own metadata (what a reviewer
    looks for on its page): predicted loss, its interval, the relative error against the ladder's bound, and
    ``comparison.png`` (the ladder's optima and law, the prediction with its interval, the actual)."""
    out = compare({target.name: pred}, {target.name: dict(counts)}, ladder.max_relative_error)
    (row,) = out["rows"]
    write_file(out_dir, "comparison.png", comparison_png(out, {target.name: pred}))
    interval = row["run_interval"] or {}
    return {
        "predicted": row["predicted"],
        "relative_error": row["relative_error"],
        "bound": out["bound"],
        "within_bound": bool(out["passed"]),
        "interval_low": interval.get("low"),
        "interval_high": interval.get("high"),
        "actual_in_interval": row["actual_in_interval"],
    }


def _target_metadata(ref: ArtifactRef) -> dict:
    return {"predicted_vs_actual": png_markdown("Predicted before the run vs actual", read_bytes(ref, "comparison.png"))}


def target_asset(ladder: Ladder, target: Target, prefix: str, common: Mapping[str, Any], train_fn) -> dg.AssetsDefinition:
    """``<prefix>/<target>/target``: the predicted run; it refuses to start without its frozen prediction."""

    # 4: the frozen prediction judged against the run is the asset's metadata (judged_prediction).
    # 5: the blockwise kernel's gradients (see TRAIN_CODE_VERSION 9).
    @versioned_asset(
        key=f"{prefix}/{target.name}/target",
        code_version="5",
        config_cls=SweepConfig,
        ins={"prediction": f"{prefix}/{target.name}/prediction", "mixture": DATA_KEY},
        version_inputs=target_version,
        **common,
        extra_metadata=lambda ref: {
            "loss_curve": dg.MetadataValue.path(f"{ref.data_path}/loss_curve.png"),
            **_target_metadata(ref),
        },
    )
    def target_run(ctx: StageContext, config: SweepConfig, prediction: ArtifactRef, mixture: ArtifactRef):
        """The predicted run, trained only once its prediction is frozen; it carries the prediction's hash."""
        pred = read_json(prediction, "prediction.json")
        stamp = require_frozen(ctx.store, lock_name(ladder.name, target.name, prediction.version), pred)
        settings = run_settings(config, mixture)
        cand = frozen_candidate(pred, settings)
        datasets, _ = ladder_data(mixture)
        counts = train_fn(
            cand,
            settings,
            datasets,
            held_out_streams(datasets),
            ctx.out_dir,
            run_name=f"target-{ladder.name}-{target.name}",
            seed=settings.seed,
            log=ctx.log,
            record={STAMP_KEY: stamp, "target": target.name},
        )
        return dict(counts) | stamp | judged_prediction(ladder, target, pred, counts, ctx.out_dir)

    return target_run


def main_run_asset(ladder: Ladder, target: Target, prefix: str, common: Mapping[str, Any], score_fn) -> dg.AssetsDefinition:
    """``<prefix>/<target>/target`` of a target the ladder does not train: the run ``target.observed``
    (its newest main-run phase, not a branch: the run's end), scored as the ladder's runs are, against its frozen
    prediction."""
    observed = str(target.observed)  # set: only observed targets get this asset
    observed_key = dg.AssetKey(observed.split("/"))
    newest = dg.AssetIn(key=observed_key, partition_mapping=NewestMainPhase(materialised=observed_key))

    # 3: the frozen prediction judged against the run is the asset's metadata (judged_prediction).
    @versioned_asset(
        key=f"{prefix}/{target.name}/target",
        code_version="3",
        config_cls=SweepConfig,
        ins={"prediction": f"{prefix}/{target.name}/prediction", "mixture": DATA_KEY, "run": newest},
        **common,
        extra_metadata=_target_metadata,
    )
    def main_run(
        ctx: StageContext, config: SweepConfig, prediction: ArtifactRef, mixture: ArtifactRef, run: Mapping[str, ArtifactRef]
    ):
        """The main run's final loss on the ladder's held-out windows; refused without its frozen prediction."""
        pred = read_json(prediction, "prediction.json")
        stamp = require_frozen(ctx.store, lock_name(ladder.name, target.name, prediction.version), pred)
        ((phase, ref),) = run.items()
        record = {STAMP_KEY: stamp, "target": target.name, "run": observed, "phase": phase, "version": ref.version}
        counts = score_fn(
            ref.data_path,
            run_settings(config, mixture),
            held_out_streams(ladder_data(mixture)[0]),
            int(ref.counts["tokens_trained"]),
            ctx.out_dir,
            record=record,
        )
        ctx.log(
            f"{prefix}/{target.name}: {observed}[{phase}] after {counts['tokens']:,} tokens: validation loss "
            f"{counts['validation_loss']:.4f} (predicted {pred['loss']:.4f} before it ran)"
        )
        return counts | stamp | {"phase": phase} | judged_prediction(ladder, target, pred, counts, ctx.out_dir)

    return main_run
