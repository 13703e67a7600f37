"""The reference LR of a recipe tuned by sweep: the ``lr_sweep`` asset's library code, without Dagster.

A recipe marked ``tuned_by_sweep`` (v2) leaves its peak LR at the reference shape to a sweep
over ``LrSweepSettings.lr_factors``; ``run_lr_sweep`` trains that grid (widening it past an
edge that holds the lowest loss) and picks the vertex of a parabola in log LR. The ladder's
runs then take that LR through ``resolve_recipe``. The ladder's shape and fit are
``marin_assets.scaling.ladder``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from marin_assets.knobs import knob
from marin_assets.numeric_checks import check_float, check_int
from marin_assets.scaling.fits import fit_robust_quadratic
from marin_assets.scaling.planner import FamilyShape
from marin_assets.scaling.recipes import Recipe, get_recipe
from marin_assets.scaling.sweep import held_out_streams, reference_run, train_candidate
from marin_assets.store.artifact_files import write_file

if TYPE_CHECKING:
    from marin_assets.scaling.ladder import SweepSettings


@dataclass(frozen=True)
class LrSweepSettings:
    """The lr_sweep asset's grid (knobs): LRs tried at the recipe's reference shape."""

    lr_factors: list[float] = knob(
        [0.5, 1.0, 2.0],
        help="LRs the lr_sweep trains at the recipe's reference shape, "
        "as multiples of the recipe's lr_base (>= 3 for a parabola)",
    )
    edge_extensions: int = knob(
        2,
        help="while the lowest loss sits on an edge of the LRs tried, train one more LR past "
        "it (the edge's own ratio to its neighbour), at most this many times",
    )

    def __post_init__(self) -> None:
        if len(self.lr_factors) < 3 or len(set(self.lr_factors)) != len(self.lr_factors):
            raise ValueError(f"lr_factors: need >= 3 distinct factors for a parabola in log LR, got {self.lr_factors}")
        for i, f in enumerate(self.lr_factors):
            check_float(f"lr_factors[{i}]", f, 0, 1e3, lo_open=True)
        check_int("edge_extensions", self.edge_extensions, 0, 10)


def uses_lr_sweep(settings: SweepSettings) -> bool:
    """Whether the settings' runs take their reference LR from the lr_sweep (a tuned recipe, no lr_base set)."""
    return get_recipe(settings.recipe).tuned_by_sweep and not settings.lr_base


def resolve_recipe(settings: SweepSettings, lr_sweep: Mapping[str, Any] | None) -> Recipe:
    """The settings' recipe with its reference LR: the settings' lr_base when set, else the
    lr_sweep's best (its counts, ``lr_sweep``) for a recipe tuned by the sweep, else its own."""
    recipe = get_recipe(settings.recipe)
    if settings.lr_base > 0:
        return recipe.with_base(settings.lr_base)
    if not recipe.tuned_by_sweep:
        return recipe
    if lr_sweep is None or lr_sweep.get("recipe") != recipe.name:
        raise ValueError(
            f"recipe {recipe.name!r} takes its reference LR from an lr_sweep of that recipe; the lr_sweep "
            f"given was run for {None if lr_sweep is None else lr_sweep.get('recipe')!r}"
        )
    return recipe.with_base(float(lr_sweep["best_lr"]))


