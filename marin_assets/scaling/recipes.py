"""Scaling recipes as data: how a ladder run's optimizer, initialisation and peak LR follow
from its width and its length.

A ``Recipe`` is one frozen record; the planner asks it for each planned run's learning rate
(``learning_rate(width, steps)``), its optimizer config and the model fields it sets. Two are
named, as in Marin's Delphi:

- ``v1``: AdamW with decoupled weight decay 0.1 and a peak LR that shrinks as 1/width only
  past a reference width and ignores run length (the planner's rule before recipes existed;
  its numbers are unchanged).
- ``v2``: AdamH (``marin_assets/train/optimizers.py``: every hidden matrix and the head keep
  their Frobenius norm, so there is no weight decay to tune), matrices initialised at the
  fan-in scale, and a peak LR

      lr = lr_base * (lr_ref_width / width)^(1/2) * (lr_ref_steps / steps)^(1/2)

  whose ``lr_base`` is re-tuned by the ``lr_sweep`` asset at the reference shape.

Why these exponents. Our AdamH takes an Adam step and projects each matrix back to its norm,
so what matters is the step's share of that norm. A matrix initialised at std
``width^-1/2`` has norm ``width^-1/2 sqrt(m n)``; an Adam step of RMS ``lr`` has norm
``lr sqrt(m n)``: the share is ``lr sqrt(width)``, and the same holds for an embedding row
(plain Adam, normalised before use). ``width^-1/2`` keeps every group's relative step the
same at every width. Run length: Marin's public "Complete(d) AdamH scaling recipe for
IsoFLOP sweeps" (marin-community/marin, ``CompletedAdamHRecipe``) scales AdamH's LR as
``sqrt(r / r0)`` with ``r = batch tokens / run tokens = 1 / steps``; we take the same
``steps^-1/2`` (it keeps ``lr sqrt(steps)``, the distance a random walk of steps covers on
the sphere, fixed). Why the init: AdamH never changes a matrix's norm, so the init is the
model's scale for good; at the default std 0.02 a width-16 head can never make sharp logits
(measured: held-out loss 4.50 after 150 steps at lr 1e-2 vs 2.31 at the fan-in scale).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from marin_assets.numeric_checks import check_float, check_int
from marin_assets.train.config import OPTIMIZER_NAMES, OptimizerConfig

_MAX_INT = 10**9


@dataclass(frozen=True)
class Recipe:
    """One scaling recipe: optimizer, initialisation and the LR rule over (width, steps).

    ``lr = lr_base * min(width_factor_cap, (lr_ref_width / width)^width_exponent)
    * (lr_ref_steps / steps)^steps_exponent``; ``steps_exponent`` 0 ignores run length and a
    ``width_factor_cap`` of None leaves the width factor uncapped."""

    name: str
    optimizer: str  # OptimizerConfig.name
    weight_decay: float  # AdamW's decoupled decay; 0 where the optimizer has none (AdamH)
    lr_base: float  # peak LR at the reference point
    lr_ref_width: int
    width_exponent: float
    width_factor_cap: float | None  # v1 only ever shrinks the LR (cap 1); None: the power law both ways
    lr_ref_steps: int
    steps_exponent: float
    init_fan_in: bool  # matrices and embeddings at std width^-1/2 (else the model's default)
    tuned_by_sweep: bool  # lr_base is re-tuned by the lr_sweep asset at (lr_ref_width, lr_ref_steps)

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZER_NAMES:
            raise ValueError(f"recipe {self.name!r}: optimizer must be one of {OPTIMIZER_NAMES}, got {self.optimizer!r}")
        check_float(f"recipe {self.name!r} weight_decay", self.weight_decay, 0, 10)
        check_float(f"recipe {self.name!r} lr_base", self.lr_base, 0, 10, lo_open=True)
        check_int(f"recipe {self.name!r} lr_ref_width", self.lr_ref_width, 1, _MAX_INT)
        check_int(f"recipe {self.name!r} lr_ref_steps", self.lr_ref_steps, 1, _MAX_INT)
        check_float(f"recipe {self.name!r} width_exponent", self.width_exponent, 0, 4)
        check_float(f"recipe {self.name!r} steps_exponent", self.steps_exponent, 0, 4)
        if self.width_factor_cap is not None:
            check_float(f"recipe {self.name!r} width_factor_cap", self.width_factor_cap, 0, 1e9, lo_open=True)
        if self.optimizer == "adamh" and self.weight_decay:
            raise ValueError(
                f"recipe {self.name!r}: AdamH keeps each matrix's norm, so it has no weight decay to "
                f"set (got {self.weight_decay})"
            )

    def learning_rate(self, width: int, steps: int) -> float:
        """Peak LR of a run of ``width`` trained for ``steps`` optimizer steps."""
        check_int("width", width, 1, _MAX_INT)
        check_int("steps", steps, 1, _MAX_INT)
        width_factor = (self.lr_ref_width / width) ** self.width_exponent
        if self.width_factor_cap is not None:
            width_factor = min(self.width_factor_cap, width_factor)
        steps_factor = (self.lr_ref_steps / steps) ** self.steps_exponent
        return self.lr_base * width_factor * steps_factor

    def optimizer_config(self) -> Any:
        """The run's ``OptimizerConfig`` (only the fields the recipe sets; the rest default)."""

        return OptimizerConfig(name=self.optimizer, weight_decay=self.weight_decay)

    def model_fields(self, width: int) -> dict[str, Any]:
        """ModelConfig fields the recipe sets for a model of ``width``."""
        return {"init_std": width**-0.5} if self.init_fan_in else {}

    def with_base(self, lr_base: float) -> Recipe:
        """The same recipe with its reference LR re-tuned (the lr_sweep asset's best)."""
        return dataclasses.replace(self, lr_base=lr_base)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# Today's planner, unchanged: AdamW (weight decay 0.1), the sweep's peak LR 1e-2, shrinking as
# 1/width only past width 1024 (the demo's 1-layer CPU ladder never reaches it).
V1 = Recipe(
    name="v1",
    optimizer="adamw",
    weight_decay=0.1,
    lr_base=1e-2,
    lr_ref_width=1024,
    width_exponent=1.0,
    width_factor_cap=1.0,
    lr_ref_steps=1,
    steps_exponent=0.0,
    init_fan_in=False,
    tuned_by_sweep=False,
)

# lr_base is the best of the lr_sweep at width 16 x 150 steps (batch 16 x 64 tokens) on the
# standard-library corpus, measured when the recipe was written: 3e-2 (held-out loss 2.189;
# 1e-2: 2.306, 6e-2: 2.215, 1.2e-1: 2.248). The lr_sweep asset re-tunes it on the ladder's data.
V2 = Recipe(
    name="v2",
    optimizer="adamh",
    weight_decay=0.0,
    lr_base=3e-2,
    lr_ref_width=16,
    width_exponent=0.5,
    width_factor_cap=None,
    lr_ref_steps=150,
    steps_exponent=0.5,
    init_fan_in=True,
    tuned_by_sweep=True,
)

RECIPES: dict[str, Recipe] = {r.name: r for r in (V1, V2)}


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name``; a clear error naming the known ones otherwise."""
    if name not in RECIPES:
        raise ValueError(f"unknown scaling recipe {name!r}; known: {sorted(RECIPES)}")
    return RECIPES[name]
