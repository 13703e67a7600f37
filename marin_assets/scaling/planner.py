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

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from marin_assets.numeric_checks import check_float, check_int
from marin_assets.scaling.data import bucket_flops

_MAX_INT = 10**9


@dataclass(frozen=True)
class ModelFamily:
    """A family of dense decoders indexed by width; the other shapes follow from it."""

    widths: tuple[int, ...]
    vocab_size: int
    seq_len: int
    head_dim: int = 64
    aspect_ratio: float = 64.0  # d_model / n_layers (Kaplan-style shape rule)
    min_layers: int = 1
    ff_mult: float = 4.0  # SwiGLU hidden width = ff_mult * d_model, rounded to a multiple of 8
    batch_sizes: tuple[int, ...] = (8, 16, 32, 64, 128, 256, 512)  # sequences per step
    min_steps: int = 50
    # LR shrinks as 1/width past a reference width (muP-style rule for Adam on hidden weights).
    lr_base: float = 3e-3
    lr_ref_width: int = 256
    model_overrides: dict = field(default_factory=dict)  # extra ModelConfig fields, e.g. MoE settings

    def __post_init__(self) -> None:
        for name in ("vocab_size", "seq_len", "head_dim", "min_layers", "min_steps", "lr_ref_width"):
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
        check_float("ModelFamily.lr_base", self.lr_base, 0, 10, lo_open=True)

    def shape(self, width: int) -> tuple[int, int, int]:
        """(width, depth, heads) for a width."""
        depth = max(self.min_layers, round(width / self.aspect_ratio))
        return width, depth, width // self.head_dim

    def learning_rate(self, width: int) -> float:
        return self.lr_base * min(1.0, self.lr_ref_width / width)

    def build_config(self, width: int, depth: int, heads: int) -> Any:
        from marin_assets.model import ModelConfig

        d_ff = max(8, int(round(self.ff_mult * width / 8)) * 8)
        fields = dict(vocab_size=self.vocab_size, d_model=width, n_layers=depth, n_heads=heads,
                      n_kv_heads=heads, d_ff=d_ff, n_routed_experts=0, max_seq_len=self.seq_len)
        fields.update(self.model_overrides)
        return ModelConfig(**fields)


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

    @property
    def name(self) -> str:
        return f"d{self.width}-L{self.depth}"

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("budget", "width", "depth", "heads", "batch_size", "steps",
                                              "learning_rate", "tokens", "flops", "params")} | {"name": self.name}


@dataclass
class SweepPlan:
    candidates: list[SweepCandidate]
    skipped: list[dict]  # {"budget", "width", "reason"}

    def by_budget(self) -> dict[float, list[SweepCandidate]]:
        out: dict[float, list[SweepCandidate]] = {}
        for c in self.candidates:
            out.setdefault(c.budget, []).append(c)
        return out


def _default_flops_per_token(config, seq_len: int) -> float:
    from marin_assets.model import flops_per_token

    return flops_per_token(config, seq_len)


def _default_param_count(config) -> float:
    from marin_assets.model import count_params

    return float(count_params(config)[1])  # active parameters: what a token pays for


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
    fpt_fn = flops_per_token or _default_flops_per_token
    count_fn = param_count or _default_param_count
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
                skipped.append({"budget": budget, "width": width,
                                "reason": f"no batch size reaches the budget: {'; '.join(reasons)}"})
                continue
            batch, steps, spent = choice
            candidates.append(SweepCandidate(
                budget=budget, width=width, depth=depth, heads=heads, batch_size=batch, steps=steps,
                learning_rate=family.learning_rate(width), tokens=batch * family.seq_len * steps,
                flops=spent, params=float(count_fn(config)), config=config,
            ))
    return SweepPlan(candidates, skipped)
