"""IsoFLOP sweep planner: for each compute budget, the model sizes and schedules that spend it.

For a budget C and a width w the family fixes the rest of the architecture (depth from an
aspect ratio, heads from a head size), the model's FLOP counter gives training FLOPs per token
f, and the run needs C / f tokens. We pick the largest allowed batch that still leaves at least
``min_steps`` optimizer steps, round the steps, and keep the candidate only if the FLOPs it will
actually spend, f * batch * seq_len * steps, are within ``tolerance`` of C. Everything that does
not fit is reported in ``skipped`` with the reason.

Budgets are snapped to Marin's log-spaced buckets (nearest power of 1.1) and the tolerance must
be narrower than half a bucket, so every planned run lands in its own budget's bucket when the
fits group runs by bucket later.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from marin_assets.model import ModelConfig, count_params, flops_per_token
from marin_assets.numeric_checks import check_float, check_int
from marin_assets.scaling.data import bucket_flops
from marin_assets.scaling.recipes import V1, Recipe

_MAX_INT = 10**9


@dataclass(frozen=True)
class MoeShape:
    """The routed part of an MoE family, as ratios of the width (the main run's shape, scaled)."""

    routed_experts: int
    shared_experts: int
    top_k: int
    expert_ff_mult: float  # routed expert width = expert_ff_mult * d_model
    # The router (ModelConfig.router_gating / balancing, which check the values). The defaults are ModelConfig's,
    # which every family recorded before these fields existed trained with, so a recorded family reads as it ran.
    router_gating: str = "sigmoid"
    balancing: str = "quantile_exact"

    def __post_init__(self) -> None:
        check_int("MoeShape.routed_experts", self.routed_experts, 1, 4096)
        check_int("MoeShape.shared_experts", self.shared_experts, 0, 64)
        check_int("MoeShape.top_k", self.top_k, 1, self.routed_experts)
        check_float("MoeShape.expert_ff_mult", self.expert_ff_mult, 0, 1e3, lo_open=True)


@dataclass(frozen=True)
class FamilyShape:
    """How a ladder's models follow from their width: the shape fields of ``ModelFamily``."""

    head_dim: int = 8
    aspect_ratio: float = 128.0  # d_model / n_layers; 128 keeps tiny CPU models at 1 layer
    ff_mult: float = 4.0
    kv_group: int = 1
    moe: MoeShape | None = None

    def family(self, widths: tuple[int, ...], **fields: Any) -> ModelFamily:
        """The ModelFamily of these widths with this shape (``fields``: its other fields)."""
        return ModelFamily(
            widths=widths,
            head_dim=self.head_dim,
            aspect_ratio=self.aspect_ratio,
            ff_mult=self.ff_mult,
            kv_group=self.kv_group,
            moe=self.moe,
            **fields,
        )

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ModelFamily:
    """A family of decoders (dense, or MoE with ``moe``) indexed by width; the other shapes follow from it,
    and the ``recipe`` gives each planned run its optimizer, init and peak LR."""

    widths: tuple[int, ...]
    vocab_size: int
    seq_len: int
    head_dim: int = 64
    aspect_ratio: float = 64.0  # d_model / n_layers (Kaplan-style shape rule)
    min_layers: int = 1
    ff_mult: float = 4.0  # SwiGLU hidden width = ff_mult * d_model, rounded to a multiple of 8
    batch_sizes: tuple[int, ...] = (8, 16, 32, 64, 128, 256, 512)  # sequences per step
    min_steps: int = 50
    # The optimizer, init and LR rule over (width, steps): marin_assets/scaling/recipes.py.
    recipe: Recipe = V1
    model_overrides: dict = field(default_factory=dict)  # extra ModelConfig fields, e.g. MoE settings
    moe: MoeShape | None = None  # None: dense
    kv_group: int = 1  # query heads per key/value head (grouped-query attention)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "seq_len", "head_dim", "min_layers", "min_steps", "kv_group"):
            check_int(f"ModelFamily.{name}", getattr(self, name), 1, _MAX_INT)
        if not self.widths:
            raise ValueError("ModelFamily.widths is empty")
        for i, w in enumerate(self.widths):
            check_int(f"ModelFamily.widths[{i}]", w, 1, _MAX_INT)
            if w % self.head_dim:
                raise ValueError(f"ModelFamily: width {w} must be a positive multiple of head_dim {self.head_dim}")
        if not self.batch_sizes:
            raise ValueError("ModelFamily.batch_sizes is empty")
        for i, batch in enumerate(self.batch_sizes):
            check_int(f"ModelFamily.batch_sizes[{i}]", batch, 1, _MAX_INT)
        check_float("ModelFamily.aspect_ratio", self.aspect_ratio, 0, 1e6, lo_open=True)
        check_float("ModelFamily.ff_mult", self.ff_mult, 0, 1e3, lo_open=True)
        if not isinstance(self.recipe, Recipe):
            raise ValueError(f"ModelFamily.recipe must be a Recipe, got {self.recipe!r}")

    def shape(self, width: int) -> tuple[int, int, int]:
        """(width, depth, heads) for a width."""
        depth = max(self.min_layers, round(width / self.aspect_ratio))
        return width, depth, width // self.head_dim

    def learning_rate(self, width: int, steps: int) -> float:
        """The recipe's peak LR for a run of ``width`` and ``steps`` optimizer steps."""
        return self.recipe.learning_rate(width, steps)

    def build_config(self, width: int, depth: int, heads: int) -> Any:
        kv_heads = max(1, heads // self.kv_group)
        fields: dict[str, Any] = dict(
            vocab_size=self.vocab_size,
            d_model=width,
            n_layers=depth,
            n_heads=heads,
            n_kv_heads=kv_heads if heads % kv_heads == 0 else heads,
            d_ff=_round8(self.ff_mult * width),
            n_routed_experts=0,
            max_seq_len=self.seq_len,
        )
        if self.moe is not None:
            fields.update(
                n_routed_experts=self.moe.routed_experts,
                n_shared_experts=self.moe.shared_experts,
                top_k=self.moe.top_k,
                expert_d_ff=_round8(self.moe.expert_ff_mult * width),
                router_gating=self.moe.router_gating,
                balancing=self.moe.balancing,
            )
        fields.update(self.recipe.model_fields(width))
        fields.update(self.model_overrides)
        return ModelConfig(**fields)


def _round8(width: float) -> int:
    """A hidden width: a multiple of 8, at least 8."""
    return max(8, int(round(width / 8)) * 8)


@dataclass(frozen=True)
class SweepCandidate:
    budget: float  # bucketed budget this run belongs to
    width: int
    depth: int
    heads: int
    batch_size: int
    steps: int
    learning_rate: float
    tokens: int  # batch_size * seq_len * steps
    flops: float  # training FLOPs actually spent
    params: float  # N used in the fits
    config: Any  # the model config (ModelConfig by default)
    recipe: str = "v1"  # the recipe's name (marin_assets/scaling/recipes.py)
    optimizer: Any = None  # the recipe's OptimizerConfig

    @property
    def name(self) -> str:
        return f"d{self.width}-L{self.depth}"

    def as_dict(self) -> dict:
        return {
            k: getattr(self, k)
            for k in (
                "budget",
                "width",
                "depth",
                "heads",
                "batch_size",
                "steps",
                "learning_rate",
                "tokens",
                "flops",
                "params",
                "recipe",
            )
        } | {"name": self.name}


@dataclass
class SweepPlan:
    candidates: list[SweepCandidate]
    skipped: list[dict]  # {"budget", "width", "reason"}

    def by_budget(self) -> dict[float, list[SweepCandidate]]:
        out: dict[float, list[SweepCandidate]] = {}
        for c in self.candidates:
            out.setdefault(c.budget, []).append(c)
        return out


def training_flops_per_token(config, seq_len: int) -> float:
    """Training FLOPs per token of a ModelConfig (the planner's default counter)."""

    return float(flops_per_token(config, seq_len))


def active_params(config) -> float:
    """Active parameters of a ModelConfig: what a token pays for (the N of the fits)."""

    return float(count_params(config)[1])


def plan_sweep(
    budgets: Sequence[float],
    family: ModelFamily,
    tolerance: float = 0.04,
    bucket_base: float = 1.1,
    flops_per_token: Callable[[Any, int], float] | None = None,
    param_count: Callable[[Any], float] | None = None,
    build_config: Callable[[int, int, int], Any] | None = None,
) -> SweepPlan:
    """Candidates (width, depth, heads, batch, steps, LR) whose training FLOPs hit each budget.

    ``flops_per_token(config, seq_len)`` must return TRAINING FLOPs per token (forward and
    backward), as ``marin_assets.model.flops_per_token`` does; it, ``param_count`` and
    ``build_config`` are injectable so other model families can be planned.
    """
    check_float("bucket_base", bucket_base, 1, 10, lo_open=True)
    check_float("tolerance", tolerance, 0, 1, lo_open=True)
    half_bucket = math.sqrt(bucket_base) - 1.0
    if not 0 < tolerance < half_bucket:
        raise ValueError(
            f"tolerance must be in (0, {half_bucket:.4f}) so runs stay in their budget's bucket "
            f"(base {bucket_base}); got {tolerance}"
        )
    fpt_fn = flops_per_token or training_flops_per_token
    count_fn = param_count or active_params
    build = build_config or family.build_config

    candidates: list[SweepCandidate] = []
    skipped: list[dict] = []
    for requested in budgets:
        check_float("budget", requested, 0, 1e40, lo_open=True)
        budget = bucket_flops(requested, bucket_base)
        for width in family.widths:
            width, depth, heads = family.shape(width)
            config = build(width, depth, heads)
            fpt = float(fpt_fn(config, family.seq_len))
            tokens_needed = budget / fpt
            choice, reasons = None, []
            for batch in sorted(family.batch_sizes, reverse=True):
                steps = round(tokens_needed / (batch * family.seq_len))
                if steps < family.min_steps:
                    reasons.append(f"batch {batch}: {steps} steps < min_steps {family.min_steps}")
                    continue
                spent = fpt * batch * family.seq_len * steps
                if abs(spent / budget - 1.0) > tolerance:
                    reasons.append(f"batch {batch}: {spent:.3g} FLOPs is {100 * (spent / budget - 1):+.1f}% off")
                    continue
                choice = (batch, steps, spent)
                break
            if choice is None:
                skipped.append(
                    {"budget": budget, "width": width, "reason": f"no batch size reaches the budget: {'; '.join(reasons)}"}
                )
                continue
            batch, steps, spent = choice
            candidates.append(
                SweepCandidate(
                    budget=budget,
                    width=width,
                    depth=depth,
                    heads=heads,
                    batch_size=batch,
                    steps=steps,
                    learning_rate=family.learning_rate(width, steps),
                    tokens=batch * family.seq_len * steps,
                    flops=spent,
                    params=float(count_fn(config)),
                    config=config,
                    recipe=family.recipe.name,
                    optimizer=family.recipe.optimizer_config(),
                )
            )
    return SweepPlan(candidates, skipped)
