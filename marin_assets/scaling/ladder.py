"""An IsoFLOP ladder and what is computed from its runs, without Dagster.

``Ladder`` is the static shape of a sweep (budgets, the widths run at each, which budgets
the fit sees); ``fit_ladder`` fits the smaller budgets' runs, ``predict_at`` extrapolates
the fit to the largest budget, and ``check_prediction`` compares the prediction with the
best run actually made there. The assets in ``assets/scaling.py`` are thin wrappers.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from marin_assets.knobs import knob
from marin_assets.numeric_checks import check_float, check_int
from marin_assets.scaling.sweep import budget_label, parse_partition_key, partition_key, sweep_family
from marin_assets.store import ArtifactRef

if TYPE_CHECKING:
    from marin_assets.scaling.fits import IsoFlopConfig


@dataclass(frozen=True)
class SweepSettings:
    """The settings of every run of a ladder (the family's shape rule, its training schedule and
    how it is scored) and of the config the prediction picks. The defaults are the demo's CPU
    ladder: tiny dense 1-layer models on a small-vocabulary tokenizer (assets/scaling.py says
    what was measured). Knobs (marin_assets/knobs.py): the ``sweep`` and ``prediction`` assets'
    configs are generated from them; ``marin_assets.scaling.sweep`` reads them as attributes."""

    vocab_size: int = knob(0, help="model vocabulary; 0 = the tokenizer's, read from the caches' stats.json")
    seq_len: int = knob(64, help="tokens per training sequence")
    head_dim: int = knob(8, help="width per attention head; widths are multiples of it")
    aspect_ratio: float = knob(128.0, help="d_model / n_layers; 128 keeps these tiny models at 1 layer")
    batch_sizes: list[int] = knob([16], help="sequences per step the planner may pick (small: more steps per FLOP)")
    min_steps: int = knob(50, help="fewest optimizer steps a planned run may take")
    tolerance: float = knob(0.04, help="planned FLOPs within this fraction of the budget")
    lr_base: float = knob(1e-2, help="peak LR; 2e-2 diverges on some of these runs, 4e-3 is noisier")
    lr_ref_width: int = knob(1024, help="LR shrinks as 1/width only above this width")
    decay_fraction: float = knob(0.2, help="WSD: last fraction of steps decays the LR")
    skip_sigma: float = knob(0.0, help="loss-spike skip test of the training guards; 0 = off. On these short "
                                       "mixed-source runs the test froze whole runs (hundreds of skipped steps)")
    seed: int = knob(0, help="model and data-order seed of every run")
    validation_windows: int = knob(256, help="held-out windows of seq_len per source")
    max_width: int = knob(512, help="widest family member the prediction may pick")

    def __post_init__(self) -> None:
        # The family's shape, batch sizes, LR and tolerance are checked by ModelFamily and plan_sweep.
        check_int("vocab_size (0 = the tokenizer's)", self.vocab_size, 0, 10**9)
        check_float("decay_fraction", self.decay_fraction, 0, 1)
        check_int("validation_windows", self.validation_windows, 1, 10**9)
        check_int("max_width", self.max_width, self.head_dim, 10**9)


@dataclass(frozen=True)
class Ladder:
    """The static shape of a sweep: budgets (FLOPs), the widths tried at each, which to fit on.

    ``widths[i]`` are the model widths run at ``budgets[i]``; ``fit_budgets`` are the budgets
    the fit sees (default: all but the largest, which is kept for the prediction check).
    """

    budgets: tuple[float, ...]
    widths: tuple[tuple[int, ...], ...]
    fit_budgets: tuple[float, ...] | None = None
    max_relative_error: float = 0.05  # the check fails above this |predicted - actual| / actual

    def __post_init__(self) -> None:
        if len(self.budgets) < 3:
            raise ValueError(f"Ladder needs >= 3 budgets (>= 2 to fit, 1 to predict), got {len(self.budgets)}")
        if len(self.widths) != len(self.budgets):
            raise ValueError(f"Ladder: {len(self.budgets)} budgets but {len(self.widths)} width lists")
        labels = [budget_label(b) for b in self.budgets]
        if len(set(labels)) != len(labels) or list(self.budgets) != sorted(self.budgets):
            raise ValueError(f"Ladder budgets must be increasing and distinct at 2 significant digits: {labels}")
        fit = self.fit_labels
        for b, ws in zip(labels, self.widths):
            if len(set(ws)) != len(ws) or not ws or (b in fit and len(ws) < 3):
                raise ValueError(f"Ladder budget {b}: need distinct widths, >= 3 on a fitted budget, got {ws}")
        if len(fit) < 2:
            raise ValueError(f"Ladder: need >= 2 fit budgets for the power laws, got {fit}")
        if not set(fit) <= set(labels):
            raise ValueError(f"Ladder.fit_budgets {sorted(set(fit) - set(labels))} are not ladder budgets {labels}")
        if self.target_label in fit:
            raise ValueError(f"Ladder: the predicted budget {self.target_label} must not be fitted on")
        if not (math.isfinite(self.max_relative_error) and self.max_relative_error > 0):
            raise ValueError(f"Ladder.max_relative_error must be finite and > 0, got {self.max_relative_error}")

    @property
    def fit_labels(self) -> list[str]:
        chosen = self.budgets[:-1] if self.fit_budgets is None else self.fit_budgets
        return [budget_label(b) for b in chosen]

    @property
    def target(self) -> float:
        return max(self.budgets)

    @property
    def target_label(self) -> str:
        return budget_label(self.target)

    def keys(self, labels: Sequence[str] | None = None) -> list[str]:
        wanted = set(labels) if labels is not None else None
        return [partition_key(b, w) for b, ws in zip(self.budgets, self.widths)
                if wanted is None or budget_label(b) in wanted for w in ws]

    @property
    def fit_keys(self) -> list[str]:
        return self.keys(self.fit_labels)

    @property
    def target_keys(self) -> list[str]:
        return self.keys([self.target_label])


# ---------------------------------------------------------------- artifact files


def read_json(ref: ArtifactRef, name: str) -> dict:
    return json.loads(read_bytes(ref, name))


def read_bytes(ref: ArtifactRef, name: str) -> bytes:
    import fsspec

    with fsspec.open(f"{ref.data_path.rstrip('/')}/{name}", "rb") as f:
        return f.read()


def write_file(root: str, name: str, data: str | bytes) -> None:
    """Write ``root/name`` (any fsspec URL): text or bytes."""
    import fsspec

    with fsspec.open(f"{root.rstrip('/')}/{name}", "w" if isinstance(data, str) else "wb") as f:
        f.write(data)


def tokenizer_vocab_size(tokenized: ArtifactRef) -> int:
    """The vocabulary the caches were tokenized with (each source's stats.json records it)."""
    sizes = {}
    for source in sorted(tokenized.counts.get("tokens", {})):
        try:
            sizes[source] = int(read_json(tokenized, f"{source}/stats.json")["vocab_size"])
        except (FileNotFoundError, KeyError) as e:
            raise ValueError(f"tokenized source {source!r}: no vocab_size in {tokenized.data_path}/{source}/stats.json "
                             f"({e!r}); set the sweep's vocab_size explicitly") from None
    if len(set(sizes.values())) != 1:
        raise ValueError(f"tokenized sources disagree on the vocabulary size: {sizes}")
    return sizes.popitem()[1]


def caches_of(tokenized: ArtifactRef, split: str) -> dict[str, str]:
    """{source: <data_path>/<source>/<split>} for every source the tokenized asset counted."""
    sources = sorted(tokenized.counts.get("tokens", {}))
    if not sources:
        raise ValueError(f"tokenized artifact {tokenized.path} lists no sources in counts['tokens']")
    return {s: f"{tokenized.data_path.rstrip('/')}/{s}/{split}" for s in sources}


# ---------------------------------------------------------------- fit


def runs_from_counts(counts_by_key: Mapping[str, Mapping[str, Any]]):
    """The fits' ``Runs`` from sweep partitions' counts (validation loss is the fitted loss)."""
    from marin_assets.scaling.data import validate_runs

    keys = sorted(counts_by_key)
    col = lambda name: [counts_by_key[k].get(name) for k in keys]
    return validate_runs(params=col("params"), tokens=col("tokens"), flops=col("flops"),
                         loss=col("validation_loss"), source="sweep"), keys


def loss_law(result) -> dict:
    """How the optimum's loss extrapolates: the envelope E + A C^-alpha when it was fitted
    (>= 3 budgets), else a pure power law L = k C^a through the optima (stated as such)."""
    from marin_assets.scaling.fits import fit_power_law

    if result.envelope is not None:
        e = result.envelope
        return {"kind": "envelope", "E": e.E, "A": e.A, "alpha": e.alpha}
    law = fit_power_law([o.budget for o in result.optima], [o.loss_opt for o in result.optima])
    return {"kind": "power_law", "k": law.k, "exponent": law.exponent, "note": result.envelope_note}


def loss_at(law: Mapping[str, Any], budget: float) -> float:
    if law["kind"] == "envelope":
        return float(law["E"] + law["A"] * budget ** (-law["alpha"]))
    return float(law["k"] * budget ** law["exponent"])


def select_budgets(counts: Mapping[str, Mapping[str, Any]], fit_budgets: Sequence[str]) -> dict:
    """The runs of the named budget labels ([] = all); unknown labels are an error."""
    if not fit_budgets:
        return dict(counts)
    have = {budget_label(parse_partition_key(k)[0]) for k in counts}
    unknown = sorted(set(fit_budgets) - have)
    if unknown:
        raise ValueError(f"scaling_fit: fit_budgets {unknown} are not among the budgets it reads {sorted(have)}")
    return {k: c for k, c in counts.items() if budget_label(parse_partition_key(k)[0]) in fit_budgets}


def fit_ladder(counts: Mapping[str, Mapping[str, Any]], config: IsoFlopConfig, *, target: float, out_dir: str,
               log: Callable[[str], None] = print) -> dict:
    """IsoFLOP fit of the runs: writes fit.json, isoflop.png and power_laws.png; returns counts."""
    from marin_assets.scaling.fits import fit_isoflop
    from marin_assets.scaling.plots import plot_isoflop_curves, plot_power_laws

    runs, keys = runs_from_counts(counts)
    result = fit_isoflop(runs, config)
    law = loss_law(result)
    summary = result.as_dict() | {"loss_law": law, "runs": [dict(counts[k]) | {"partition": k} for k in keys],
                                  "extrapolate_to": target}
    write_file(out_dir, "fit.json", json.dumps(summary, indent=1, default=float))
    write_file(out_dir, "isoflop.png", plot_isoflop_curves(runs, result, bucket_base=config.bucket_base))
    write_file(out_dir, "power_laws.png", plot_power_laws(result, extrapolate_to=target))
    for ex in result.excluded_budgets:
        log(f"scaling_fit: budget {ex['budget']:.3g} excluded: {ex['reason']}")
    log(f"scaling_fit: N* ~ C^{result.n_opt.exponent:.3f}, D* ~ C^{result.d_opt.exponent:.3f} "
        f"from {len(result.optima)} budgets; loss law {law}")
    return {"runs": len(runs), "budgets_fitted": len(result.optima), "budgets_excluded": len(result.excluded_budgets),
            "n_opt_exponent": result.n_opt.exponent, "d_opt_exponent": result.d_opt.exponent, "loss_law": law["kind"]}


# ---------------------------------------------------------------- prediction and its check


def nearest_config(budget: float, params_opt: float, settings: SweepSettings, vocab_size: int) -> dict | None:
    """The family member (planned at ``budget``) whose parameter count is closest to N*: the
    sweep's family, with every width from head_dim to ``settings.max_width`` and the fitted
    runs' vocabulary."""
    from marin_assets.scaling.planner import plan_sweep

    widths = tuple(range(settings.head_dim, settings.max_width + 1, settings.head_dim))
    family = dataclasses.replace(sweep_family(widths[0], dataclasses.replace(settings, vocab_size=vocab_size)),
                                 widths=widths)
    plan = plan_sweep([budget], family, tolerance=settings.tolerance)
    if not plan.candidates:
        return None
    return min(plan.candidates, key=lambda c: abs(math.log(c.params / params_opt))).as_dict()


def predict_at(fit_summary: Mapping[str, Any], target: float, target_label: str, settings: SweepSettings) -> dict:
    """N*, D*, loss and the nearest family config at the target budget, from fit.json's summary."""
    from marin_assets.scaling.data import bucket_flops

    vocabs = {r["vocab_size"] for r in fit_summary["runs"]}
    if len(vocabs) != 1:
        raise ValueError(f"prediction: the fitted runs used different vocabularies {sorted(vocabs)}")
    budget = bucket_flops(target)  # the bucket the target's runs are planned into
    n_star = fit_summary["n_opt_coefficient"] * budget ** fit_summary["n_opt_exponent"]
    d_star = fit_summary["d_opt_coefficient"] * budget ** fit_summary["d_opt_exponent"]
    law = fit_summary["loss_law"]
    in_sample = [{"budget": o["budget"], "predicted": loss_at(law, o["budget"]), "vertex_loss": o["loss_opt"]}
                 for o in fit_summary["optima"]]
    return {"budget": budget, "budget_label": target_label, "params_opt": n_star, "tokens_opt": d_star,
            "loss": loss_at(law, budget), "loss_law": law, "in_sample": in_sample,
            "config": nearest_config(budget, n_star, settings, vocabs.pop())}


def check_prediction(pred: Mapping[str, Any], actual: Mapping[str, Mapping[str, Any] | None], bound: float) -> dict:
    """Compare the prediction with the best actual run at its budget.

    ``actual`` maps the target's partition keys to their counts (None: not run yet).
    Returns {"missing": [...]} while runs are missing, else the error and its evidence."""
    missing = sorted(k for k, c in actual.items() if c is None)
    if missing:
        return {"missing": missing}
    present = {k: c for k, c in actual.items() if c is not None}
    best_key = min(present, key=lambda k: present[k]["validation_loss"])
    best = present[best_key]
    from marin_assets.scaling.predict import relative_error

    error = relative_error(pred["loss"], best["validation_loss"])
    return {"missing": [], "relative_error": float(error), "passed": abs(error) <= bound, "bound": bound,
            "predicted_loss": float(pred["loss"]), "actual_loss": float(best["validation_loss"]),
            "actual_best_partition": best_key, "predicted_params": float(pred["params_opt"]),
            "actual_best_params": float(best["params"]),
            "actual_runs": {k: c["validation_loss"] for k, c in sorted(present.items())}}


def predicted_vs_actual_png(pred: Mapping[str, Any], actual_loss: float) -> bytes:
    """The fitted budgets (envelope vs parabola vertex, in sample) and the target (out of sample)."""
    from marin_assets.scaling.plots import plot_predicted_vs_actual

    budgets = [p["budget"] for p in pred["in_sample"]] + [pred["budget"]]
    predicted = [p["predicted"] for p in pred["in_sample"]] + [pred["loss"]]
    actual = [p["vertex_loss"] for p in pred["in_sample"]] + [actual_loss]
    return plot_predicted_vs_actual(budgets, predicted, actual)
