"""Scaling laws as assets: a ladder of tiny runs, its fit, pre-registered predictions of
larger held-out runs, those runs, and the comparison.

    mixture (the DataKit's datasets: shard caches read in place)
    -> scaling/<ladder>/lr_sweep              (the recipe's reference LR, re-tuned: v2)
    -> scaling/<ladder>/sweep[C<budget>-d<width>[-s<seed>]]   (one training run per partition)
    -> scaling/<ladder>/fit                   (IsoFLOP fit of every budget up to C_fit)
    -> scaling/<ladder>/<target>/prediction   (config and loss at k x C_fit, frozen by the lock as written)
    -> scaling/<ladder>/<target>/target       (that run: refuses to start without the frozen prediction)
    -> scaling/<ladder>/comparison            (predicted vs actual, seed intervals, a plot, the ladder's
                                               compute over the targets'; check prediction_error)

The lock is the experiment-record lock (``marin_assets/scaling/extrapolation.py``): a target's
run checks it, carries the prediction's hash, and the comparison refuses a prediction that
no longer hashes to what its target ran against. Predictions and targets are one asset each
(not partitions): a Dagster job covers one partitions definition, and the sweep has its own.

Sweep partitions are ``C<budget>-d<width>`` (``-s<seed>`` after the first seed): a
``MultiPartitionsDefinition`` key "C1e11|d32" is no path segment, and each budget carries
its own widths, as in Marin's IsoFLOP sweeps. The ladders train on the datasets the main run
trains on (uniformly over the mixture's sources) and score on their held-out splits, in the
code location's byte tokens (with a 4096-token BPE the LM head is most of a tiny model's
FLOPs and the narrowest model won every CPU-sized budget: no interior optimum).

``scaling_assets`` / ``scaling_checks`` are the demo's ladder, over the main run's MoE family
(``MOE_LADDER``, group ``scaling``: the scaling job; the ladder watch reads its sweep), and a
dense ladder (``DENSE_LADDER``, its own group), both defined in ``assets/scaling_ladders.py``;
``benchmarks/ladder.py`` runs the long protocols.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import dagster as dg

from assets.scaling_configs import (
    DATA_KEY,
    FitConfig,
    LrSweepConfig,
    SweepConfig,
    data_version,
    ladder_data,
    run_settings,
)
from assets.scaling_ladders import DEMO_LADDER, DENSE_LADDER, MOE_LADDER
from assets.scaling_targets import main_run_asset, prediction_asset, target_asset
from marin_assets.orchestration import StageContext, png_markdown, versioned_asset
from marin_assets.orchestration.fanout import local_workers
from marin_assets.orchestration.knob_configs import library_config
from marin_assets.scaling.extrapolation import (
    STAMP_KEY,
    as_json,
    check_stamp,
    compare,
    comparison_counts,
    comparison_png,
)
from marin_assets.scaling.fits import IsoFlopConfig
from marin_assets.scaling.ladder import Ladder, SweepSettings, fit_ladder, select_budgets
from marin_assets.scaling.lr_sweep import LrSweepSettings, resolve_recipe, run_lr_sweep, uses_lr_sweep
from marin_assets.scaling.sweep import held_out_streams, parse_seeded_key, run_sweep_point, score_trained_run, train_candidate
from marin_assets.store import ArtifactRef
from marin_assets.store.artifact_files import read_bytes, read_json, write_file
from marin_assets.store.lock_files import content_hash

SCALING_GROUP = "scaling"  # the scaling job's group: the demo's ladder (MoE), watched by the ladder watch
DENSE_GROUP = "scaling_dense"  # its own group: a job covers one partitions definition, and the sweeps' differ


def build_scaling_assets(
    ladder: Ladder = DEMO_LADDER,
    *,
    group: str = SCALING_GROUP,
    automation_condition: dg.AutomationCondition | None = None,
    run_fn=None,
    train_fn=None,
    score_fn=None,
):
    """(assets, checks) of one ladder: lr_sweep, sweep, fit, prediction, target, comparison and
    the comparison's prediction_error check, keyed ``scaling/<ladder.name>/...``.

    ``run_fn`` has ``run_sweep_point``'s signature and ``train_fn`` ``train_candidate``'s (the
    lr_sweep's and the targets' runs); each returns its counts (at least params, tokens,
    flops, validation_loss, vocab_size); tests pass a known law to check the protocol, and a
    ``score_fn`` of ``score_trained_run``'s signature for an observed target's run.
    """
    injected = train_fn is not None
    run_fn = run_fn or run_sweep_point
    train_fn = train_fn or train_candidate
    prefix = f"{SCALING_GROUP}/{ladder.name}"
    common: dict[str, Any] = dict(group_name=group, automation_condition=automation_condition)
    family_version = {"family": content_hash(as_json(ladder.family.as_dict()))}

    def lr_version(config, partition, inputs) -> dict[str, str]:
        return data_version(config, partition, inputs) | family_version

    @versioned_asset(
        key=f"{prefix}/lr_sweep",
        code_version="4",  # 4: the blockwise kernel's gradients (see TRAIN_CODE_VERSION 9)
        config_cls=LrSweepConfig,
        ins={"mixture": DATA_KEY},
        version_inputs=lr_version,
        **common,
    )
    def lr_sweep(ctx: StageContext, config: LrSweepConfig, mixture: ArtifactRef):
        """The recipe's reference shape trained at a few LRs; the best becomes the recipe's lr_base (v2)."""
        # Its runs on spawned workers (an injected train_fn, a test's, runs here): JAX stays out of the
        # run's process, so the sweep's range run can still fork its workers from it.
        return run_lr_sweep(
            run_settings(config.sweep, mixture),
            library_config(config, LrSweepSettings),
            ladder.family,
            ladder_data(mixture)[0],
            ctx.out_dir,
            run_prefix=f"lr-{ladder.name}",
            log=ctx.log,
            run_fn=train_fn,
            workers=1 if injected else local_workers(),
        )

    def sweep_version(config, partition, inputs) -> dict[str, str]:
        out = data_version(config, partition, inputs) | family_version
        if uses_lr_sweep(library_config(config, SweepSettings)):
            out["lr_sweep"] = inputs["lr_sweep"].version
        return out

    @versioned_asset(
        key=f"{prefix}/sweep",
        code_version="6",  # 6: the blockwise kernel's gradients (see TRAIN_CODE_VERSION 9)
        config_cls=SweepConfig,
        ins={"mixture": DATA_KEY, "lr_sweep": f"{prefix}/lr_sweep"},
        version_inputs=sweep_version,
        partitions_def=dg.StaticPartitionsDefinition(ladder.keys()),
        **common,
        extra_metadata=lambda ref: {"loss_curve": dg.MetadataValue.path(f"{ref.data_path}/loss_curve.png")},
    )
    def sweep(ctx: StageContext, config: SweepConfig, mixture: ArtifactRef, lr_sweep: ArtifactRef):
        """One IsoFLOP run: the planned model for (budget, width, seed) trained to its budget, validation loss."""
        budget, width, seed = parse_seeded_key(ctx.partition)
        datasets, _ = ladder_data(mixture)
        settings = run_settings(config, mixture)
        recipe = resolve_recipe(settings, lr_sweep.counts)
        counts = run_fn(
            budget,
            width,
            settings,
            datasets,
            held_out_streams(datasets),
            ctx.out_dir,
            log=ctx.log,
            recipe=recipe,
            shape=ladder.family,
            seed=seed,
            run_prefix=f"sweep-{ladder.name}",
        )
        return dict(counts) | {"lr_sweep_flops": float(lr_sweep.counts["flops"]) if uses_lr_sweep(settings) else 0.0}

    def fit_metadata(ref: ArtifactRef) -> dict:
        return {
            "isoflop_curves": png_markdown("IsoFLOP curves", read_bytes(ref, "isoflop.png")),
            "power_laws": png_markdown("Power laws and extrapolation", read_bytes(ref, "power_laws.png")),
        }

    @versioned_asset(
        key=f"{prefix}/fit",
        code_version="3",
        config_cls=FitConfig,
        ins={"sweep": f"{prefix}/sweep"},
        **common,
        extra_metadata=fit_metadata,
    )
    def fit(ctx: StageContext, config: FitConfig, sweep: Mapping[str, ArtifactRef]):
        """IsoFLOP fit (Huber parabolas, vertices, N*/D* power laws, loss envelope) of every budget up to C_fit."""
        counts = select_budgets({k: dict(ref.counts) for k, ref in sweep.items()}, config.fit_budgets)
        return fit_ladder(
            counts,
            library_config(config, IsoFlopConfig),
            extrapolate_to=max(t.multiple for t in ladder.targets) * ladder.c_fit,
            out_dir=ctx.out_dir,
            log=ctx.log,
        )

    predictions = [prediction_asset(ladder, t, prefix, common) for t in ladder.targets]
    targets = [
        main_run_asset(ladder, t, prefix, common, score_fn or score_trained_run)
        if t.observed
        else target_asset(ladder, t, prefix, common, train_fn)
        for t in ladder.targets
    ]

    pairs = {f"{kind}_{t.name}": f"{prefix}/{t.name}/{kind}" for t in ladder.targets for kind in ("prediction", "target")}

    @versioned_asset(
        key=f"{prefix}/comparison",
        code_version="4",
        ins=pairs,
        **common,
        extra_metadata=lambda ref: {
            "predicted_vs_actual": png_markdown("Pre-registered predictions vs actual", read_bytes(ref, "comparison.png"))
        },
    )
    def comparison(ctx: StageContext, **refs: ArtifactRef):
        """Each target's pre-registered prediction vs its actual loss, the seed interval, the ladder's cost fraction."""
        preds = {t.name: read_json(refs[f"prediction_{t.name}"], "prediction.json") for t in ladder.targets}
        runs = {t.name: refs[f"target_{t.name}"] for t in ladder.targets}
        for name, ref in runs.items():
            check_stamp(ctx.store, name, read_json(ref, "run.json").get(STAMP_KEY), preds[name])
        out = compare(preds, {name: dict(ref.counts) for name, ref in runs.items()}, ladder.max_relative_error)
        write_file(ctx.out_dir, "comparison.json", json.dumps(out, indent=1))
        write_file(ctx.out_dir, "comparison.png", comparison_png(out, preds))
        for row in out["rows"]:
            ctx.log(
                f"comparison {ladder.name}/{row['target']}: predicted {row['predicted']:.4f}, actual {row['actual']:.4f} "
                f"({row['relative_error']:+.2%})"
            )
        return comparison_counts(out)

    @dg.asset_check(
        asset=comparison,
        name="prediction_error",
        description=f"every pre-registered target prediction within {ladder.max_relative_error:.0%} of its run",
    )
    def prediction_error(comparison: ArtifactRef) -> dg.AssetCheckResult:
        out = read_json(comparison, "comparison.json")
        return dg.AssetCheckResult(
            passed=bool(out["passed"]),
            severity=dg.AssetCheckSeverity.ERROR,
            description=", ".join(f"{r['target']}: {r['relative_error']:+.2%}" for r in out["rows"])
            + f" (bound {ladder.max_relative_error:.0%})",
            metadata={
                "max_abs_relative_error": out["max_abs_relative_error"],
                "bound": out["bound"],
                "rows": dg.MetadataValue.json(out["rows"]),
                "ladder_cost_fraction": out["ladder_cost_fraction"],
            },
        )

    return [lr_sweep, sweep, fit, *predictions, *targets, comparison], [prediction_error]


_dense_assets, _dense_checks = build_scaling_assets(DENSE_LADDER, group=DENSE_GROUP)
_moe_assets, _moe_checks = build_scaling_assets(MOE_LADDER)
scaling_assets = [*_dense_assets, *_moe_assets]
scaling_checks = [*_dense_checks, *_moe_checks]
