"""Fleet simulation: replay a job stream through the real Router and audit the result.

The simulator plays the pools (the "truth"): it starts and stops jobs, takes the heartbeat
snapshots (every ``heartbeat_s``, staggered per pool), fails and repairs domains, and keeps
each job's checkpoints. The Router only sees heartbeats and makes decisions every
``tick_s``. After every tick an audit recomputes usage from the simulator's own run records
(never from the router's bookkeeping) and counts over-allocated domains and split jobs.

Jobs file schema (YAML or JSON)::

    jobs:
      - id: job-0001              # unique
        submit_s: 12.5            # submit time, seconds from the start
        duration_s: 3600          # seconds of work to finish
        accelerator: gb200-nvl72  # cpu | tpu-v4 | tpu-v5e | tpu-v5p | h100x8 | gb200-nvl72
        chips: 64                 # default 1
        priority: batch           # production | interactive | batch (default batch)
        region: us-central1       # optional constraint
        checkpoint_interval_s: 600  # optional; without it a restarted job starts over
    failures:                     # optional: a domain (rack/slice/node) goes down
      - at_s: 7200
        pool: gb200
        domain: 3
        down_s: 1800

Job fields are checked through the same tag validation as a Dagster run's tags.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Mapping

from marin_assets.cluster.fleet import Fleet, check_record, load_structured
from marin_assets.cluster.routing import PoolHeartbeat, Router
from marin_assets.cluster.tags import (
    ACCELERATOR_TAG,
    CHIPS_TAG,
    PRIORITY_TAG,
    REGION_TAG,
    JobRequest,
    check_name,
    classify_tags,
)
from marin_assets.numeric_checks import check_float, check_int


# Bounds that keep one replay finite: a year of simulated time, a million jobs, and at most
# MAX_TICKS scheduling ticks (the loop runs once per tick up to the horizon).
MAX_TIME_S = 366 * 86400.0
MAX_JOBS = 1_000_000
MAX_TICKS = 5_000_000
MIN_TICK_S = 0.001


@dataclass(frozen=True)
class SimJob:
    id: str
    submit_s: float
    duration_s: float
    request: JobRequest
    checkpoint_interval_s: float | None = None

    def __post_init__(self) -> None:
        where = f"job {self.id!r}"
        object.__setattr__(self, "submit_s", check_float(f"{where}: submit_s", self.submit_s, 0, MAX_TIME_S))
        object.__setattr__(self, "duration_s",
                           check_float(f"{where}: duration_s", self.duration_s, 0, MAX_TIME_S, lo_open=True))
        if self.checkpoint_interval_s is not None:
            object.__setattr__(self, "checkpoint_interval_s", check_float(
                f"{where}: checkpoint_interval_s", self.checkpoint_interval_s, 0, MAX_TIME_S, lo_open=True))

    def newest_checkpoint(self, progress: float) -> float:
        """Progress saved by the newest checkpoint at or before ``progress``."""
        if self.checkpoint_interval_s is None:
            return 0.0
        return math.floor(progress / self.checkpoint_interval_s) * self.checkpoint_interval_s


@dataclass(frozen=True)
class DomainFailure:
    at_s: float
    pool: str
    domain: int
    down_s: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "at_s", check_float("at_s", self.at_s, 0, MAX_TIME_S))
        check_name("pool", self.pool)
        check_int("domain", self.domain, 0, 10**9)
        object.__setattr__(self, "down_s", check_float("down_s", self.down_s, 0, MAX_TIME_S, lo_open=True))


_FAILURE_FIELDS = {"at_s", "pool", "domain", "down_s"}


_JOB_FIELDS = {"id", "submit_s", "duration_s", "accelerator", "chips", "priority", "region", "checkpoint_interval_s"}


def job_from_dict(raw: Mapping[str, Any], where: str) -> SimJob:
    check_record(raw, _JOB_FIELDS, where)
    try:
        job_id = check_name("job id", str(raw["id"]))
        tags = {ACCELERATOR_TAG: str(raw.get("accelerator", "cpu")), CHIPS_TAG: str(raw.get("chips", 1)),
                PRIORITY_TAG: str(raw.get("priority", "batch"))}
        if raw.get("region") is not None:
            tags[REGION_TAG] = str(raw["region"])
        return SimJob(job_id, raw["submit_s"], raw["duration_s"], classify_tags(tags),
                      raw.get("checkpoint_interval_s"))
    except KeyError as err:
        raise ValueError(f"{where}: missing field {err}") from None
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: {err}") from None


def jobs_from_dict(data: Mapping[str, Any], *, source: str = "jobs") -> tuple[list[SimJob], list[DomainFailure]]:
    if not isinstance(data, Mapping) or not isinstance(data.get("jobs"), list):
        raise ValueError(f"{source}: expected a mapping with a 'jobs' list")
    check_record(data, {"jobs", "failures"}, source)
    if len(data["jobs"]) > MAX_JOBS:
        raise ValueError(f"{source}: {len(data['jobs'])} jobs is more than the limit of {MAX_JOBS}")
    jobs = [job_from_dict(raw, f"{source}: jobs[{i}]") for i, raw in enumerate(data["jobs"])]
    ids = [j.id for j in jobs]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{source}: job ids are not unique")
    raw_failures = data.get("failures") or []
    if not isinstance(raw_failures, list) or len(raw_failures) > MAX_JOBS:
        raise ValueError(f"{source}: 'failures' must be a list of at most {MAX_JOBS} records")
    failures = []
    for i, raw in enumerate(raw_failures):
        where = f"{source}: failures[{i}]"
        check_record(raw, _FAILURE_FIELDS, where)
        missing = sorted(_FAILURE_FIELDS - set(raw))
        if missing:
            raise ValueError(f"{where}: missing field(s) {missing}")
        try:
            failures.append(DomainFailure(**raw))
        except (TypeError, ValueError) as err:
            raise ValueError(f"{where}: {err}") from None
    return jobs, failures


def load_jobs(path) -> tuple[list[SimJob], list[DomainFailure]]:
    return jobs_from_dict(load_structured(path), source=str(path))


# ---- the deterministic generator behind examples/jobs.yaml ---------------------------------


_SMALL_SIZES = (1, 2, 4, 8, 16, 32, 64)
_MULTI_DOMAIN = (2, 2, 3, 4)  # whole domains for a multi-rack / multi-node job
_P_MULTI = 0.15
_MIN_S, _MAX_S = 300.0, 8 * 3600.0


def _mean_chips(pool) -> float:
    """Expected chips a generated job holds on ``pool`` (matches _draw_chips)."""
    if pool.whole_domain:
        return pool.domain_chips
    small = [c for c in _SMALL_SIZES if c <= pool.domain_chips]
    counts = _multi_counts(pool)
    if not counts:
        return sum(small) / len(small)
    multi = pool.domain_chips * sum(counts) / len(counts)
    return (1 - _P_MULTI) * sum(small) / len(small) + _P_MULTI * multi


def _multi_counts(pool) -> list[int]:
    return [k for k in _MULTI_DOMAIN if k <= pool.domains]


def _draw_chips(rng: random.Random, pool) -> int:
    if pool.whole_domain:
        return pool.domain_chips  # a TPU job asks for the whole slice it runs on
    counts = _multi_counts(pool)
    if counts and rng.random() < _P_MULTI:
        return pool.domain_chips * rng.choice(counts)
    return rng.choice([c for c in _SMALL_SIZES if c <= pool.domain_chips])


def generate_jobs(fleet: Fleet, n: int = 1000, seed: int = 0, load: float = 0.7,
                  n_failures: int = 6) -> dict[str, Any]:
    """A reproducible mixed job stream for ``fleet`` (same fleet, n, seed, load -> same stream).

    Each job picks a pool with probability proportional to capacity / mean job size, so
    every pool sees the same offered load; arrivals are Poisson with the rate that makes
    that load ``load`` (0.7: busy, with queues, but draining). Sizes: on shared-domain
    pools 1..64 chips inside one domain, or 15% of the time 2-4 whole domains (multi-rack);
    on TPU pools the whole slice. Bands: 10% production, 25% interactive, 65% batch.
    Durations are log-uniform in 5 minutes..8 hours; accelerator jobs checkpoint every
    10-30 minutes, CPU jobs never (they restart from scratch). A few domain failures are
    injected during the busy period. The output is the jobs-file schema above.
    """
    check_int("n (number of jobs)", n, 1, MAX_JOBS)
    check_float("load", load, 0, 1, lo_open=True)
    if load == 1:
        raise ValueError("load must be below 1 (an offered load of 1 never drains), got 1")
    check_int("n_failures", n_failures, 0, MAX_JOBS)
    rng = random.Random(seed)
    pools = list(fleet.pools)
    weights = [p.capacity / _mean_chips(p) for p in pools]
    mean_duration = (_MAX_S - _MIN_S) / math.log(_MAX_S / _MIN_S)
    mean_gap_s = mean_duration / (load * sum(weights))
    t = 0.0
    jobs = []
    for i in range(n):
        t += rng.expovariate(1.0 / mean_gap_s)
        pool = rng.choices(pools, weights)[0]
        priority = rng.choices(["production", "interactive", "batch"], [0.10, 0.25, 0.65])[0]
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
        jobs.append(job)
    failures = []
    for _ in range(n_failures):
        pool = rng.choice(pools)
        failures.append({"at_s": round(rng.uniform(0.1, 0.8) * t), "pool": pool.name,
                         "domain": rng.randrange(pool.domains), "down_s": rng.choice([600, 1800, 3600])})
    return {"jobs": jobs, "failures": failures}


# ---- the simulation -------------------------------------------------------------------------


@dataclass
class _Run:
    pool: str
    domains: tuple[int, ...]
    chips: tuple[int, ...]
    start: float
    resume_from: float


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    # nearest-rank percentile: the smallest value with at least q% of the data at or below it
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def check_periods(tick_s: float, heartbeat_s: float) -> int:
    """Validate the two periods; return how many ticks one heartbeat period spans."""
    tick_s = check_float("tick_s", tick_s, MIN_TICK_S, 86400.0)
    heartbeat_s = check_float("heartbeat_s", heartbeat_s, tick_s, 86400.0)
    ratio = heartbeat_s / tick_s
    if abs(ratio - round(ratio)) > 1e-9 * ratio:
        raise ValueError(f"heartbeat_s ({heartbeat_s:g}) must be a whole multiple of tick_s ({tick_s:g})")
    return round(ratio)


def simulate(fleet: Fleet, jobs: list[SimJob], failures: list[DomainFailure] = (), *,
             tick_s: float = 10.0, heartbeat_s: float = 30.0, horizon_s: float | None = None,
             _use_ledger: bool = True) -> dict[str, Any]:
    ticks_per_heartbeat = check_periods(tick_s, heartbeat_s)
    for f in failures:
        pool = fleet.pool(f.pool)
        if not 0 <= f.domain < pool.domains:
            raise ValueError(f"failure at {f.at_s}s: pool {f.pool} has no domain {f.domain}")
    by_id = {j.id: j for j in jobs}
    pending = sorted(jobs, key=lambda j: (j.submit_s, j.id))
    running: dict[str, _Run] = {}
    saved: dict[str, float] = {}  # job id -> newest checkpointed progress of a stopped job
    completed: dict[str, float] = {}
    started_first: dict[str, float] = {}
    finished_since_hb = {p.name: set() for p in fleet.pools}
    up = {p.name: [True] * p.domains for p in fleet.pools}
    busy = {p.name: 0.0 for p in fleet.pools}
    clock = {"now": 0.0}

    def progress(job_id: str) -> float:
        r = running[job_id]
        return min(by_id[job_id].duration_s, r.resume_from + clock["now"] - r.start)

    def newest_checkpoint(job_id: str) -> float:
        if job_id in completed:
            return by_id[job_id].duration_s
        if job_id in running:
            return by_id[job_id].newest_checkpoint(progress(job_id))
        return saved.get(job_id, 0.0)

    def stop(job_id: str) -> None:
        saved[job_id] = newest_checkpoint(job_id)
        del running[job_id]

    router = Router(fleet, newest_checkpoint, _use_ledger=_use_ledger)
    stats = {"refused": [], "preempted": 0, "lost_to_failures": 0, "failed_launches": 0,
             "overallocations": 0, "split_jobs": 0, "ticks": 0, "heartbeats": 0, "placements": 0}
    fail_queue = sorted(failures, key=lambda f: f.at_s)
    repairs: list[tuple[float, str, int]] = []
    last_submit = pending[-1].submit_s if pending else 0.0
    horizon = (check_float("horizon_s", horizon_s, 0, 2 * MAX_TIME_S) if horizon_s is not None
               else last_submit + 30 * 86400)
    if horizon / tick_s > MAX_TICKS:
        raise ValueError(f"the replay could take {horizon / tick_s:.3g} ticks of tick_s={tick_s:g}s (horizon "
                         f"{horizon:.0f}s), more than the limit of {MAX_TICKS}: raise tick_s or set a shorter horizon_s")
    # Pool i heartbeats on ticks i, i+k, i+2k... (k ticks per heartbeat): counted in whole
    # ticks, since float times such as 0.1 * 3 never hit an exact multiple of the period.
    offsets = {p.name: i % ticks_per_heartbeat for i, p in enumerate(fleet.pools)}
    t = 0.0
    step = 0
    while True:
        clock["now"] = t
        # 1. truth: completions, failures, repairs
        for job_id in [j for j in running if progress(j) >= by_id[j].duration_s]:
            r = running.pop(job_id)
            completed[job_id] = t
            finished_since_hb[r.pool].add(job_id)
        for when, pool, d in [x for x in repairs if x[0] <= t]:
            up[pool][d] = True
            repairs.remove((when, pool, d))
        while fail_queue and fail_queue[0].at_s <= t:
            f = fail_queue.pop(0)
            up[f.pool][f.domain] = False
            repairs.append((f.at_s + f.down_s, f.pool, f.domain))
            for job_id in [j for j, r in running.items() if r.pool == f.pool and f.domain in r.domains]:
                stop(job_id)  # the router finds out from the next heartbeat
        # 2. submissions
        while pending and pending[0].submit_s <= t:
            job = pending.pop(0)
            try:
                router.submit(job.id, job.request, job.submit_s)
            except ValueError as err:
                stats["refused"].append(str(err))
        # 3. heartbeats, staggered per pool
        for pool in fleet.pools:
            if step >= offsets[pool.name] and (step - offsets[pool.name]) % ticks_per_heartbeat == 0:
                used = [0] * pool.domains
                mine = frozenset(j for j, r in running.items() if r.pool == pool.name)
                for j in mine:
                    for d, c in zip(running[j].domains, running[j].chips):
                        used[d] += c
                lost = router.heartbeat(PoolHeartbeat(pool.name, t, tuple(used), tuple(up[pool.name]),
                                                      mine, frozenset(finished_since_hb[pool.name])))
                stats["lost_to_failures"] += len(lost)
                finished_since_hb[pool.name].clear()
                stats["heartbeats"] += 1
        # 4. the router's tick, applied to the truth
        result = router.tick(t)
        stats["ticks"] += 1
        for pre in result.preemptions:
            stats["preempted"] += 1
            if pre.victim in running:
                stop(pre.victim)
            elif pre.victim in completed:
                router.report_finished(pre.victim)
        for pl in result.placements:
            stats["placements"] += 1
            if pl.job_id in completed:
                router.report_finished(pl.job_id)
                continue
            if not all(up[pl.pool][d] for d in pl.domains):
                stats["failed_launches"] += 1  # the node is gone; the heartbeat will show it lost
                continue
            running[pl.job_id] = _Run(pl.pool, pl.domains, pl.chips, t, router.jobs[pl.job_id].resume_from)
            started_first.setdefault(pl.job_id, t)
        # 5. independent audit of the truth
        over, split = audit(fleet, running, by_id, up)
        stats["overallocations"] += over
        stats["split_jobs"] += split
        # 6. utilization: chips held during the next tick_s seconds
        for r in running.values():
            busy[r.pool] += sum(r.chips) * tick_s
        step += 1
        t = step * tick_s
        all_known = not pending and not running and router.active() == 0
        if all_known or t > horizon:
            break
    sim_end = t
    waits = [started_first[j] - by_id[j].submit_s for j in started_first]
    return {
        "jobs": len(jobs),
        "placed": len(started_first),
        "completed": len(completed),
        "queued": len(router.queue()),
        "running": len(running),
        "refused": len(stats["refused"]),
        "refusals": stats["refused"][:10],
        "preempted": stats["preempted"],
        "resubmitted_after_failure": stats["lost_to_failures"],
        "failed_launches": stats["failed_launches"],
        "overallocations": stats["overallocations"],
        "split_jobs": stats["split_jobs"],
        "utilization": {p.name: round(busy[p.name] / (p.capacity * sim_end), 4) for p in fleet.pools},
        "queue_wait_s": {q: None if v is None else round(v, 1)
                         for q, v in (("p50", _percentile(waits, 50)), ("p95", _percentile(waits, 95)))},
        "placements": stats["placements"],
        "ticks": stats["ticks"],
        "heartbeats": stats["heartbeats"],
        "sim_end_s": sim_end,
    }


def audit(fleet: Fleet, running: Mapping[str, _Run], jobs: Mapping[str, SimJob],
          up: Mapping[str, list[bool]]) -> tuple[int, int]:
    """Count over-allocated domains and split jobs in the simulator's own state."""
    over = 0
    split = 0
    used = {p.name: [0] * p.domains for p in fleet.pools}
    for job_id, r in running.items():
        pool = fleet.pool(r.pool)
        req = jobs[job_id].request
        for d, c in zip(r.domains, r.chips):
            used[r.pool][d] += c
        wrong_pool = pool.accelerator != req.accelerator or (req.region is not None and req.region != pool.region)
        distinct = len(set(r.domains)) == len(r.domains)
        if pool.fits_one_domain(req.chips):
            ok = len(r.domains) == 1 and r.chips[0] >= req.chips
        else:
            ok = len(r.domains) == pool.domains_needed(req.chips) and all(c == pool.domain_chips for c in r.chips)
        if wrong_pool or not distinct or not ok:
            split += 1
    for pool in fleet.pools:
        for d, u in enumerate(used[pool.name]):
            if u > pool.domain_chips or (u > 0 and not up[pool.name][d]):
                over += 1
    return over, split
