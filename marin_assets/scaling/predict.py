"""Extrapolation: the compute-optimal config and expected loss at a budget larger than the sweep."""

from __future__ import annotations

import math
from dataclasses import dataclass

from marin_assets.scaling.fits import IsoFlopResult
from marin_assets.scaling.parametric import ParametricFit


@dataclass(frozen=True)
class Prediction:
    budget: float
    params_opt: float  # N* from the IsoFLOP power law
    tokens_opt: float  # D* from the IsoFLOP power law
    loss: float  # expected loss from the envelope L(C) (NaN when there is no envelope)

    def as_dict(self) -> dict:
        return {"budget": self.budget, "params_opt": self.params_opt, "tokens_opt": self.tokens_opt, "loss": self.loss}


def predict_optimum(result: IsoFlopResult, budget: float) -> Prediction:
    """N* = k C^a and D* = k C^b from the power laws, loss from L(C) = E + A C^-alpha."""
    if not (budget > 0 and math.isfinite(budget)):
        raise ValueError(f"budget must be finite and > 0, got {budget}")
    n_star = float(result.n_opt(budget))
    d_star = float(result.d_opt(budget))
    if result.envelope is None:
        return Prediction(budget, n_star, d_star, math.nan)
    loss = float(result.envelope(budget))
    return Prediction(budget, n_star, d_star, loss)


def predict_parametric(fit: ParametricFit, budget: float) -> Prediction:
    """Compute-optimal (N, D) under C = 6 N D and the law's loss there."""
    n_opt, d_opt = fit.optimal_allocation(budget)
    return Prediction(budget, float(n_opt), float(d_opt), float(fit.predict(n_opt, d_opt)))


def relative_error(predicted: float, actual: float) -> float:
    """(predicted - actual) / actual: positive means the prediction was pessimistic (too high a loss)."""
    if not (actual != 0 and math.isfinite(actual) and math.isfinite(predicted)):
        raise ValueError(f"cannot compare predicted={predicted} with actual={actual}")
    return (predicted - actual) / actual
