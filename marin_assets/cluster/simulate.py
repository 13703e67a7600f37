"""Fleet simulation: replay a job stream through the real Router and audit the result.

The simulator plays the pools (the "truth"): it starts and stops jobs, takes the heartbeat
snapshots (every ``heartbeat_s``, staggered per pool), fails and repairs domains, and keeps
each job's checkpoints. The Router only sees heartbeats and makes decisions every
``tick_s``. After every tick an audit recomputes usage from the simulator's own run records
(never from the router's bookkeeping) and counts over-allocated domains and split jobs.

The jobs file (schema, reader) is ``cluster/jobs.py``; the generator behind
examples/jobs.yaml is ``cluster/job_stream.py``. Both are re-exported here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from marin_assets.cluster.fleet import Fleet
from marin_assets.cluster.job_stream import JobStreamConfig, generate_jobs  # noqa: F401 (re-exported)
from marin_assets.cluster.jobs import (  # noqa: F401 (re-exported)
    MAX_JOBS,
    MAX_TIME_S,
    DomainFailure,
    SimJob,
    job_from_dict,
    jobs_from_dict,
    load_jobs,
)
from marin_assets.cluster.routing import PoolHeartbeat, Router, TickResult
from marin_assets.knobs import knob
from marin_assets.numeric_checks import check_float

# At most MAX_TICKS scheduling ticks: the loop runs once per tick up to the horizon.
MAX_TICKS = 5_000_000
MIN_TICK_S = 0.001


@dataclass
class _Run:
    """A job running in the simulated pools: where, since when, from which progress."""

    pool: str
    domains: tuple[int, ...]
    chips: tuple[int, ...]
    start: float
    resume_from: float


def _percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile: the smallest value with at least q% of the data at or below it."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def check_periods(tick_s: float, heartbeat_s: float) -> int:
    """Validate the two periods; return how many ticks one heartbeat period spans."""
    tick_s = check_float("tick_s", tick_s, MIN_TICK_S, 86400.0)
    heartbeat_s = check_float("heartbeat_s", heartbeat_s, tick_s, 86400.0)
    ratio = heartbeat_s / tick_s
    if abs(ratio - round(ratio)) > 1e-9 * ratio:
        raise ValueError(f"heartbeat_s ({heartbeat_s:g}) must be a whole multiple of tick_s ({tick_s:g})")
    return round(ratio)


@dataclass(frozen=True)
class SimulationConfig:
    """The replay's clocks. Knobs (marin_assets/knobs.py): `marin cluster simulate` flags."""

    tick_s: float = knob(10.0, help="scheduling tick period, seconds")
    heartbeat_s: float = knob(30.0, help="heartbeat period, seconds (a whole multiple of tick_s)")
    horizon_s: float | None = knob(None, help="stop the replay at this simulated time; none: 30 days after the last submit")

    def __post_init__(self) -> None:
        check_periods(self.tick_s, self.heartbeat_s)
        if self.horizon_s is not None:
            check_float("horizon_s", self.horizon_s, 0, 2 * MAX_TIME_S)


def _check_failures(fleet: Fleet, failures: Sequence[DomainFailure]) -> None:
    """Every failure must name a domain that exists."""
    for f in failures:
        pool = fleet.pool(f.pool)
        if not 0 <= f.domain < pool.domains:
            raise ValueError(f"failure at {f.at_s}s: pool {f.pool} has no domain {f.domain}")


def _horizon(config: SimulationConfig, jobs: list[SimJob]) -> float:
    """When the replay stops at the latest; ValueError if that is more ticks than MAX_TICKS."""
    last_submit = max((j.submit_s for j in jobs), default=0.0)
    horizon = config.horizon_s if config.horizon_s is not None else last_submit + 30 * 86400
    if horizon / config.tick_s > MAX_TICKS:
        raise ValueError(
            f"the replay could take {horizon / config.tick_s:.3g} ticks of tick_s={config.tick_s:g}s "
            f"(horizon {horizon:.0f}s), more than the limit of {MAX_TICKS}: raise tick_s or set a "
            "shorter horizon_s"
        )
    return horizon


