"""A ladder's predictions: the run a target trains, the fitted loss at that run, an interval
from the ladder's seeds, and the frozen prediction's run planned again (``frozen_candidate``),
without Dagster. The fit they read is ``marin_assets.scaling.ladder.fit_ladder``'s fit.json.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from marin_assets.scaling.bootstrap import BootstrapConfig, bootstrap
from marin_assets.scaling.data import bucket_flops, validate_runs
from marin_assets.scaling.fits import IsoFlopConfig, fit_isoflop
from marin_assets.scaling.ladder import Ladder, SweepSettings, Target, fit_summary_of, loss_at, runs_from_counts, seed_groups
from marin_assets.scaling.planner import FamilyShape, MoeShape
from marin_assets.scaling.recipes import Recipe, get_recipe
from marin_assets.scaling.sweep import pinned_run, plan_run


def loss_at_config(fit: Mapping[str, Any], flops: float, params: float) -> float:
    """The fitted loss of a model of ``params`` trained with ``flops``: the envelope's loss at
    that compute plus the IsoFLOP parabola's rise from N*(C) to ``params``."""
    off = off_optimum(fit, flops, params)
    return loss_at(fit["loss_law"], flops) + fit["curvature_log10_params"] * off * off


def off_optimum(fit: Mapping[str, Any], flops: float, params: float) -> float:
    """How far ``params`` is from the fitted N* at ``flops``, in decades (log10)."""
    return math.log10(params) - math.log10(fit["n_opt_coefficient"] * flops ** fit["n_opt_exponent"])


def off_optimum_support(fit: Mapping[str, Any], flops: float, params: float) -> dict:
    """The target's distance from N* next to the farthest any fitted run was from its own budget's
    N*: past that, the parabola's rise is extrapolated, not fitted, and the prediction says so.
    Measured (benchmarks/ladder.py, the demo's datasets, on the earlier MoE family of the main run: a shared
    expert, sigmoid gating, quantile balancing): the MoE ladder's main-run target sat
    0.97 decades off N*, its runs at most 0.68; its prediction was 24% high, 18 points of it this
    rise. Its x3 and x10 targets sat within 0.06."""
    decades = off_optimum(fit, flops, params)
    reach = max(abs(off_optimum(fit, float(r["flops"]), float(r["params"]))) for r in fit["runs"])
    return {"decades": decades, "ladder_reach_decades": reach, "extrapolated": abs(decades) > reach}


def fitted_recipe(fit: Mapping[str, Any]) -> Recipe:
    """The recipe (with its reference LR) every fitted run was trained with; they must agree."""
    used = {(r.get("recipe"), r.get("lr_base")) for r in fit["runs"]}
    if len(used) != 1 or None in next(iter(used)):
        raise ValueError(f"prediction: the fitted runs do not share one recipe and reference LR: {sorted(map(str, used))}")
    name, base = used.pop()
    return get_recipe(name).with_base(float(base))


def target_candidate(fit: Mapping[str, Any], target: Target, c_fit: float, settings: SweepSettings, ladder_shape: FamilyShape):
    """The run a target trains: its width pinned, or the family member (widths from head_dim
    to settings.max_width) whose parameter count is nearest N* at its budget."""
    vocabs = {r["vocab_size"] for r in fit["runs"]}
    if len(vocabs) != 1:
        raise ValueError(f"prediction: the fitted runs used different vocabularies {sorted(vocabs)}")
    settings = dataclasses.replace(settings, vocab_size=vocabs.pop())
    recipe = fitted_recipe(fit)
    shape = target.family or ladder_shape
    if target.tokens is not None:
        return _pinned_tokens_run(target, settings, recipe, shape)
    budget = bucket_flops(target.multiple * c_fit)
    if target.width is not None:
        return plan_run(budget, target.width, settings, recipe, shape, batch_size=target.batch_size)
    n_star = fit["n_opt_coefficient"] * budget ** fit["n_opt_exponent"]
    plans = []
    for width in range(shape.head_dim, settings.max_width + 1, shape.head_dim):
        try:
            plans.append(plan_run(budget, width, settings, recipe, shape, batch_size=target.batch_size))
        except ValueError:
            continue  # this width cannot spend the budget (too few steps or off the tolerance)
    if not plans:
        raise ValueError(
            f"prediction {target.name}: no family member up to width {settings.max_width} can spend {budget:.3g} FLOPs"
        )
    return min(plans, key=lambda c: abs(math.log(c.params / n_star)))


