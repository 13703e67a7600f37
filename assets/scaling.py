"""Scaling laws as assets: an IsoFLOP ladder of tiny runs, the fit, the prediction, its check.

    mixture (the DataKit's datasets: shard caches read in place)
    -> sweep[C<budget>-d<width>]            (one training run per partition)
              -> scaling_fit                (IsoFLOP fit on the smaller budgets only)
              -> prediction                 (optimal config and loss at the largest budget)
              -> check prediction_error     (vs the best sweep run actually at that budget)

Partitions: a ``MultiPartitionsDefinition`` would name a partition "C1e11|d32", and the
artifact store refuses "|" in a path segment, so the ladder is one static partition set
with keys ``C<budget>-d<width>`` (e.g. ``C2e11-d48``). That also lets each budget carry its
own widths, as in Marin's IsoFLOP sweeps, where the window of sizes moves up with compute.

``scaling_fit`` depends only on the partitions of the budgets it fits (a
``SpecificPartitionsPartitionMapping``), so the prediction can be made - and versioned -
before the largest budget's runs exist; the check reads those runs from the store once
they are there.

The ladder trains on the datasets the main run trains on (uniformly over the mixture's
sources) and scores on their held-out splits. The code location's DataKit tokenizes bytes: a
tokenizer with a large vocabulary makes the LM head most of a tiny model's FLOPs (with a
4096-token BPE the narrowest model won every CPU-sized budget: no interior optimum).

The ladder's shape and the fit/prediction logic live in ``marin_assets.scaling.ladder``;
``build_scaling_assets(ladder)`` wraps them as assets, and the module-level
``scaling_assets`` / ``scaling_checks`` are the demo's CPU ladder (``DEMO_LADDER``).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Mapping

import dagster as dg

from assets.datakit.datasets import dataset_versions, weighted_sources
from marin_assets.datakit.mixture import read_mixture_file
from marin_assets.orchestration import ArtifactStoreResource, StageConfig, StageContext, png_markdown, versioned, versioned_asset
from marin_assets.orchestration.knob_configs import library_config, stage_config
from marin_assets.scaling.fits import IsoFlopConfig
from marin_assets.scaling.ladder import (Ladder, SweepSettings, check_prediction, fit_ladder, predict_at, predicted_vs_actual_png,
                                         read_bytes, read_json, select_budgets, write_file)
from marin_assets.scaling.sweep import held_out_streams, parse_partition_key, run_sweep_point
from marin_assets.store import ArtifactRef

SCALING_GROUP = "scaling"

# Tiny dense 1-layer models (seq 64, head 8, batch 16, peak LR 1e-2) on the mixture's datasets
# (byte tokens, vocabulary 257): 3 budgets a factor 2 apart, widths a factor 2 apart, fitted on
# the first 2 and extrapolated 2x to the third. Measured (demo run, 2 workers): validation
# loss d8/d16/d32 = 2.491/2.429/2.713 at 2e10 and 2.427/2.305/2.665 at 4e10 (interior
# vertices); predicted 2.182 at 8e10 vs the best actual 2.204 (d16): -0.97%. A 1e10 rung
# (2.542/2.648/2.834) had its optimum below the narrowest width, so the fit excluded it: it
# cost a third of the ladder's compute for nothing and is gone.
DEMO_LADDER = Ladder(
    budgets=(2e10, 4e10, 8e10),
    widths=((8, 16, 32),) * 3,
)


# The configs are generated from the library's knobs (marin_assets/knobs.py): one declaration of each default.
# (A class over the generated one, so type checkers see a class.)
class SweepConfig(stage_config("SweepConfig", (SweepSettings, [
        "vocab_size", "seq_len", "head_dim", "aspect_ratio", "batch_sizes", "min_steps", "tolerance", "lr_base",
        "lr_ref_width", "decay_fraction", "skip_sigma", "seed", "validation_windows"]))):
    """One sweep run's settings: knobs of marin_assets.scaling.ladder.SweepSettings."""


class _FitSelection(StageConfig):
    fit_budgets: list[str] = versioned([], description="budget labels (e.g. '1e11') to fit; [] = every budget the fit reads")


class FitConfig(stage_config("FitConfig", (IsoFlopConfig, ["huber_delta", "bucket_base", "bootstrap_n"]), base=_FitSelection)):
    """Which budgets to fit, and the knobs of marin_assets.scaling.fits.IsoFlopConfig."""


class _PredictionFamily(StageConfig):
    sweep: SweepConfig = versioned(SweepConfig(), description="the family to pick the predicted config from")


class PredictionConfig(stage_config("PredictionConfig", (SweepSettings, ["max_width"]), base=_PredictionFamily)):
    """The sweep's family and SweepSettings.max_width, the widest member the prediction may pick."""


def ladder_data(mixture: ArtifactRef) -> tuple[dict[str, str], int]:
    """({source: dataset index} of the sources the mixture gives weight, the tokenizer's vocabulary)."""
    _, datasets = read_mixture_file(mixture.data_path)
    return {s: datasets[s]["index"] for s in weighted_sources(mixture)}, int(mixture.counts["vocab_size"])


def _sweep_version(config, partition: str | None, inputs) -> dict[str, str]:
    """A sweep run reads the datasets the mixture weights (uniformly): their versions, not the
    schedule's weights or the other datasets', version it."""
    return dataset_versions(inputs["mixture"], weighted_sources(inputs["mixture"]))


