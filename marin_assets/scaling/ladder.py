"""An IsoFLOP ladder and what is computed from its runs, without Dagster.

``Ladder`` is the static shape of the protocol: the budgets the fit sees (up to C_fit), the
widths run at each, the seeds, the model family, and the held-out targets at multiples of
C_fit. ``marin_assets.scaling.lr_sweep`` re-tunes the recipe's reference LR; ``fit_ladder`` fits the sweep's
runs; ``marin_assets.scaling.ladder_predict.predict_target`` extrapolates the fit to one target
(its config, its loss there and an interval from the ladder's seeds). Pre-registration and the
comparison with the target runs are ``marin_assets.scaling.extrapolation``. The assets in ``assets/scaling.py`` are thin
wrappers.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from marin_assets.knobs import knob
from marin_assets.numeric_checks import check_float, check_int
from marin_assets.scaling.data import validate_runs
from marin_assets.scaling.fits import fit_isoflop, fit_power_law
from marin_assets.scaling.planner import FamilyShape
from marin_assets.scaling.plots import plot_isoflop_curves, plot_power_laws
from marin_assets.scaling.recipes import RECIPES, get_recipe
from marin_assets.scaling.sweep import (
    budget_label,
    parse_partition_key,
    parse_seeded_key,
    partition_key,
)
from marin_assets.store.artifact_files import write_file
from marin_assets.store.names import validate_asset_key, validate_segment

if TYPE_CHECKING:
    from marin_assets.scaling.fits import IsoFlopConfig


@dataclass(frozen=True)
class SweepSettings:
    """The settings of every run of a ladder (its recipe, batch and schedule, how it is scored)
    and of the config the prediction picks; the model family's shape is the ladder's
    (``Ladder.family``). The defaults are the demo's CPU ladder (assets/scaling.py says what
    was measured). Knobs (marin_assets/knobs.py): the ladder assets' configs are generated
    from them; ``marin_assets.scaling.sweep`` reads them as attributes."""

    vocab_size: int = knob(0, help="model vocabulary; 0 = the tokenizer's, read from the caches' stats.json")
    seq_len: int = knob(64, help="tokens per training sequence")
    batch_sizes: list[int] = knob(
        [4, 8, 16],
        help="sequences per step the planner may pick: the largest that leaves "
        "min_steps (small budgets of wide models get the small ones)",
    )
    min_steps: int = knob(50, help="fewest optimizer steps a planned run may take")
    tolerance: float = knob(0.04, help="planned FLOPs within this fraction of the budget")
    recipe: str = knob("v2", help=f"scaling recipe (marin_assets/scaling/recipes.py): one of {sorted(RECIPES)}")
    lr_base: float = knob(
        0.0, help="peak LR at the recipe's reference point; 0 = the recipe's own (v2: the lr_sweep asset's best)"
    )
    decay_fraction: float = knob(0.2, help="WSD: last fraction of steps decays the LR")
    skip_sigma: float = knob(
        0.0,
        help="loss-spike skip test of the training guards; 0 = off. On these short "
        "mixed-source runs the test froze whole runs (hundreds of skipped steps)",
    )
    seed: int = knob(0, help="model and data-order seed of every run (a ladder seed s adds s)")
    validation_windows: int = knob(256, help="held-out windows of seq_len per source")
    max_width: int = knob(512, help="widest family member the prediction may pick")

    def __post_init__(self) -> None:
        # The batch sizes and tolerance are checked by ModelFamily and plan_sweep, the recipe here.
        check_int("vocab_size (0 = the tokenizer's)", self.vocab_size, 0, 10**9)
        check_float("decay_fraction", self.decay_fraction, 0, 1)
        check_float("lr_base (0 = the recipe's)", self.lr_base, 0, 10)
        check_int("validation_windows", self.validation_windows, 1, 10**9)
        check_int("max_width", self.max_width, 1, 10**9)
        get_recipe(self.recipe)


@dataclass(frozen=True)
class Target:
    """A held-out run the ladder predicts: at ``multiple`` x C_fit, with the family member
    nearest the predicted N* (or a pinned ``width``, ``batch_size`` and ``family``: a main
    run's model, whose shape may differ from the ladder's in ways its N and FLOPs do not see,
    such as how its width splits into heads). ``tokens`` pins a pinned model's run length (a main
    run's tokens): its budget is then exactly what those tokens cost, ``multiple`` only nominal.
    ``observed`` names a training run's asset key that *is* the target (the demo's main run): the
    ladder trains nothing for it; the run's newest phase is scored once it has run."""

    name: str  # its asset key segment, e.g. "x3"
    multiple: float
    width: int | None = None
    batch_size: int | None = None
    family: FamilyShape | None = None  # None: the ladder's
    tokens: int | None = None
    observed: str | None = None

    def __post_init__(self) -> None:
        validate_segment(self.name, "target name")
        check_float(f"target {self.name} multiple", self.multiple, 1, 1e9, lo_open=True)
        if self.width is not None:
            check_int(f"target {self.name} width", self.width, 1, 10**9)
        if self.batch_size is not None:
            check_int(f"target {self.name} batch_size", self.batch_size, 1, 10**9)
        if self.observed is not None:
            validate_asset_key(self.observed)
        if self.tokens is not None:
            check_int(f"target {self.name} tokens", self.tokens, 1, 10**15)
            if self.width is None or self.batch_size is None:
                raise ValueError(f"target {self.name}: pinned tokens need a pinned width and batch_size")


