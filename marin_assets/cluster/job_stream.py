"""The deterministic job stream behind examples/jobs.yaml (``marin cluster gen-jobs``).

Its output is a jobs file (schema: ``marin_assets/cluster/jobs.py``) for a given fleet.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from marin_assets.cluster.fleet import Fleet, Pool
from marin_assets.cluster.jobs import MAX_JOBS
from marin_assets.knobs import knob
from marin_assets.numeric_checks import check_float, check_int

_SMALL_SIZES = (1, 2, 4, 8, 16, 32, 64)
_MULTI_DOMAIN = (2, 2, 3, 4)  # whole domains for a multi-rack / multi-node job
_P_MULTI = 0.15
_MIN_S, _MAX_S = 300.0, 8 * 3600.0
_BANDS = (["production", "interactive", "batch"], [0.10, 0.25, 0.65])


def _mean_chips(pool: Pool) -> float:
    """Expected chips a generated job holds on ``pool`` (matches _draw_chips)."""
    if pool.whole_domain:
        return pool.domain_chips
    small = [c for c in _SMALL_SIZES if c <= pool.domain_chips]
    counts = _multi_counts(pool)
    if not counts:
        return sum(small) / len(small)
    multi = pool.domain_chips * sum(counts) / len(counts)
    return (1 - _P_MULTI) * sum(small) / len(small) + _P_MULTI * multi


def _multi_counts(pool: Pool) -> list[int]:
    """How many whole domains a multi-domain job on ``pool`` may take."""
    return [k for k in _MULTI_DOMAIN if k <= pool.domains]


def _draw_chips(rng: random.Random, pool: Pool) -> int:
    """A job size on ``pool``: a small job inside one domain, sometimes several whole domains."""
    if pool.whole_domain:
        return pool.domain_chips  # a TPU job asks for the whole slice it runs on
    counts = _multi_counts(pool)
    if counts and rng.random() < _P_MULTI:
        return pool.domain_chips * rng.choice(counts)
    return rng.choice([c for c in _SMALL_SIZES if c <= pool.domain_chips])


@dataclass(frozen=True)
class JobStreamConfig:
    """The generated job stream's size, seed and load. Knobs (marin_assets/knobs.py):
    `marin cluster gen-jobs` flags."""

    n: int = knob(1000, help="number of jobs")
    seed: int = knob(0, help="random seed of the stream")
    load: float = knob(0.7, help="offered load per pool, in (0, 1)")
    n_failures: int = knob(6, help="domain failures injected during the busy period")

    def __post_init__(self) -> None:
        check_int("n (number of jobs)", self.n, 1, MAX_JOBS)
        check_float("load", self.load, 0, 1, lo_open=True)
        if self.load == 1:
            raise ValueError("load must be below 1 (an offered load of 1 never drains), got 1")
        check_int("n_failures", self.n_failures, 0, MAX_JOBS)


def _draw_job(rng: random.Random, i: int, t: float, pool: Pool) -> dict[str, Any]:
    """Job ``i``, submitted at ``t`` on ``pool`` (the draws, in this order, make the stream)."""
    priority = rng.choices(*_BANDS)[0]
    job: dict[str, Any] = {
        "id": f"job-{i:04d}",
        "submit_s": round(t, 1),
        "duration_s": round(math.exp(rng.uniform(math.log(_MIN_S), math.log(_MAX_S)))),
        "accelerator": pool.accelerator,
        "chips": _draw_chips(rng, pool),
        "priority": priority,
    }
    if pool.accelerator != "cpu":
        job["checkpoint_interval_s"] = rng.choice([600, 900, 1800])
    if rng.random() < 0.2:
        job["region"] = pool.region
    return job


def _draw_failure(rng: random.Random, pools: list[Pool], busy_s: float) -> dict[str, Any]:
    """A domain failure somewhere in the busy period (10%..80% of ``busy_s``)."""
    pool = rng.choice(pools)
    return {
        "at_s": round(rng.uniform(0.1, 0.8) * busy_s),
        "pool": pool.name,
        "domain": rng.randrange(pool.domains),
        "down_s": rng.choice([600, 1800, 3600]),
    }


def generate_jobs(fleet: Fleet, config: JobStreamConfig | None = None) -> dict[str, Any]:
    """A reproducible mixed job stream for ``fleet`` (same fleet and config -> same stream).

    Each job picks a pool with probability proportional to capacity / mean job size, so
    every pool sees the same offered load; arrivals are Poisson with the rate that makes
    that load ``load`` (0.7: busy, with queues, but draining). Sizes: on shared-domain
    pools 1..64 chips inside one domain, or 15% of the time 2-4 whole domains (multi-rack);
    on TPU pools the whole slice. Bands: 10% production, 25% interactive, 65% batch.
    Durations are log-uniform in 5 minutes..8 hours; accelerator jobs checkpoint every
    10-30 minutes, CPU jobs never (they restart from scratch). A few domain failures are
    injected during the busy period. The output is a jobs file (``cluster/jobs.py``).
    """
    config = config or JobStreamConfig()
    rng = random.Random(config.seed)
    pools = list(fleet.pools)
    weights = [p.capacity / _mean_chips(p) for p in pools]
    mean_duration = (_MAX_S - _MIN_S) / math.log(_MAX_S / _MIN_S)
    mean_gap_s = mean_duration / (config.load * sum(weights))
    t = 0.0
    jobs = []
    for i in range(config.n):
        t += rng.expovariate(1.0 / mean_gap_s)
        jobs.append(_draw_job(rng, i, t, rng.choices(pools, weights)[0]))
    failures = [_draw_failure(rng, pools, t) for _ in range(config.n_failures)]
    return {"jobs": jobs, "failures": failures}
