"""IsoFLOP analysis ("approach 2"): per-budget robust quadratics, power laws, loss envelope.

For each compute budget C the runs trade model size against tokens at fixed C. Loss is fitted
as a quadratic in log10(D) (and separately in log10(N)) with a Huber loss, so one diverged run
cannot drag the parabola; the vertex is that budget's optimum. A budget is only used when the
optimum is real: at least ``min_points`` runs, an upward parabola (a > 0) and the vertex strictly
inside the sampled range. Otherwise it is excluded with the reason, never silently.

The optima then give N* = k C^a and D* = k C^b by a straight line in log10-log10 space, and the
loss at the optima gives the envelope L(C) = E + A C^-alpha used to extrapolate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from marin_assets.knobs import knob
from marin_assets.numeric_checks import check_float, check_int
from marin_assets.scaling.bootstrap import BootstrapConfig, bootstrap
from marin_assets.scaling.data import SUBSAMPLE_SEED, Runs, bucket_flops, deterministic_subsample

# ---------------------------------------------------------------- robust quadratic


@dataclass(frozen=True)
class QuadraticFit:
    """y = a u^2 + b u + c with u = log10(x), fitted on x in [x_min, x_max]."""

    a: float
    b: float
    c: float
    x_min: float
    x_max: float

    @property
    def vertex_log10(self) -> float:
        return -self.b / (2.0 * self.a) if self.a != 0 else math.nan

    def __call__(self, x) -> np.ndarray:
        u = np.log10(np.asarray(x, dtype=np.float64))
        return self.a * u * u + self.b * u + self.c

    def interior_minimum(self) -> tuple[bool, str]:
        """(True, "") when the parabola opens upward with its vertex strictly inside the data."""
        if not self.a > 0:
            return False, f"not convex: quadratic coefficient {self.a:.3g} <= 0, no minimum"
        v = self.vertex_log10
        lo, hi = math.log10(self.x_min), math.log10(self.x_max)
        if not lo < v < hi:
            return False, f"minimum at 10^{v:.3f} outside the sampled range [10^{lo:.3f}, 10^{hi:.3f}]"
        return True, ""


def _huber(r: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    abs_r = np.abs(r)
    value = np.where(abs_r <= delta, 0.5 * r * r, delta * (abs_r - 0.5 * delta))
    return value, np.clip(r, -delta, delta)


def fit_robust_quadratic(x, y, delta: float = 0.01) -> QuadraticFit:
    """Huber-loss quadratic in log10(x), started from the least-squares fit.

    ``delta`` is in loss units: residuals above it count linearly. Good IsoFLOP points sit within
    ~1e-3..1e-2 of their parabola, so 0.01 keeps those quadratic and discounts a bad run.
    """
    from scipy.optimize import minimize

    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.size < 3:
        raise ValueError(f"a quadratic needs >= 3 points, got {x.size}")
    u = np.log10(x)
    # Centre u so the three coefficients are on comparable scales for BFGS.
    mu = float(u.mean())
    v = u - mu
    design = np.stack([v * v, v, np.ones_like(v)], axis=1)

    def objective(theta):
        r = design @ theta - y
        value, slope = _huber(r, delta)
        return float(value.sum()), design.T @ slope

    init = np.linalg.lstsq(design, y, rcond=None)[0]
    res = minimize(objective, init, jac=True, method="BFGS", options={"gtol": 1e-12})
    qa, qb, qc = res.x if np.all(np.isfinite(res.x)) else init
    # Undo the centring: a (u - mu)^2 + b (u - mu) + c.
    a = qa
    b = qb - 2.0 * qa * mu
    c = qa * mu * mu - qb * mu + qc
    return QuadraticFit(float(a), float(b), float(c), float(x.min()), float(x.max()))


# ---------------------------------------------------------------- power law and envelope


@dataclass(frozen=True)
class PowerLaw:
    """y = k x^exponent, fitted as a line in log10 space."""

    k: float
    exponent: float

    def __call__(self, x) -> np.ndarray:
        return self.k * np.asarray(x, dtype=np.float64) ** self.exponent


def fit_power_law(x, y) -> PowerLaw:
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.size < 2:
        raise ValueError(f"a power law needs >= 2 points, got {x.size}")
    if np.any(x <= 0) or np.any(y <= 0):
        raise ValueError("power-law inputs must be > 0")
    slope, intercept = np.polyfit(np.log10(x), np.log10(y), 1)
    return PowerLaw(k=float(10.0**intercept), exponent=float(slope))


@dataclass(frozen=True)
class LossEnvelope:
    """L(C) = E + A C^-alpha: the best reachable loss at compute C."""

    E: float
    A: float
    alpha: float

    def __call__(self, flops) -> np.ndarray:
        return self.E + self.A * np.asarray(flops, dtype=np.float64) ** (-self.alpha)


def fit_loss_envelope(flops, loss) -> LossEnvelope:
    """Least squares with E >= 0, A >= 0, alpha in [1e-3, 3].

    For a fixed alpha the model is linear in (E, A), so we solve that exactly (non-negative least
    squares) and search alpha alone (variable projection). C is scaled by its geometric mean
    so C^-alpha stays O(1) whatever the budgets are.
    """
    from scipy.optimize import minimize_scalar, nnls

    flops = np.asarray(flops, dtype=np.float64)
    loss = np.asarray(loss, dtype=np.float64)
    if flops.size < 3:
        raise ValueError(f"the loss envelope has 3 parameters; need >= 3 budgets, got {flops.size}")
    c_ref = float(np.exp(np.mean(np.log(flops))))
    z = flops / c_ref

    def solve(alpha):
        design = np.stack([np.ones_like(z), z ** (-alpha)], axis=1)
        coef, rnorm = nnls(design, loss)
        return coef, rnorm

    grid = np.geomspace(1e-3, 3.0, 61)
    best = grid[int(np.argmin([solve(a)[1] for a in grid]))]
    lo, hi = max(1e-3, best / 1.2), min(3.0, best * 1.2)
    res = minimize_scalar(lambda la: solve(math.exp(la))[1], bounds=(math.log(lo), math.log(hi)), method="bounded")
    alpha = math.exp(res.x) if solve(math.exp(res.x))[1] <= solve(best)[1] else best
    (e, a_scaled), _ = solve(alpha)
    # A' (C / c_ref)^-alpha = A C^-alpha  with  A = A' c_ref^alpha.
    return LossEnvelope(E=float(e), A=float(a_scaled * c_ref**alpha), alpha=float(alpha))


# ---------------------------------------------------------------- IsoFLOP analysis


@dataclass(frozen=True)
class IsoFlopConfig:
    """How the IsoFLOP analysis is fitted; its knobs are `marin scaling fit-isoflop`'s flags and
    the ladder's ``scaling_fit`` asset config (marin_assets/knobs.py)."""

    bucket_base: float = knob(1.1, help="FLOP buckets are powers of this (as in Marin)")
    huber_delta: float = knob(0.01, help="Huber delta of the per-budget quadratics, in loss units")
    min_points: int = 3
    bootstrap_n: int = knob(100, help="bootstrap resamples for the confidence intervals (0 = none)")
    bootstrap_seed: int = knob(0, help="seed of the bootstrap resampling")
    # A budget with more runs is fitted (and bootstrapped) on a deterministic subsample of this
    # many: a robust quadratic on 1e5 runs took 0.17 s here, and there are two per budget per
    # resample (10 such budgets x 100 resamples: ~6 minutes).
    max_runs_per_budget: int = knob(2000, help="fit a deterministic subsample of this many runs of a budget that has more")

    def __post_init__(self) -> None:
        check_float("bucket_base", self.bucket_base, 1, 10, lo_open=True)
        check_float("huber_delta", self.huber_delta, 0, 10, lo_open=True)
        check_int("min_points (a quadratic has 3 coefficients)", self.min_points, 3, 1_000_000)
        check_int("max_runs_per_budget", self.max_runs_per_budget, self.min_points, 1_000_000_000)
        BootstrapConfig(n=self.bootstrap_n, seed=self.bootstrap_seed)  # its checks run now, not after the fit

    @property
    def bootstrap(self) -> BootstrapConfig:
        return BootstrapConfig(n=self.bootstrap_n, seed=self.bootstrap_seed)