DEFAULT_TARGETS = (Target("x3", 3.0), Target("x10", 10.0), Target("x30", 30.0))


@dataclass(frozen=True)
class Ladder:
    """The static shape of a ladder: budgets (FLOPs, all fitted), the widths tried at each,
    the seeds of every (budget, width) run, the family, and the targets it predicts.

    ``widths[i]`` are the model widths run at ``budgets[i]``. ``name`` prefixes its asset keys
    (``scaling/<name>/...``) and its pre-registration locks.
    """

    name: str
    budgets: tuple[float, ...]
    widths: tuple[tuple[int, ...], ...]
    targets: tuple[Target, ...] = DEFAULT_TARGETS
    family: FamilyShape = FamilyShape()
    seeds: tuple[int, ...] = (0,)
    max_relative_error: float = 0.05  # the comparison's check fails above this |predicted - actual| / actual

    def __post_init__(self) -> None:
        validate_segment(self.name, "ladder name")
        if len(self.budgets) < 2:
            raise ValueError(f"Ladder {self.name}: need >= 2 budgets for the power laws, got {len(self.budgets)}")
        if len(self.widths) != len(self.budgets):
            raise ValueError(f"Ladder {self.name}: {len(self.budgets)} budgets but {len(self.widths)} width lists")
        labels = [budget_label(b) for b in self.budgets]
        if len(set(labels)) != len(labels) or list(self.budgets) != sorted(self.budgets):
            raise ValueError(f"Ladder {self.name} budgets must be increasing and distinct at 2 significant digits: {labels}")
        for b, ws in zip(labels, self.widths, strict=True):
            if len(set(ws)) != len(ws) or len(ws) < 3:
                raise ValueError(f"Ladder {self.name} budget {b}: need >= 3 distinct widths, got {ws}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds) or min(self.seeds) < 0:
            raise ValueError(f"Ladder {self.name}: seeds must be distinct ints >= 0, got {self.seeds}")
        names = [t.name for t in self.targets]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"Ladder {self.name}: need >= 1 target with distinct names, got {names}")
        check_float(f"Ladder {self.name} max_relative_error", self.max_relative_error, 0, 1, lo_open=True)

    @property
    def c_fit(self) -> float:
        """The largest fitted budget: the targets are multiples of it."""
        return max(self.budgets)

    def target(self, name: str) -> Target:
        for t in self.targets:
            if t.name == name:
                return t
        raise KeyError(f"ladder {self.name}: no target {name!r}; targets: {[t.name for t in self.targets]}")

    def keys(self) -> list[str]:
        """Every sweep partition: one per (budget, width, seed)."""
        return [partition_key(b, w, s) for b, ws in zip(self.budgets, self.widths, strict=True) for w in ws for s in self.seeds]

    @property
    def target_keys(self) -> list[str]:
        return [t.name for t in self.targets]


# ---------------------------------------------------------------- fit