def _pinned_tokens_run(target: Target, settings: SweepSettings, recipe: Recipe, shape: FamilyShape):
    """A target of pinned tokens: its width and batch for exactly those tokens (whole steps)."""
    width, batch, tokens = target.width, target.batch_size, target.tokens
    if width is None or batch is None or tokens is None:  # Target refuses these; the types do not know it
        raise ValueError(f"target {target.name}: pinned tokens need a pinned width and batch_size")
    batch_tokens = batch * settings.seq_len
    if tokens % batch_tokens:
        raise ValueError(f"target {target.name}: {tokens} tokens are not whole steps of {batch_tokens}")
    return pinned_run(settings, recipe, shape, width, batch, tokens // batch_tokens)


def seed_interval(
    counts: Mapping[str, Mapping[str, Any]], config: IsoFlopConfig, flops: float, params: float, n: int, seed: int = 0
) -> dict | None:
    """A percentile interval of the predicted loss from the ladder's seeds: each resample draws
    every point's seeds with replacement, refits and predicts. None with one seed per point."""
    groups = seed_groups(counts)
    if n == 0 or min(len(keys) for keys in groups.values()) < 2:
        return None
    rows = sorted(groups)
    first = {name: [counts[groups[p][0]][name] for p in rows] for name in ("params", "tokens", "flops")}
    losses = [np.array([counts[k]["validation_loss"] for k in groups[p]]) for p in rows]
    quiet = dataclasses.replace(config, bootstrap_n=0)

    def refit(rng: np.random.Generator) -> dict[str, float]:
        loss = [float(rng.choice(x, size=x.size, replace=True).mean()) for x in losses]
        runs = validate_runs(first["params"], first["tokens"], first["flops"], loss)
        return {"loss": loss_at_config(fit_summary_of(fit_isoflop(runs, quiet)), flops, params)}

    out = bootstrap(refit, BootstrapConfig(n=n, seed=seed))
    if "loss" not in out["ci"]:
        return None
    low, high = out["ci"]["loss"]
    return {
        "low": low,
        "high": high,
        "level": out["level"],
        "n": out["n"],
        "n_ok": out["n_ok"],
        "seeds_per_point": min(len(keys) for keys in groups.values()),
    }


def predict_target(fit: Mapping[str, Any], ladder: Ladder, target: Target, settings: SweepSettings) -> dict:
    """The prediction for one target, as it is frozen: the run's config, N*, D*, the loss at
    that config, the envelope's optimum, the seed interval (resampled as the fit's
    IsoFlopConfig bootstrap says), one run's seed noise (``run_noise``) and what the ladder cost."""
    config = IsoFlopConfig(**fit["isoflop_config"])
    cand = target_candidate(fit, target, ladder.c_fit, settings, ladder.family)
    counts = {r["partition"]: r for r in fit["runs"]}
    budget = cand.budget
    return {
        "ladder": ladder.name,
        "target": target.name,
        "c_fit": ladder.c_fit,
        "multiple": target.multiple if target.tokens is None else budget / ladder.c_fit,
        "pinned_tokens": target.tokens,
        "budget": budget,
        "recipe": fitted_recipe(fit).as_dict(),
        "family": (target.family or ladder.family).as_dict(),
        "config": cand.as_dict(),
        "params_opt": fit["n_opt_coefficient"] * budget ** fit["n_opt_exponent"],
        "tokens_opt": fit["d_opt_coefficient"] * budget ** fit["d_opt_exponent"],
        "loss": loss_at_config(fit, cand.flops, cand.params),
        "off_optimum": off_optimum_support(fit, cand.flops, cand.params),
        "loss_optimal": loss_at(fit["loss_law"], budget),
        "loss_law": fit["loss_law"],
        "curvature_log10_params": fit["curvature_log10_params"],
        "interval": seed_interval(counts, config, cand.flops, cand.params, config.bootstrap_n, config.bootstrap_seed),
        "run_sd": run_noise(counts),
        "ladder_flops": float(sum(r["flops"] for r in fit["runs"])),
        "lr_sweep_flops": float(max(r.get("lr_sweep_flops", 0.0) for r in fit["runs"])),
        "in_sample": [
            {"budget": o["budget"], "predicted": loss_at(fit["loss_law"], o["budget"]), "vertex_loss": o["loss_opt"]}
            for o in fit["optima"]
        ],
    }


def frozen_candidate(pred: Mapping[str, Any], settings: SweepSettings):
    """The run a frozen prediction names, planned again from its recipe and family: any
    difference (other settings, a changed planner) is refused rather than run under the
    prediction's name."""
    frozen, family = pred["config"], pred["family"]
    shape = FamilyShape(
        head_dim=family["head_dim"],
        aspect_ratio=family["aspect_ratio"],
        ff_mult=family["ff_mult"],
        kv_group=family["kv_group"],
        moe=MoeShape(**family["moe"]) if family["moe"] else None,
    )
    if pred.get("pinned_tokens") is not None:
        cand = pinned_run(settings, Recipe(**pred["recipe"]), shape, frozen["width"], frozen["batch_size"], frozen["steps"])
    else:
        cand = plan_run(
            pred["budget"], frozen["width"], settings, Recipe(**pred["recipe"]), shape, batch_size=frozen["batch_size"]
        )
    planned = json.loads(json.dumps(cand.as_dict()))
    differ = sorted(k for k in frozen if planned.get(k) != frozen[k])
    if differ:
        raise ValueError(
            f"target {pred['target']}: these settings plan a run that differs from the frozen prediction in "
            f"{differ} (frozen {[frozen[k] for k in differ]}, planned {[planned.get(k) for k in differ]})"
        )
    return cand


def top_budget_holdout(counts: Mapping[str, Mapping[str, Any]], config: IsoFlopConfig) -> dict:
    """The ladder's own extrapolation check, before any target runs: the same fit on every budget
    but the largest predicts the largest budget's runs (seeds averaged) at their (FLOPs, N).
    Returns {"fitted_budgets", "held_out_budget", "rows": [{params, predicted, actual,
    relative_error}], "mean_abs_relative_error", "n_opt_exponent"}; a ValueError (as the fit's)
    when the lower budgets leave fewer than two vertices."""
    labels = {k: bucket_flops(float(c["flops"]), config.bucket_base) for k, c in counts.items()}
    top = max(labels.values())
    lower = {k: c for k, c in counts.items() if labels[k] < top}
    if len({labels[k] for k in lower}) < 2:
        raise ValueError(f"holdout: {len({labels[k] for k in lower})} budget(s) below the largest; the fit needs >= 2")
    fit = fit_summary_of(fit_isoflop(runs_from_counts(lower)[0], dataclasses.replace(config, bootstrap_n=0)))
    held, _ = runs_from_counts({k: c for k, c in counts.items() if labels[k] == top})
    rows = []
    for params, flops, actual in zip(held.params, held.flops, held.loss, strict=True):
        predicted = loss_at_config(fit, float(flops), float(params))
        rows.append(
            {
                "params": float(params),
                "predicted": predicted,
                "actual": float(actual),
                "relative_error": (predicted - float(actual)) / float(actual),
            }
        )
    rows.sort(key=lambda r: r["params"])
    return {
        "fitted_budgets": sorted({labels[k] for k in lower}),
        "held_out_budget": top,
        "rows": rows,
        "mean_abs_relative_error": float(np.mean([abs(r["relative_error"]) for r in rows])),
        "n_opt_exponent": fit["n_opt_exponent"],
    }


def run_noise(counts: Mapping[str, Mapping[str, Any]]) -> float | None:
    """One run's loss noise from its seed alone, relative to the loss: the pooled standard
    deviation of the ladder's seeds at each (budget, width) point over that point's mean. The
    seed interval is the fit's uncertainty; a target is one run (or a few), so a statement about
    it needs this too. Measured on the demo's datasets (benchmarks/ladder.py, 2 seeds a point):
    1.0% on the dense v2 ladder (12 points), 1.1% on the MoE v2 ladder (9); the dense v2 x3
    target at 4 seeds: 1.3%.
    None with one seed per point."""
    groups = [np.array([counts[k]["validation_loss"] for k in keys]) for keys in seed_groups(counts).values()]
    relative = [x.var(ddof=1) / x.mean() ** 2 for x in groups if x.size > 1]
    return float(np.sqrt(np.mean(relative))) if relative else None
