"""Chinchilla "approach 3": fit L(N, D) = E + A / N^alpha + B / D^beta to every run at once.

We follow Hoffmann et al. (2022) as replicated by Besiroglu et al. (2024, "Chinchilla Scaling:
A replication attempt"):

    log L_hat = LSE(a - alpha * log N, b - beta * log D, e)      with A = e^a, B = e^b, E = e^e

minimise sum_i Huber_delta(log L_hat_i - log L_i) with delta = 1e-3, by L-BFGS started from
every point of a grid of initialisations, and keep the best. Fitting log-loss through the
log-sum-exp keeps all three terms positive without constraints and makes the residuals
relative errors, which is why a delta as small as 1e-3 is meaningful.

The objective and its gradient are plain numpy over all runs, so one L-BFGS start costs a
few milliseconds and the full 4,500-point published grid runs in seconds.

Large inputs: the grid costs starts x runs x iterations, so it runs on a deterministic
subsample of at most ``grid_rows`` runs and only its winner is polished on every run; and
``fit_parametric_with_ci`` fits at most ``max_rows`` runs (a deterministic subsample above
that), since every bootstrap refit is a polish over all of them. Its report's ``rows`` says
how many runs were given and used and why, and the CLI says so on stderr.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from marin_assets.knobs import knob
from marin_assets.numeric_checks import check_float, check_int
from marin_assets.scaling.bootstrap import BootstrapConfig, bootstrap
from marin_assets.scaling.data import SUBSAMPLE_SEED, deterministic_subsample, drop_highest_loss

# Published grid (Besiroglu et al. 2024, section 2 / their released notebook):
# alpha, beta in {0, 0.5, ..., 2}, e in {-1, -0.5, ..., 1}, a, b in {0, 5, ..., 25}.
PUBLISHED_GRID: dict[str, tuple[float, ...]] = {
    "a": (0.0, 5.0, 10.0, 15.0, 20.0, 25.0),
    "b": (0.0, 5.0, 10.0, 15.0, 20.0, 25.0),
    "e": (-1.0, -0.5, 0.0, 0.5, 1.0),
    "alpha": (0.0, 0.5, 1.0, 1.5, 2.0),
    "beta": (0.0, 0.5, 1.0, 1.5, 2.0),
}
PARAM_ORDER = ("a", "b", "e", "alpha", "beta")


@dataclass(frozen=True)
class ParametricFitConfig:
    """How the parametric law is fitted; the defaults are the published protocol."""

    huber_delta: float = 1e-3
    grid: dict[str, tuple[float, ...]] = field(default_factory=lambda: dict(PUBLISHED_GRID))
    max_iter: int = 500
    history: int = 10  # L-BFGS memory (pairs kept); scipy's default
    # Grid phase: stop a start when max |grad| < gtol or an accepted step lowers the objective
    # by less than ftol (relative). The best start is then polished with scipy's L-BFGS-B at
    # polish_gtol/polish_ftol. The summed Huber objective is ~1e-3 at the optimum, so these are
    # far below scipy's defaults, which stop early in the flat alpha/beta valley.
    gtol: float = 1e-6
    ftol: float = 1e-9
    polish_gtol: float = 1e-10
    polish_ftol: float = 1e-14
    # Cost caps ("Large inputs" in the module docstring). grid_rows is above the anchor's 240 runs,
    # so the published protocol on it is unchanged.
    grid_rows: int = 256
    # The knobs of `marin scaling fit-parametric` (marin_assets/knobs.py); fit_parametric_with_ci uses them.
    max_rows: int = knob(10_000, help="fit a deterministic subsample of this many runs when given more")
    drop_highest: int = knob(0, help="drop the K highest-loss runs first (the Chinchilla protocol uses 5)")
    bootstrap_n: int = knob(100, help="bootstrap resamples for the confidence intervals (0 = none)")
    bootstrap_seed: int = knob(0, help="seed of the bootstrap resampling")

    def __post_init__(self) -> None:
        check_float("huber_delta", self.huber_delta, 0, 10, lo_open=True)
        check_int("grid_rows", self.grid_rows, 5, 1_000_000_000)
        check_int("max_rows", self.max_rows, 5, 1_000_000_000)
        BootstrapConfig(n=self.bootstrap_n, seed=self.bootstrap_seed)  # its checks run now, not after the fit
        for name in ("gtol", "ftol", "polish_gtol", "polish_ftol"):
            check_float(name, getattr(self, name), 0, 1, lo_open=True)
        missing = set(PARAM_ORDER) - set(self.grid)
        if missing:
            raise ValueError(f"grid is missing values for {sorted(missing)}")
        for name in PARAM_ORDER:
            if len(self.grid[name]) == 0:
                raise ValueError(f"grid[{name!r}] is empty")
            for i, value in enumerate(self.grid[name]):
                check_float(f"grid[{name!r}][{i}]", value, -1e3, 1e3)
        check_int("history", self.history, 1, 1000)
        check_int("max_iter", self.max_iter, 1, 1_000_000)


@dataclass(frozen=True)
class ParametricFit:
    """Fitted L(N, D) = E + A / N^alpha + B / D^beta."""

    E: float
    A: float
    B: float
    alpha: float
    beta: float
    n: int  # runs used in the fit
    objective: float  # summed Huber loss at the optimum

    def predict(self, params, tokens) -> np.ndarray:
        params = np.asarray(params, dtype=np.float64)
        tokens = np.asarray(tokens, dtype=np.float64)
        return self.E + self.A / params**self.alpha + self.B / tokens**self.beta

    def optimal_allocation(self, flops) -> tuple[np.ndarray, np.ndarray]:
        """Compute-optimal (N, D) under C = 6 N D (Hoffmann et al. eq. 4)."""
        flops = np.asarray(flops, dtype=np.float64)
        g = (self.alpha * self.A / (self.beta * self.B)) ** (1.0 / (self.alpha + self.beta))
        a = self.beta / (self.alpha + self.beta)
        b = self.alpha / (self.alpha + self.beta)
        n_opt = g * (flops / 6.0) ** a
        d_opt = (1.0 / g) * (flops / 6.0) ** b
        return n_opt, d_opt

    def as_dict(self) -> dict[str, float | int]:
        return {
            "E": self.E,
            "A": self.A,
            "B": self.B,
            "alpha": self.alpha,
            "beta": self.beta,
            "n": self.n,
            "objective": self.objective,
        }


# Starts per block of the batched objective: its ~20 temporaries are (starts, runs) arrays, so one
# block of ~64k elements keeps them in cache (measured 2x faster on the anchor's 4,500 x 240 than
# one block) and 4,500 starts x 1e6 runs no longer asks for 33.5 GiB per temporary.
_OBJECTIVE_BLOCK = 1 << 16


def _batched_objective(theta: np.ndarray, log_n: np.ndarray, log_d: np.ndarray, log_loss: np.ndarray, delta: float):
    """Summed Huber loss of the log-sum-exp prediction and its exact gradient, for S parameter
    vectors at once. theta: (S, 5) in PARAM_ORDER; returns f: (S,), grad: (S, 5).

    Computed a block of starts at a time; each start's sums run over the same runs in the same
    order whatever the block, so the result is bit-for-bit that of one block."""
    step = max(1, _OBJECTIVE_BLOCK // max(1, log_n.size))
    if theta.shape[0] <= step:
        return _objective_block(theta, log_n, log_d, log_loss, delta)
    parts = [_objective_block(theta[i : i + step], log_n, log_d, log_loss, delta) for i in range(0, theta.shape[0], step)]
    return np.concatenate([f for f, _ in parts]), np.concatenate([g for _, g in parts])


def _objective_block(theta: np.ndarray, log_n: np.ndarray, log_d: np.ndarray, log_loss: np.ndarray, delta: float):
    a, b, e, alpha, beta = (theta[:, i : i + 1] for i in range(5))  # each (S, 1)
    # Three terms per (start, run): (S, R) each; log-sum-exp over them.
    t_n = a - alpha * log_n[None, :]
    t_d = b - beta * log_d[None, :]
    t_e = np.broadcast_to(e, t_n.shape)
    top = np.maximum(np.maximum(t_n, t_d), t_e)
    w_n, w_d, w_e = np.exp(t_n - top), np.exp(t_d - top), np.exp(t_e - top)
    total = w_n + w_d + w_e
    log_pred = top + np.log(total)
    w_n, w_d, w_e = w_n / total, w_d / total, w_e / total  # softmax = d log_pred / d term

    r = log_pred - log_loss[None, :]
    abs_r = np.abs(r)
    huber = np.where(abs_r <= delta, 0.5 * r * r, delta * (abs_r - 0.5 * delta))
    dr = np.clip(r, -delta, delta)  # d huber / d r

    grad = np.stack(
        [
            np.sum(dr * w_n, axis=1),
            np.sum(dr * w_d, axis=1),
            np.sum(dr * w_e, axis=1),
            -np.sum(dr * w_n * log_n[None, :], axis=1),
            -np.sum(dr * w_d * log_d[None, :], axis=1),
        ],
        axis=1,
    )
    f = huber.sum(axis=1)
    # A start that wandered to overflow gets +inf so it can never win and the line search rejects it.
    bad = ~np.isfinite(f) | ~np.all(np.isfinite(grad), axis=1)
    f = np.where(bad, np.inf, f)
    grad = np.where(bad[:, None], 0.0, grad)
    return f, grad


def _objective_and_grad(theta: np.ndarray, log_n, log_d, log_loss, delta: float):
    f, g = _batched_objective(theta[None, :], log_n, log_d, log_loss, delta)
    return float(f[0]), g[0]


def _batched_lbfgs(theta0: np.ndarray, log_n, log_d, log_loss, config: ParametricFitConfig):
    """L-BFGS run independently from every row of theta0 (S, P), vectorised over the starts.

    Each start keeps its own curvature history (memory m) and its own backtracking Armijo
    line search; a pair (s, y) is stored only if s.y > 0 so the inverse-Hessian estimate stays
    positive definite. Starts that converge (max |grad| < gtol, or no decrease) are frozen.
    Returns the final theta (S, P) and objective (S,).
    """
    delta, m = config.huber_delta, config.history
    x = np.array(theta0, dtype=np.float64)
    num, dim = x.shape
    f, g = _batched_objective(x, log_n, log_d, log_loss, delta)
    s_hist = np.zeros((m, num, dim))
    y_hist = np.zeros((m, num, dim))
    rho = np.zeros((m, num))  # 0 marks an empty / skipped slot
    active = np.isfinite(f)

    for it in range(config.max_iter):
        idx = np.flatnonzero(active)
        if idx.size == 0:
            break
        xa, fa, ga = x[idx], f[idx], g[idx]
        # Two-loop recursion, newest pair first.
        q = ga.copy()
        alphas = np.zeros((m, idx.size))
        order = [(it - 1 - k) % m for k in range(m)]
        for slot in order:
            alphas[slot] = rho[slot, idx] * np.sum(s_hist[slot, idx] * q, axis=1)
            q -= alphas[slot][:, None] * y_hist[slot, idx]
        newest = order[0]
        sy = np.sum(s_hist[newest, idx] * y_hist[newest, idx], axis=1)
        yy = np.sum(y_hist[newest, idx] ** 2, axis=1)
        gamma = np.where((rho[newest, idx] > 0) & (yy > 0), sy / np.where(yy > 0, yy, 1.0), 1.0)
        r = gamma[:, None] * q
        for slot in reversed(order):
            beta_ = rho[slot, idx] * np.sum(y_hist[slot, idx] * r, axis=1)
            r += (alphas[slot] - beta_)[:, None] * s_hist[slot, idx]
        direction = -r
        slope = np.sum(direction * ga, axis=1)
        not_descent = ~(slope < 0)
        # Fall back to a scaled steepest descent where the quasi-Newton step is not downhill.
        direction[not_descent] = -ga[not_descent]
        slope = np.sum(direction * ga, axis=1)

        # Backtracking Armijo line search, vectorised: every start halves its own step.
        step = np.ones(idx.size)
        accepted = np.zeros(idx.size, dtype=bool)
        x_new, f_new, g_new = xa.copy(), fa.copy(), ga.copy()
        for _ in range(40):
            todo = np.flatnonzero(~accepted)
            if todo.size == 0:
                break
            trial = xa[todo] + step[todo, None] * direction[todo]
            ft, gt = _batched_objective(trial, log_n, log_d, log_loss, delta)
            ok = ft <= fa[todo] + 1e-4 * step[todo] * slope[todo]
            hit = todo[ok]
            x_new[hit], f_new[hit], g_new[hit] = trial[ok], ft[ok], gt[ok]
            accepted[hit] = True
            step[todo[~ok]] *= 0.5

        s = x_new - xa
        y = g_new - ga
        sy = np.sum(s * y, axis=1)
        slot = it % m
        good = accepted & (sy > 1e-300)
        s_hist[slot, idx] = np.where(good[:, None], s, 0.0)
        y_hist[slot, idx] = np.where(good[:, None], y, 0.0)
        rho[slot, idx] = np.where(good, 1.0 / np.where(good, sy, 1.0), 0.0)

        decrease = fa - f_new
        x[idx], f[idx], g[idx] = x_new, f_new, g_new
        converged = (
            ~accepted | (np.max(np.abs(g_new), axis=1) < config.gtol) | (decrease <= config.ftol * np.maximum(np.abs(fa), 1e-300))
        )
        active[idx[converged]] = False
    return x, f


def _polish(theta0, log_n, log_d, log_loss, config: ParametricFitConfig):
    """Finish the winning start with scipy's L-BFGS-B (More-Thuente line search) to a tight tolerance."""
    from scipy.optimize import minimize

    result = minimize(
        _objective_and_grad,
        np.asarray(theta0, dtype=np.float64),
        args=(log_n, log_d, log_loss, config.huber_delta),
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": config.max_iter, "gtol": config.polish_gtol, "ftol": config.polish_ftol},
    )
    return result.x, float(result.fun)