class _Replay:
    """The simulated pools (the truth) around one Router; ``step`` is one scheduling tick."""

    def __init__(
        self, fleet: Fleet, jobs: list[SimJob], failures: list[DomainFailure], config: SimulationConfig, use_ledger: bool
    ) -> None:
        self.fleet, self.tick_s = fleet, config.tick_s
        self.by_id = {j.id: j for j in jobs}
        self.pending = sorted(jobs, key=lambda j: (j.submit_s, j.id))
        self.running: dict[str, _Run] = {}
        self.saved: dict[str, float] = {}  # job id -> newest checkpointed progress of a stopped job
        self.completed: dict[str, float] = {}
        self.started_first: dict[str, float] = {}
        self.finished_since_hb: dict[str, set[str]] = {p.name: set() for p in fleet.pools}
        self.up = {p.name: [True] * p.domains for p in fleet.pools}
        self.busy = {p.name: 0.0 for p in fleet.pools}
        self.fail_queue = sorted(failures, key=lambda f: f.at_s)
        self.repairs: list[tuple[float, str, int]] = []
        self.now = 0.0
        self.router = Router(fleet, self.newest_checkpoint, _use_ledger=use_ledger)
        self.stats = {
            "refused": [],
            "preempted": 0,
            "lost_to_failures": 0,
            "failed_launches": 0,
            "overallocations": 0,
            "split_jobs": 0,
            "ticks": 0,
            "heartbeats": 0,
            "placements": 0,
        }
        # Pool i heartbeats on ticks i, i+k, i+2k... (k ticks per heartbeat): counted in whole
        # ticks, since float times such as 0.1 * 3 never hit an exact multiple of the period.
        self.ticks_per_heartbeat = check_periods(config.tick_s, config.heartbeat_s)
        self.offsets = {p.name: i % self.ticks_per_heartbeat for i, p in enumerate(fleet.pools)}

    def progress(self, job_id: str) -> float:
        """Seconds of work a running job has done by now."""
        r = self.running[job_id]
        return min(self.by_id[job_id].duration_s, r.resume_from + self.now - r.start)

    def newest_checkpoint(self, job_id: str) -> float:
        """Progress a job would resume from if it stopped now (the Router's view of checkpoints)."""
        if job_id in self.completed:
            return self.by_id[job_id].duration_s
        if job_id in self.running:
            return self.by_id[job_id].newest_checkpoint(self.progress(job_id))
        return self.saved.get(job_id, 0.0)

    def stop(self, job_id: str) -> None:
        """Stop a running job, keeping its newest checkpoint."""
        self.saved[job_id] = self.newest_checkpoint(job_id)
        del self.running[job_id]

    def step(self, step: int) -> None:
        """One tick at ``step * tick_s``: truth, submissions, heartbeats, the router, the audit."""
        self.now = t = step * self.tick_s
        self._complete_repair_and_fail(t)
        self._submit_arrivals()
        self._heartbeats(step, t)
        self._apply(self.router.tick(t), t)
        self.stats["ticks"] += 1
        over, split = audit(self.fleet, self.running, self.by_id, self.up)
        self.stats["overallocations"] += over
        self.stats["split_jobs"] += split
        for r in self.running.values():  # utilization: chips held during the next tick_s seconds
            self.busy[r.pool] += sum(r.chips) * self.tick_s

    def _complete_repair_and_fail(self, t: float) -> None:
        """The truth moves on: jobs complete, domains come back, domains fail (killing their jobs)."""
        for job_id in [j for j in self.running if self.progress(j) >= self.by_id[j].duration_s]:
            r = self.running.pop(job_id)
            self.completed[job_id] = t
            self.finished_since_hb[r.pool].add(job_id)
        for when, pool, d in [x for x in self.repairs if x[0] <= t]:
            self.up[pool][d] = True
            self.repairs.remove((when, pool, d))
        while self.fail_queue and self.fail_queue[0].at_s <= t:
            f = self.fail_queue.pop(0)
            self.up[f.pool][f.domain] = False
            self.repairs.append((f.at_s + f.down_s, f.pool, f.domain))
            for job_id in [j for j, r in self.running.items() if r.pool == f.pool and f.domain in r.domains]:
                self.stop(job_id)  # the router finds out from the next heartbeat

    def _submit_arrivals(self) -> None:
        """Hand the router every job submitted by now; count the refused ones."""
        while self.pending and self.pending[0].submit_s <= self.now:
            job = self.pending.pop(0)
            try:
                self.router.submit(job.id, job.request, job.submit_s)
            except ValueError as err:
                self.stats["refused"].append(str(err))

    def _heartbeats(self, step: int, t: float) -> None:
        """Each pool whose turn it is reports its usage, health and jobs to the router."""
        for pool in self.fleet.pools:
            offset = self.offsets[pool.name]
            if step < offset or (step - offset) % self.ticks_per_heartbeat:
                continue
            used = [0] * pool.domains
            mine = frozenset(j for j, r in self.running.items() if r.pool == pool.name)
            for j in mine:
                for d, c in zip(self.running[j].domains, self.running[j].chips):
                    used[d] += c
            lost = self.router.heartbeat(
                PoolHeartbeat(
                    pool.name, t, tuple(used), tuple(self.up[pool.name]), mine, frozenset(self.finished_since_hb[pool.name])
                )
            )
            self.stats["lost_to_failures"] += len(lost)
            self.finished_since_hb[pool.name].clear()
            self.stats["heartbeats"] += 1

    def _apply(self, result: TickResult, t: float) -> None:
        """Carry out the router's decisions on the truth: stop the victims, start the placements."""
        for pre in result.preemptions:
            self.stats["preempted"] += 1
            if pre.victim in self.running:
                self.stop(pre.victim)
            elif pre.victim in self.completed:
                self.router.report_finished(pre.victim)
        for pl in result.placements:
            self.stats["placements"] += 1
            if pl.job_id in self.completed:
                self.router.report_finished(pl.job_id)
                continue
            if not all(self.up[pl.pool][d] for d in pl.domains):
                self.stats["failed_launches"] += 1  # the node is gone; the heartbeat will show it lost
                continue
            self.running[pl.job_id] = _Run(pl.pool, pl.domains, pl.chips, t, self.router.jobs[pl.job_id].resume_from)
            self.started_first.setdefault(pl.job_id, t)

    def done(self) -> bool:
        """Nothing left to submit, run or see through."""
        return not self.pending and not self.running and self.router.active() == 0

    def report(self, sim_end: float) -> dict[str, Any]:
        """The replay's outcome: counts, audit results, utilization and queue waits."""
        waits = [self.started_first[j] - self.by_id[j].submit_s for j in self.started_first]
        stats = self.stats
        return {
            "jobs": len(self.by_id),
            "placed": len(self.started_first),
            "completed": len(self.completed),
            "queued": len(self.router.queue()),
            "running": len(self.running),
            "refused": len(stats["refused"]),
            "refusals": stats["refused"][:10],
            "preempted": stats["preempted"],
            "resubmitted_after_failure": stats["lost_to_failures"],
            "failed_launches": stats["failed_launches"],
            "overallocations": stats["overallocations"],
            "split_jobs": stats["split_jobs"],
            "utilization": {p.name: round(self.busy[p.name] / (p.capacity * sim_end), 4) for p in self.fleet.pools},
            "queue_wait_s": {
                q: None if v is None else round(v, 1)
                for q, v in (("p50", _percentile(waits, 50)), ("p95", _percentile(waits, 95)))
            },
            "placements": stats["placements"],
            "ticks": stats["ticks"],
            "heartbeats": stats["heartbeats"],
            "sim_end_s": sim_end,
        }