def build_scaling_assets(ladder: Ladder = DEMO_LADDER, *, data_key: str = "mixture",
                         automation_condition: dg.AutomationCondition | None = None, run_fn=None):
    """(assets, checks) for one ladder: sweep, scaling_fit, prediction and prediction_error.

    ``run_fn`` has ``run_sweep_point``'s signature and returns its counts (at least params,
    tokens, flops, validation_loss, vocab_size); tests pass a known law to check the fit path.
    """
    run_fn = run_fn or run_sweep_point
    common = dict(group_name=SCALING_GROUP, automation_condition=automation_condition)

    @versioned_asset(key="sweep", code_version="2", config_cls=SweepConfig, ins={"mixture": data_key}, version_inputs=_sweep_version,
                     partitions_def=dg.StaticPartitionsDefinition(ladder.keys()), **common,
                     extra_metadata=lambda ref: {"loss_curve": dg.MetadataValue.path(f"{ref.data_path}/loss_curve.png")})
    def sweep(ctx: StageContext, config: SweepConfig, mixture: ArtifactRef):
        """One IsoFLOP run: the planned model for (budget, width) trained to its budget, validation loss."""
        budget, width = parse_partition_key(ctx.partition_key)
        datasets, vocab_size = ladder_data(mixture)
        settings = library_config(config, SweepSettings)
        if not settings.vocab_size:
            settings = dataclasses.replace(settings, vocab_size=vocab_size)
        return run_fn(budget, width, settings, datasets, held_out_streams(datasets), ctx.out_dir, log=ctx.log)

    def fit_metadata(ref: ArtifactRef) -> dict:
        return {"isoflop_curves": png_markdown("IsoFLOP curves", read_bytes(ref, "isoflop.png")),
                "power_laws": png_markdown("Power laws and extrapolation", read_bytes(ref, "power_laws.png"))}

    fit_in = dg.AssetIn(key="sweep", partition_mapping=dg.SpecificPartitionsPartitionMapping(ladder.fit_keys))

    @versioned_asset(key="scaling_fit", code_version="1", config_cls=FitConfig, ins={"sweep": fit_in}, **common,
                     extra_metadata=fit_metadata)
    def scaling_fit(ctx: StageContext, config: FitConfig, sweep: Mapping[str, ArtifactRef]):
        """IsoFLOP fit (Huber parabolas, vertices, N*/D* power laws, loss envelope) on the smaller budgets."""
        counts = select_budgets({k: dict(ref.counts) for k, ref in sweep.items()}, config.fit_budgets)
        return fit_ladder(counts, library_config(config, IsoFlopConfig), target=ladder.target, out_dir=ctx.out_dir, log=ctx.log)

    @versioned_asset(key="prediction", code_version="1", config_cls=PredictionConfig, ins={"fit": "scaling_fit"}, **common)
    def prediction(ctx: StageContext, config: PredictionConfig, fit: ArtifactRef):
        """Compute-optimal N*, D*, expected loss and the nearest family config at the largest budget."""
        settings = library_config(config.sweep, SweepSettings, max_width=config.max_width)
        out = predict_at(read_json(fit, "fit.json"), ladder.target, ladder.target_label, settings)
        write_file(ctx.out_dir, "prediction.json", json.dumps(out, indent=1))
        ctx.log(f"prediction at C={out['budget']:.3g}: N*={out['params_opt']:.3g}, D*={out['tokens_opt']:.3g}, "
                f"loss {out['loss']:.4f}")
        return {"budget": out["budget"], "params_opt": out["params_opt"], "tokens_opt": out["tokens_opt"],
                "loss": out["loss"], "width": (out["config"] or {}).get("width", 0)}

    @dg.asset_check(asset=prediction, name="prediction_error",
                    description=f"|predicted - actual| / actual of the best loss at the largest budget "
                                f"<= {ladder.max_relative_error}")
    def prediction_error(prediction: ArtifactRef, artifact_store: ArtifactStoreResource) -> dg.AssetCheckResult:
        pred = read_json(prediction, "prediction.json")
        refs = {k: artifact_store.store.read_pointer("sweep", k) for k in ladder.target_keys}
        out = check_prediction(pred, {k: r.counts if r else None for k, r in refs.items()}, ladder.max_relative_error)
        if out["missing"]:
            return dg.AssetCheckResult(
                passed=False, severity=dg.AssetCheckSeverity.WARN,
                description=f"actual runs at C={ladder.target_label} not materialised yet: {out['missing']}",
                metadata={"missing": dg.MetadataValue.json(out["missing"]), "predicted_loss": pred["loss"]})
        png = predicted_vs_actual_png(pred, out["actual_loss"])
        return dg.AssetCheckResult(
            passed=out["passed"], severity=dg.AssetCheckSeverity.ERROR,
            description=f"relative error {out['relative_error']:+.2%} (bound {ladder.max_relative_error:.0%})",
            metadata={
                **{k: out[k] for k in ("relative_error", "bound", "predicted_loss", "actual_loss",
                                       "actual_best_partition", "predicted_params", "actual_best_params")},
                "abs_relative_error": abs(out["relative_error"]),
                "actual_runs": dg.MetadataValue.json(out["actual_runs"]),
                "predicted_vs_actual": png_markdown("Predicted vs actual loss", png),
            })

    return [sweep, scaling_fit, prediction], [prediction_error]


_ladder_assets, scaling_checks = build_scaling_assets(DEMO_LADDER)
scaling_assets = list(_ladder_assets)