def _check_inputs(params, tokens, loss) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    params = np.asarray(params, dtype=np.float64)
    tokens = np.asarray(tokens, dtype=np.float64)
    loss = np.asarray(loss, dtype=np.float64)
    if not (params.shape == tokens.shape == loss.shape) or params.ndim != 1:
        raise ValueError(
            f"params, tokens, loss must be 1-D and the same length, got {params.shape}, {tokens.shape}, {loss.shape}"
        )
    for name, values in (("params", params), ("tokens", tokens), ("loss", loss)):
        bad = np.flatnonzero(~np.isfinite(values) | (values <= 0))
        if bad.size:
            raise ValueError(
                f"{name} must be finite and > 0; bad rows {bad[:10].tolist()} (filter with scaling.data.validate_runs first)"
            )
    if params.size < 5:
        raise ValueError(f"the parametric law has 5 parameters; need >= 5 runs, got {params.size}")
    sizes, counts = _distinct(params), _distinct(tokens)
    if sizes < 2 or counts < 2:
        raise ValueError(
            f"cannot identify the law from these runs: {sizes} distinct model size(s) and {counts} distinct "
            "token count(s); need >= 2 of each (alpha is fitted across model sizes, beta across token counts)"
        )
    return params, tokens, loss


def _distinct(values: np.ndarray) -> int:
    """Distinct values up to a relative 1e-9 (CSV round-trips must not count as new sizes)."""
    return int(np.unique(np.round(np.log(values), 9)).size)


