"""The lr_sweep's grid: a best LR on the grid's edge says only that the optimum lies beyond it,
so the sweep trains past that edge (at most ``edge_extensions`` more LRs) before it picks."""

from __future__ import annotations

import json
import math

import pytest

from marin_assets.scaling.ladder import SweepSettings
from marin_assets.scaling.lr_sweep import LrSweepSettings, lowest_three, lr_past_edge, run_lr_sweep
from marin_assets.scaling.planner import FamilyShape
from marin_assets.scaling.recipes import V2


def bowl_run(best_lr: float, trained: list[float]):
    """A reference run whose held-out loss is a parabola in log10(LR) around ``best_lr``; records each LR."""

    def run(cand, settings, datasets, validation, out, *, run_name, seed, log):
        trained.append(cand.learning_rate)
        return {"validation_loss": 2.5 + 0.2 * math.log10(cand.learning_rate / best_lr) ** 2, "flops": cand.flops}

    return run


def sweep(tmp_path, best_lr: float, grid: LrSweepSettings) -> tuple[dict, list[float]]:
    trained: list[float] = []
    counts = run_lr_sweep(
        SweepSettings(vocab_size=257, recipe="v2", batch_sizes=[16]),
        grid,
        FamilyShape(head_dim=4),
        {},
        str(tmp_path),
        run_prefix="lr",
        log=lambda line: None,
        run_fn=bowl_run(best_lr, trained),
    )
    return counts, trained


def test_an_optimum_above_the_grid_is_found_by_extending_it(tmp_path):
    # v2's grid is 0.015, 0.03, 0.06; the optimum 0.08 is above it: 0.12 is trained, then 0.06 is the lowest
    # loss tried, inside, and the parabola's vertex is the optimum.
    counts, trained = sweep(tmp_path, 0.08, LrSweepSettings())
    assert trained == pytest.approx([0.015, 0.03, 0.06, 0.12])
    assert counts["best_lr"] == pytest.approx(0.08, rel=1e-3) and counts["interior_vertex"] and counts["edge_extensions"] == 1
    assert counts["runs"] == 4
    written = json.loads((tmp_path / "lr_sweep.json").read_text())
    assert [r["learning_rate"] for r in written["runs"]] == pytest.approx(trained)
    assert "1 LR(s) added past the grid's edge" in written["chosen_by"]


def test_an_optimum_below_the_grid_extends_it_downward_and_the_extensions_are_capped(tmp_path):
    counts, trained = sweep(tmp_path, 1e-4, LrSweepSettings())  # far below: both extensions used, still on the edge
    assert trained == pytest.approx([0.015, 0.03, 0.06, 0.0075, 0.00375])
    assert counts["edge_extensions"] == 2 and not counts["interior_vertex"]
    assert counts["best_lr"] == pytest.approx(0.00375)  # the lowest-loss LR tried


def test_an_interior_optimum_trains_the_grid_only(tmp_path):
    counts, trained = sweep(tmp_path, 0.025, LrSweepSettings())
    assert trained == pytest.approx([0.015, 0.03, 0.06]) and counts["edge_extensions"] == 0
    assert counts["best_lr"] == pytest.approx(0.025, rel=1e-3)
    counts, trained = sweep(tmp_path, 0.1, LrSweepSettings(edge_extensions=0))  # the old behaviour: the grid's edge
    assert trained == pytest.approx([0.015, 0.03, 0.06]) and counts["best_lr"] == pytest.approx(0.06)


def test_lr_past_edge_steps_by_the_edges_own_ratio():
    runs = [{"learning_rate": lr, "validation_loss": loss} for lr, loss in ((0.01, 3.0), (0.03, 2.9), (0.06, 2.8))]
    assert lr_past_edge(runs) == pytest.approx(0.12)
    runs[0]["validation_loss"] = 2.7
    assert lr_past_edge(runs) == pytest.approx(0.01 / 3)
    runs[1]["validation_loss"] = 2.6
    assert lr_past_edge(runs) is None
    with pytest.raises(ValueError, match="edge_extensions must be"):
        LrSweepSettings(edge_extensions=-1)
    assert V2.lr_base == 3e-2  # the grid above is 0.5x, 1x and 2x of it


def test_the_vertex_is_fitted_through_the_lowest_loss_and_its_neighbours(tmp_path):
    # Losses measured on the demo's data (MoE family, batch 4, 150 steps): lowest at 0.06. One parabola
    # through all four puts its vertex at 0.12, the edge; through 0.03, 0.06 and 0.12 it is 0.075.
    losses = {0.015: 2.8034, 0.03: 2.7857, 0.06: 2.7375, 0.12: 2.7476}

    def run(cand, settings, datasets, validation, out, *, run_name, seed, log):
        return {"validation_loss": losses[round(cand.learning_rate, 6)], "flops": cand.flops}

    counts = run_lr_sweep(
        SweepSettings(vocab_size=257, recipe="v2", batch_sizes=[16]),
        LrSweepSettings(),
        FamilyShape(head_dim=4),
        {},
        str(tmp_path),
        run_prefix="lr",
        log=lambda line: None,
        run_fn=run,
    )
    u = [math.log10(x) for x in (0.03, 0.06, 0.12)]  # the three-point parabola's vertex, by hand
    y = [losses[x] for x in (0.03, 0.06, 0.12)]
    h = u[1] - u[0]
    vertex = u[1] + h * (y[0] - y[2]) / (2 * (y[0] - 2 * y[1] + y[2]))
    assert counts["best_lr"] == pytest.approx(10**vertex, rel=1e-3) and counts["edge_extensions"] == 1
    assert 0.07 < counts["best_lr"] < 0.08
    assert lowest_three([3.0, 2.0, 2.5, 2.9, 3.1]) == [0, 1, 2]
    assert lowest_three([3.0, 2.9, 2.5, 2.0, 3.1]) == [2, 3, 4] and lowest_three([3.0, 2.9, 2.5, 2.0]) == [1, 2, 3]