@dataclass(frozen=True)
class BudgetOptimum:
    budget: float  # bucketed FLOPs
    n_runs: int
    tokens_opt: float  # D* from the vertex in log10(D)
    params_opt: float  # N* from the vertex in log10(N)
    loss_opt: float  # loss at the D vertex
    fit_tokens: QuadraticFit
    fit_params: QuadraticFit

    def as_dict(self) -> dict:
        return {
            "budget": self.budget,
            "n_runs": self.n_runs,
            "tokens_opt": self.tokens_opt,
            "params_opt": self.params_opt,
            "loss_opt": self.loss_opt,
            "quadratic_log10_tokens": [self.fit_tokens.a, self.fit_tokens.b, self.fit_tokens.c],
            "quadratic_log10_params": [self.fit_params.a, self.fit_params.b, self.fit_params.c],
        }


def fit_budget(budget: float, params, tokens, loss, config: IsoFlopConfig) -> BudgetOptimum | str:
    """The optimum of one budget, or the reason it has none."""
    n = len(loss)
    if n < config.min_points:
        return f"only {n} run(s); need >= {config.min_points} for a quadratic with an interior minimum"
    if np.unique(np.round(np.log10(tokens), 9)).size < 3:
        return "fewer than 3 distinct token counts"
    fit_d = fit_robust_quadratic(tokens, loss, config.huber_delta)
    ok, why = fit_d.interior_minimum()
    if not ok:
        return f"loss vs log10(tokens): {why}"
    fit_n = fit_robust_quadratic(params, loss, config.huber_delta)
    ok, why = fit_n.interior_minimum()
    if not ok:
        return f"loss vs log10(params): {why}"
    d_star = 10.0**fit_d.vertex_log10
    n_star = 10.0**fit_n.vertex_log10
    return BudgetOptimum(budget, n, float(d_star), float(n_star), float(fit_d(d_star)), fit_d, fit_n)