# exp() of a log-coefficient above this overflows a float64
_MAX_LOG_COEFFICIENT = math.log(np.finfo(np.float64).max)


def _theta_to_fit(theta: np.ndarray, n: int, objective: float) -> ParametricFit:
    a, b, e, alpha, beta = (float(v) for v in theta)
    too_big = {name: v for name, v in (("A", a), ("B", b), ("E", e)) if v > _MAX_LOG_COEFFICIENT}
    if too_big:  # the runs do not pin the law down: an exponent ran off and its coefficient with it
        raise ValueError(
            f"parametric fit over {n} runs diverged: log {', '.join(too_big)} = "
            f"{', '.join(f'{v:.4g}' for v in too_big.values())} (alpha {alpha:.4g}, beta {beta:.4g}); "
            f"the runs' sizes and token counts span too little to identify L(N, D)"
        )
    return ParametricFit(E=math.exp(e), A=math.exp(a), B=math.exp(b), alpha=alpha, beta=beta, n=n, objective=objective)


def fit_parametric(params, tokens, loss, config: ParametricFitConfig | None = None) -> ParametricFit:
    """Fit the Chinchilla law by L-BFGS from every start of the grid; keep the lowest objective."""
    config = config or ParametricFitConfig()
    params, tokens, loss = _check_inputs(params, tokens, loss)
    log_n, log_d, log_loss = np.log(params), np.log(tokens), np.log(loss)

    starts = np.array(list(itertools.product(*(config.grid[name] for name in PARAM_ORDER))), dtype=np.float64)
    grid = deterministic_subsample(params.size, config.grid_rows)
    theta, objective = _batched_lbfgs(starts, log_n[grid], log_d[grid], log_loss[grid], config)
    if not np.any(np.isfinite(objective)):
        raise RuntimeError("every L-BFGS start diverged; check the inputs")
    best = int(np.argmin(objective))
    if grid.size < params.size:  # the grid's objective was over fewer runs: rescore the winner on all
        objective[best] = _objective_and_grad(theta[best], log_n, log_d, log_loss, config.huber_delta)[0]
    polished, polished_obj = _polish(theta[best], log_n, log_d, log_loss, config)
    if polished_obj > objective[best]:  # never let the polish make things worse
        polished, polished_obj = theta[best], float(objective[best])
    return _theta_to_fit(polished, params.size, polished_obj)