def simulate(
    fleet: Fleet,
    jobs: list[SimJob],
    failures: Sequence[DomainFailure] = (),
    config: SimulationConfig | None = None,
    *,
    _use_ledger: bool = True,
) -> dict[str, Any]:
    """Replay ``jobs`` and ``failures`` on ``fleet`` tick by tick until all is done or the horizon.

    ``_use_ledger=False`` only shows in tests that the audit catches the double-booking race.
    """
    config = config or SimulationConfig()
    _check_failures(fleet, failures)
    horizon = _horizon(config, jobs)
    replay = _Replay(fleet, jobs, list(failures), config, _use_ledger)
    step = 0
    while True:
        replay.step(step)
        step += 1
        if replay.done() or step * config.tick_s > horizon:
            return replay.report(step * config.tick_s)


def audit(fleet: Fleet, running: Mapping[str, _Run], jobs: Mapping[str, SimJob], up: Mapping[str, list[bool]]) -> tuple[int, int]:
    """Count over-allocated domains and split jobs in the simulator's own state."""
    used = {p.name: [0] * p.domains for p in fleet.pools}
    split = 0
    for job_id, r in running.items():
        for d, c in zip(r.domains, r.chips):
            used[r.pool][d] += c
        split += not _placed_whole(fleet.pool(r.pool), jobs[job_id], r)
    over = sum(
        u > pool.domain_chips or (u > 0 and not up[pool.name][d]) for pool in fleet.pools for d, u in enumerate(used[pool.name])
    )
    return over, split


def _placed_whole(pool, job: SimJob, r: _Run) -> bool:
    """``r`` is on the right kind of pool, in one domain if the job fits one, else in whole domains."""
    req = job.request
    right_pool = pool.accelerator == req.accelerator and (req.region is None or req.region == pool.region)
    distinct = len(set(r.domains)) == len(r.domains)
    if pool.fits_one_domain(req.chips):
        shaped = len(r.domains) == 1 and r.chips[0] >= req.chips
    else:
        shaped = len(r.domains) == pool.domains_needed(req.chips) and all(c == pool.domain_chips for c in r.chips)
    return right_pool and distinct and shaped