def group_by_budget(flops: np.ndarray, base: float) -> dict[float, np.ndarray]:
    """Indices of the runs in each (Marin-style) FLOP bucket, smallest budget first, each ascending."""
    distinct, which = np.unique(np.asarray(flops, dtype=np.float64), return_inverse=True)
    keys = np.array([bucket_flops(float(c), base) for c in distinct])[which.ravel()]  # one call per distinct count
    order = np.argsort(keys, kind="stable")  # stable: each budget's runs stay in ascending order
    groups = np.split(order, np.flatnonzero(np.diff(keys[order])) + 1)
    return {float(keys[g[0]]): g for g in groups} if keys.size else {}


@dataclass
class IsoFlopResult:
    optima: list[BudgetOptimum]
    excluded_budgets: list[dict]  # {"budget", "n_runs", "reason"}
    excluded_rows: list[dict]  # {"row", "reason"} from input validation
    n_opt: PowerLaw
    d_opt: PowerLaw
    envelope: LossEnvelope | None
    envelope_note: str
    uncertainty: dict  # bootstrap output, see bootstrap.bootstrap
    rows: dict = field(default_factory=dict)  # {"given", "used", "why": [...]}: runs left out for cost

    def as_dict(self) -> dict:
        ci = self.uncertainty.get("ci", {})
        env = None
        if self.envelope is not None:
            env = {
                "E": self.envelope.E,
                "A": self.envelope.A,
                "alpha": self.envelope.alpha,
                "ci": {k: ci.get(f"envelope_{k}") for k in ("E", "A", "alpha")},
            }
        return {
            "n_opt_exponent": self.n_opt.exponent,
            "n_opt_coefficient": self.n_opt.k,
            "d_opt_exponent": self.d_opt.exponent,
            "d_opt_coefficient": self.d_opt.k,
            "ci": {
                "n_opt_exponent": ci.get("n_opt_exponent"),
                "d_opt_exponent": ci.get("d_opt_exponent"),
                "n_opt_coefficient": ci.get("n_opt_coefficient"),
                "d_opt_coefficient": ci.get("d_opt_coefficient"),
            },
            "optima": [o.as_dict() for o in self.optima],
            "envelope": env,
            "envelope_note": self.envelope_note,
            "excluded_budgets": self.excluded_budgets,
            "excluded": self.excluded_rows,
            "bootstrap": {k: self.uncertainty[k] for k in ("n", "n_ok", "level", "seed") if k in self.uncertainty},
            "n": int(sum(o.n_runs for o in self.optima)),
            "rows": self.rows,
        }