def refit_parametric(params, tokens, loss, start: ParametricFit, config: ParametricFitConfig | None = None) -> ParametricFit:
    """One L-BFGS run warm-started at ``start``: used by the bootstrap, where the full grid
    per resample would cost thousands of fits and the resampled optimum sits near the original."""
    config = config or ParametricFitConfig()
    params, tokens, loss = _check_inputs(params, tokens, loss)
    theta0 = [math.log(start.A), math.log(start.B), math.log(start.E), start.alpha, start.beta]
    theta, obj = _polish(theta0, np.log(params), np.log(tokens), np.log(loss), config)
    return _theta_to_fit(theta, params.size, obj)


def fit_parametric_with_ci(runs, config: ParametricFitConfig | None = None, boot=None) -> dict:
    """Fit validated ``data.Runs`` and bootstrap the parameters (resample runs with replacement,
    warm-started refit), after dropping the ``config.drop_highest`` highest-loss runs. ``boot``
    (a BootstrapConfig) overrides the config's bootstrap_n and bootstrap_seed. Returns the
    JSON-ready report: E, A, B, alpha, beta, n, objective, ci {name: [low, high]},
    bootstrap {n, n_ok, level, seed}, excluded [{row, reason}]."""
    config = config or ParametricFitConfig()
    boot = boot or BootstrapConfig(n=config.bootstrap_n, seed=config.bootstrap_seed)
    runs = drop_highest_loss(runs, config.drop_highest)
    given = len(runs)
    runs = runs.take(deterministic_subsample(given, config.max_rows)) if given > config.max_rows else runs
    if len(runs) < 5:
        reasons = "; ".join(f"row {e['row']}: {e['reason']}" for e in runs.excluded[:3])
        raise ValueError(
            f"{runs.source}: {len(runs)} usable run(s), the parametric law needs >= 5"
            + (f" ({len(runs.excluded)} excluded, e.g. {reasons})" if runs.excluded else "")
        )
    try:
        fit = fit_parametric(runs.params, runs.tokens, runs.loss, config)
    except ValueError as err:
        raise ValueError(f"{runs.source}: {err}") from None

    def refit(rng: np.random.Generator):
        idx = rng.integers(0, len(runs), size=len(runs))
        f = refit_parametric(runs.params[idx], runs.tokens[idx], runs.loss[idx], fit, config)
        return {"E": f.E, "A": f.A, "B": f.B, "alpha": f.alpha, "beta": f.beta}

    unc = bootstrap(refit, boot)
    report: dict = fit.as_dict()
    report["ci"] = unc["ci"]
    report["bootstrap"] = {k: unc[k] for k in ("n", "n_ok", "level", "seed")}
    report["excluded"] = list(runs.excluded)
    report["rows"] = _rows_report(given, len(runs), config)
    return report


def _rows_report(given: int, used: int, config: ParametricFitConfig) -> dict:
    """How many valid runs the fit was given and used, and why any were left out (not excluded:
    a cost cap, see ParametricFitConfig)."""
    grid_rows = min(used, config.grid_rows)
    why = []
    if used < given:
        why.append(
            f"{given} runs is more than max_rows={config.max_rows}: fitted and bootstrapped a deterministic "
            f"random subsample of {used} (seed {SUBSAMPLE_SEED})"
        )
    if grid_rows < used:
        why.append(
            f"the grid search ran on a deterministic random subsample of {grid_rows} of the {used} runs "
            f"(grid_rows={config.grid_rows}); its best start was then fitted to all {used}"
        )
    return {"given": given, "used": used, "grid_search": grid_rows, "why": why}