def runs_from_counts(counts_by_key: Mapping[str, Mapping[str, Any]]):
    """The fits' ``Runs`` from sweep partitions' counts: one row per (budget, width), its loss
    the mean validation loss over the ladder's seeds. Returns (runs, the point of each row)."""
    points = seed_groups(counts_by_key)
    rows = sorted(points)
    first = {name: [counts_by_key[points[p][0]].get(name) for p in rows] for name in ("params", "tokens", "flops")}
    loss = [float(np.mean([counts_by_key[k]["validation_loss"] for k in points[p]])) for p in rows]
    return validate_runs(first["params"], first["tokens"], first["flops"], loss, source="sweep"), rows


def seed_groups(counts_by_key: Mapping[str, Any]) -> dict[str, list[str]]:
    """{"C<budget>-d<width>": its partition keys, one per seed}."""
    out: dict[str, list[str]] = {}
    for key in sorted(counts_by_key):
        budget, width, _ = parse_seeded_key(key)
        out.setdefault(partition_key(budget, width), []).append(key)
    return out


def loss_law(result) -> dict:
    """How the optimum's loss extrapolates: the envelope E + A C^-alpha when it was fitted
    (>= 3 budgets), else a pure power law L = k C^a through the optima (stated as such)."""
    if result.envelope is not None:
        e = result.envelope
        return {"kind": "envelope", "E": e.E, "A": e.A, "alpha": e.alpha}
    law = fit_power_law([o.budget for o in result.optima], [o.loss_opt for o in result.optima])
    return {"kind": "power_law", "k": law.k, "exponent": law.exponent, "note": result.envelope_note}


def loss_at(law: Mapping[str, Any], budget: float) -> float:
    if law["kind"] == "envelope":
        return float(law["E"] + law["A"] * budget ** (-law["alpha"]))
    return float(law["k"] * budget ** law["exponent"])


def fit_summary_of(result) -> dict:
    """What a prediction needs of an IsoFLOP fit: its laws, optima and the parabolas' mean
    curvature in log10(N) (how fast the loss rises away from N* at a fixed budget)."""
    curvature = float(np.mean([o.fit_params.a for o in result.optima]))
    return result.as_dict() | {"loss_law": loss_law(result), "curvature_log10_params": curvature}


def select_budgets(counts: Mapping[str, Mapping[str, Any]], fit_budgets: Sequence[str]) -> dict:
    """The runs of the named budget labels ([] = all); unknown labels are an error."""
    if not fit_budgets:
        return dict(counts)
    have = {budget_label(parse_partition_key(k)[0]) for k in counts}
    unknown = sorted(set(fit_budgets) - have)
    if unknown:
        raise ValueError(f"scaling_fit: fit_budgets {unknown} are not among the budgets it reads {sorted(have)}")
    return {k: c for k, c in counts.items() if budget_label(parse_partition_key(k)[0]) in fit_budgets}


def fit_ladder(
    counts: Mapping[str, Mapping[str, Any]],
    config: IsoFlopConfig,
    *,
    extrapolate_to: float,
    out_dir: str,
    log: Callable[[str], None] = print,
) -> dict:
    """IsoFLOP fit of the runs (seeds averaged per point): writes fit.json, isoflop.png and
    power_laws.png; returns counts."""
    runs, _ = runs_from_counts(counts)
    result = fit_isoflop(runs, config)
    summary = fit_summary_of(result) | {
        "runs": [dict(counts[k]) | {"partition": k} for k in sorted(counts)],
        "extrapolate_to": extrapolate_to,
        "isoflop_config": dataclasses.asdict(config),
    }
    write_file(out_dir, "fit.json", json.dumps(summary, indent=1, default=float))
    write_file(out_dir, "isoflop.png", plot_isoflop_curves(runs, result, bucket_base=config.bucket_base))
    write_file(out_dir, "power_laws.png", plot_power_laws(result, extrapolate_to=extrapolate_to))
    for ex in result.excluded_budgets:
        log(f"scaling_fit: budget {ex['budget']:.3g} excluded: {ex['reason']}")
    law = summary["loss_law"]
    log(
        f"scaling_fit: N* ~ C^{result.n_opt.exponent:.3f}, D* ~ C^{result.d_opt.exponent:.3f} "
        f"from {len(result.optima)} budgets; loss law {law}"
    )
    return {
        "runs": len(counts),
        "points": len(runs),
        "budgets_fitted": len(result.optima),
        "budgets_excluded": len(result.excluded_budgets),
        "n_opt_exponent": result.n_opt.exponent,
        "d_opt_exponent": result.d_opt.exponent,
        "loss_law": law["kind"],
    }