def run_lr_sweep(
    settings: SweepSettings,
    grid: LrSweepSettings,
    shape: FamilyShape,
    datasets: Mapping[str, str],
    out_dir: str,
    *,
    run_prefix: str,
    log: Callable[[str], None] = print,
    run_fn: Callable[..., dict] | None = None,
    workers: int = 1,
) -> dict:
    """Train the recipe's reference shape at each LR of the grid; the best becomes its lr_base
    (a recipe not tuned by the sweep trains nothing and keeps its own).

    ``datasets``: {source: dataset index}, trained on and scored on their held-out splits.
    With ``workers`` > 1 the runs go to that many spawned processes: JAX then never starts in
    this one, which may still fork workers afterwards (the sweep's range run does). While the
    lowest loss sits on an edge of the LRs tried, one more LR past that edge is trained (at
    most ``grid.edge_extensions`` times): a best LR on the grid's edge only says the optimum
    is beyond it. The best is the vertex of a parabola in log10(LR) through the lowest loss and
    its two neighbours (``lowest_three``) when it opens upward with its vertex inside them, else
    the lowest-loss LR tried.
    Writes lr_sweep.json; returns the counts (best_lr, how it was chosen, the runs' FLOPs)."""
    import concurrent.futures
    import contextlib
    import multiprocessing

    recipe = get_recipe(settings.recipe)
    if not recipe.tuned_by_sweep:  # nothing to tune: the recipe's own base, no run
        return {
            "best_lr": recipe.lr_base,
            "runs": 0,
            "flops": 0.0,
            "interior_vertex": False,
            "edge_extensions": 0,
            "recipe": recipe.name,
        }
    runs: list[dict] = []

    def train_at(lrs: Sequence[float], pool: concurrent.futures.Executor | None) -> None:
        jobs = [
            (
                reference_run(settings, recipe, shape, lr),
                settings,
                dict(datasets),
                f"{out_dir.rstrip('/')}/lr{len(runs) + i}",
                f"{run_prefix}-lr{len(runs) + i}",
            )
            for i, lr in enumerate(lrs)
        ]
        counts = list(pool.map(_reference_point, jobs)) if pool else [_reference_point(job, run_fn, log) for job in jobs]
        runs.extend(
            {"learning_rate": lr, "validation_loss": c["validation_loss"], "flops": c["flops"]}
            for lr, c in zip(lrs, counts, strict=True)
        )
        runs.sort(key=lambda r: r["learning_rate"])

    with contextlib.ExitStack() as stack:
        pool = None
        if workers > 1:
            context = multiprocessing.get_context("spawn")
            pool = stack.enter_context(
                concurrent.futures.ProcessPoolExecutor(min(workers, len(grid.lr_factors)), mp_context=context)
            )
        train_at(sorted(recipe.lr_base * f for f in grid.lr_factors), pool)
        extended = 0
        while extended < grid.edge_extensions and (beyond := lr_past_edge(runs)) is not None:
            train_at([beyond], pool)
            extended += 1
    lrs = [r["learning_rate"] for r in runs]
    losses = [r["validation_loss"] for r in runs]
    near = lowest_three(losses)
    fit = fit_robust_quadratic([lrs[i] for i in near], [losses[i] for i in near])
    interior, why = fit.interior_minimum()
    best = 10.0**fit.vertex_log10 if interior else lrs[int(np.argmin(losses))]
    how = (
        "parabola vertex in log10(LR) through the lowest loss and its neighbours"
        if interior
        else (f"lowest-loss LR tried ({why})")
    )
    how += f"; {extended} LR(s) added past the grid's edge" if extended else ""
    out = {
        "recipe": recipe.name,
        "reference": {"width": recipe.lr_ref_width, "steps": recipe.lr_ref_steps},
        "runs": runs,
        "best_lr": float(best),
        "chosen_by": how,
        "edge_extensions": extended,
    }
    write_file(out_dir, "lr_sweep.json", json.dumps(out, indent=1))
    log(
        f"lr_sweep {recipe.name}: losses {[round(x, 4) for x in losses]} at LRs {[f'{x:.3g}' for x in lrs]}: "
        f"best {best:.4g} ({how})"
    )
    return {
        "best_lr": float(best),
        "runs": len(runs),
        "flops": float(sum(r["flops"] for r in runs)),
        "interior_vertex": bool(interior),
        "edge_extensions": extended,
        "recipe": recipe.name,
    }


def lowest_three(losses: Sequence[float]) -> list[int]:
    """Indices of the lowest loss and its two neighbours (the two next to it at an edge): the
    parabola goes through these only, since loss is a parabola in log LR only near its minimum.
    Measured on the demo's data (the earlier MoE family: a shared expert, sigmoid gating; 150 steps):
    losses 2.803, 2.786, 2.738, 2.748 at LRs 0.015-0.12 put one parabola's vertex at 0.12, the edge,
    though the lowest loss was at 0.06."""
    best = int(np.argmin(losses))
    start = min(max(best - 1, 0), len(losses) - 3)
    return [start, start + 1, start + 2]


def lr_past_edge(runs: Sequence[Mapping[str, float]]) -> float | None:
    """The next LR to try when the lowest loss of ``runs`` (sorted by LR) is at the lowest or the
    highest LR: one step past it, the step being that edge's ratio to its neighbour; else None."""
    losses = [r["validation_loss"] for r in runs]
    lrs = [r["learning_rate"] for r in runs]
    best = int(np.argmin(losses))
    if best == len(runs) - 1:
        return lrs[-1] * lrs[-1] / lrs[-2]
    if best == 0:
        return lrs[0] * lrs[0] / lrs[1]
    return None


def _reference_point(job: tuple, run_fn: Callable[..., dict] | None = None, log: Callable[[str], None] | None = None) -> dict:
    """One lr_sweep run (a spawned worker's, or in this process): the candidate trained and scored."""
    cand, settings, datasets, out, name = job
    train = run_fn or train_candidate
    return train(cand, settings, datasets, held_out_streams(datasets), out, run_name=name, seed=settings.seed, log=log or _silent)


def _silent(line: str) -> None:
    """A spawned run's progress lines: the parent logs the sweep's summary instead."""