def _laws_from_optima(optima: list[BudgetOptimum]) -> tuple[PowerLaw, PowerLaw, LossEnvelope | None, str]:
    budgets = np.array([o.budget for o in optima])
    n_law = fit_power_law(budgets, [o.params_opt for o in optima])
    d_law = fit_power_law(budgets, [o.tokens_opt for o in optima])
    if len(optima) >= 3:
        return n_law, d_law, fit_loss_envelope(budgets, [o.loss_opt for o in optima]), ""
    return n_law, d_law, None, f"envelope needs >= 3 usable budgets, have {len(optima)}"


def _optima(runs: Runs, groups: dict[float, np.ndarray], config: IsoFlopConfig):
    optima, excluded = [], []
    for budget, idx in groups.items():
        out = fit_budget(budget, runs.params[idx], runs.tokens[idx], runs.loss[idx], config)
        if isinstance(out, str):
            excluded.append({"budget": budget, "n_runs": int(idx.size), "reason": out})
        else:
            optima.append(out)
    return optima, excluded


def fit_isoflop(runs: Runs, config: IsoFlopConfig | None = None) -> IsoFlopResult:
    """Full approach-2 analysis of validated runs, with bootstrap intervals.

    Raises ValueError (listing every excluded budget and why) when fewer than two budgets have
    an interior optimum, since no power law can be drawn through one point. A budget with more
    than ``config.max_runs_per_budget`` runs is fitted on a deterministic subsample of them,
    reported in the result's ``rows``.
    """
    config = config or IsoFlopConfig()
    if len(runs) == 0:
        raise ValueError(f"{runs.source}: no valid runs (excluded: {runs.excluded})")
    groups, rows = _capped_groups(group_by_budget(runs.flops, config.bucket_base), config.max_runs_per_budget)
    optima, excluded = _optima(runs, groups, config)
    if len(optima) < 2:
        raise ValueError(
            f"{runs.source}: {len(optima)} budget(s) with an interior optimum; need >= 2 for power laws. "
            f"Excluded budgets: {excluded}"
        )
    n_law, d_law, envelope, note = _laws_from_optima(optima)

    def refit(rng: np.random.Generator):
        # Resample runs within each budget (stratified): the budgets are the design, the runs the noise.
        picks = [rng.choice(g, size=g.size, replace=True) for g in groups.values()]
        sample = runs.take(np.concatenate(picks))
        # The sample holds each budget's picks in a block, in budget order: its groups without re-bucketing it.
        ends = np.cumsum([p.size for p in picks])
        opt, _ = _optima(sample, {b: np.arange(end - p.size, end) for b, p, end in zip(groups, picks, ends, strict=True)}, config)
        if len(opt) < 2:
            return None
        nl, dl, env, _ = _laws_from_optima(opt)
        out = {"n_opt_exponent": nl.exponent, "n_opt_coefficient": nl.k, "d_opt_exponent": dl.exponent, "d_opt_coefficient": dl.k}
        if env is not None and envelope is not None:
            out.update(envelope_E=env.E, envelope_A=env.A, envelope_alpha=env.alpha)
        return out

    uncertainty = bootstrap(refit, config.bootstrap)
    return IsoFlopResult(optima, excluded, list(runs.excluded), n_law, d_law, envelope, note, uncertainty, rows)


def _capped_groups(groups: dict[float, np.ndarray], cap: int) -> tuple[dict[float, np.ndarray], dict]:
    """Each budget's runs, a deterministic subsample of ``cap`` where it has more; and the rows report."""
    capped = {b: g if g.size <= cap else g[deterministic_subsample(g.size, cap)] for b, g in groups.items()}
    given, used = sum(g.size for g in groups.values()), sum(g.size for g in capped.values())
    over = {b: int(g.size) for b, g in groups.items() if g.size > cap}
    why = (
        []
        if not over
        else [
            f"{len(over)} budget(s) have more than max_runs_per_budget={cap} runs (up to {max(over.values())}): each was "
            f"fitted and bootstrapped on a deterministic random subsample of {cap} (seed {SUBSAMPLE_SEED}); "
            f"{used} of {given} runs used"
        ]
    )
    return capped, {"given": int(given), "used": int(used), "why": why}
