"""Classify at submit time, place at schedule time: the one placement policy of the fleet.

Two callers drive the same Router: the fleet simulation (``cluster/simulate.py``) replays a
job stream through ``tick``, and the real run launcher (``orchestration/admission.py``)
admits each Dagster run through ``admit``, a tick of that one run. Both see a pool through
heartbeats plus the reservation ledger; the simulator's heartbeats are snapshots of its own
pools, the launcher's are read from Dagster's run storage (the runs in flight and the
placements recorded on them).

Rules (after the federation design of Marin's Iris scheduler, github.com/marin-community/marin):

* ``submit`` classifies a request and refuses one no pool could ever hold (unknown kind,
  region without such pool, bigger than any matching pool). Queued jobs hold no capacity.
* ``tick`` places queued jobs in priority order (production > interactive > batch, then
  submit time, then id) onto a pool whose view has room. The view of a domain is the last
  heartbeat's usage plus the reservation ledger, so two ticks between heartbeats never hand
  out the same slots. A job that fits one domain goes to exactly one domain (best fit); a
  larger one, or any job on a whole-domain (TPU slice) pool, takes whole free domains of one
  pool. Capacity never adds across pools or domains.
* When a job of band b cannot be placed, it may evict jobs of bands < b. Victims are chosen
  per domain lowest band first, newest first (then id), stopping as soon as the job fits;
  among candidate domains the one losing the fewest chips wins (then fleet order). Victims
  are re-queued and resume from their newest checkpoint.
* ``heartbeat`` replaces a pool's snapshot, records finished jobs, and re-queues jobs the
  router placed there that the pool no longer reports (a failed node): they resume from
  their newest checkpoint too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from marin_assets.cluster.fleet import Fleet, Pool
from marin_assets.cluster.ledger import ReservationLedger
from marin_assets.cluster.tags import JobRequest

QUEUED, RUNNING, DONE = "queued", "running", "done"


@dataclass(frozen=True)
class Placement:
    job_id: str
    pool: str
    domains: tuple[int, ...]
    chips: tuple[int, ...]  # chips held in each domain
    at: float


@dataclass(frozen=True)
class Preemption:
    victim: str
    by: str
    placement: Placement  # where the victim was
    resume_from: float  # the victim's newest checkpointed progress


@dataclass(frozen=True)
class PoolHeartbeat:
    """What a pool reports: per-domain usage and health as of ``as_of``, and its jobs."""

    pool: str
    as_of: float
    used: tuple[int, ...]
    healthy: tuple[bool, ...]
    running: frozenset[str]
    finished: frozenset[str] = frozenset()


@dataclass
class JobState:
    job_id: str
    request: JobRequest
    submitted_at: float
    status: str = QUEUED
    placement: Placement | None = None
    resume_from: float = 0.0  # progress (seconds of work) to resume from
    first_placed_at: float | None = None
    preemptions: int = 0
    resubmissions: int = 0
    pools: frozenset[str] | None = None  # None: any pool of the fleet that matches the request

    def held(self) -> Placement:
        """The placement of this running job; ValueError if it is not running."""
        if self.placement is None:
            raise ValueError(f"job {self.job_id} is not running")
        return self.placement


@dataclass
class TickResult:
    placements: list[Placement] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)


def check_feasible(fleet: Fleet, request: JobRequest, *, job_id: str = "job") -> list[Pool]:
    """The pools that could ever hold ``request``; ValueError naming the reason if none."""
    pools = fleet.matching(request.accelerator, request.region)
    where = f" in region {request.region}" if request.region else ""
    if not pools:
        raise ValueError(f"{job_id}: no {request.accelerator} pool{where} in the fleet")
    fitting = [p for p in pools if request.chips <= p.capacity]
    if not fitting:
        biggest = max(p.capacity for p in pools)
        raise ValueError(
            f"{job_id}: asks for {request.chips} {request.accelerator} chips but the largest matching pool{where} has {biggest}"
        )
    return fitting


# A way to make room: (victims, domains, chips per domain of the placement it allows).
_Option = tuple[list[JobState], tuple[int, ...], tuple[int, ...]]


def _no_checkpoint(job_id: str) -> float:
    """Without checkpoints a stopped job starts over."""
    return 0.0


class Router:
    """The fleet's scheduler: a queue, the placements it made, and its view of every pool."""

    def __init__(
        self,
        fleet: Fleet,
        newest_checkpoint: Callable[[str], float] = _no_checkpoint,
        *,
        _use_ledger: bool = True,  # False only to show in tests that the audit catches the race
    ) -> None:
        self.fleet = fleet
        self.newest_checkpoint = newest_checkpoint
        self.ledger = ReservationLedger()
        self._use_ledger = _use_ledger
        self.jobs: dict[str, JobState] = {}
        # Indexes so a tick or heartbeat costs O(queued + running), not O(all jobs ever).
        self._queued: set[str] = set()
        self._running: dict[str, set[str]] = {p.name: set() for p in fleet.pools}
        # Until a pool's first heartbeat its state is unknown: treat it as full.
        self._snapshot: dict[str, list[int]] = {p.name: [p.domain_chips] * p.domains for p in fleet.pools}
        self._healthy: dict[str, list[bool]] = {p.name: [False] * p.domains for p in fleet.pools}

    # ---- submit time ----------------------------------------------------------------------

    def submit(self, job_id: str, request: JobRequest, now: float, *, pools: frozenset[str] | None = None) -> JobState:
        """Queue a job (only onto ``pools`` if given); ValueError if no pool could ever run it."""
        if job_id in self.jobs:
            raise ValueError(f"job {job_id!r} was already submitted")
        self.check_feasible(request, job_id=job_id)
        state = JobState(job_id, request, now, pools=pools)
        self.jobs[job_id] = state
        self._queued.add(job_id)
        return state

    def check_feasible(self, request: JobRequest, *, job_id: str = "job") -> list[Pool]:
        """The pools of this router's fleet that could ever hold ``request`` (module ``check_feasible``)."""
        return check_feasible(self.fleet, request, job_id=job_id)

    # ---- observation ----------------------------------------------------------------------

    def heartbeat(self, hb: PoolHeartbeat) -> list[str]:
        """Apply a pool's report; returns ids of jobs found lost and re-queued."""
        pool = self.fleet.pool(hb.pool)
        if len(hb.used) != pool.domains or len(hb.healthy) != pool.domains:
            raise ValueError(f"heartbeat for {pool.name}: expected {pool.domains} domains")
        self._snapshot[pool.name] = list(hb.used)
        self._healthy[pool.name] = list(hb.healthy)
        self.ledger.on_heartbeat(pool.name, hb.as_of, hb.running)
        for job_id in hb.finished:
            if job_id in self.jobs:
                self.report_finished(job_id)
        lost = []
        for job_id in sorted(self._running[pool.name]):
            job = self.jobs[job_id]
            if job.job_id not in hb.running and job.held().at < hb.as_of:
                # Placed before the snapshot yet not there: its node failed. Re-submit.
                job.resubmissions += 1
                self._requeue(job)
                lost.append(job.job_id)
        return lost

    def report_finished(self, job_id: str) -> None:
        """A job completed (reported by a heartbeat, or by a worker answering a kill)."""
        job = self.jobs[job_id]
        self._unindex(job)
        job.status = DONE
        job.placement = None

    def _unindex(self, job: JobState) -> None:
        """Drop ``job`` from the queued and running indexes."""
        self._queued.discard(job.job_id)
        if job.placement is not None:
            self._running[job.placement.pool].discard(job.job_id)

    def _requeue(self, job: JobState) -> None:
        """Queue ``job`` again, to resume from its newest checkpoint."""
        self._unindex(job)
        self._queued.add(job.job_id)
        job.status = QUEUED
        job.placement = None
        job.resume_from = self.newest_checkpoint(job.job_id)

    # ---- schedule time --------------------------------------------------------------------

    def view(self, pool: Pool) -> list[int]:
        """Chips in use per domain as the router must assume them; unhealthy domains are full."""
        used = list(self._snapshot[pool.name])
        if self._use_ledger:
            delta = self.ledger.delta(pool.name, pool.domains)
            used = [u + d for u, d in zip(used, delta)]
        healthy = self._healthy[pool.name]
        return [u if healthy[d] else pool.domain_chips for d, u in enumerate(used)]

    def queue(self) -> list[JobState]:
        """Queued jobs in scheduling order: band (highest first), submit time, id."""
        queued = [self.jobs[j] for j in self._queued]
        return sorted(queued, key=lambda j: (-j.request.band, j.submitted_at, j.job_id))

    def tick(self, now: float) -> TickResult:
        """Place what fits of the queue, in priority order, evicting lower bands where allowed."""
        result = TickResult()
        views = {p.name: self.view(p) for p in self.fleet.pools}
        for job in self.queue():
            self._schedule(job, views, now, result)
        return result

    def admit(self, job_id: str, request: JobRequest, now: float, *, pools: frozenset[str] | None = None) -> TickResult:
        """A tick of one job: place it now (evicting lower bands if it must) or leave it queued.

        The launcher's entry: Dagster's run queue orders the runs and offers them one at a
        time. A job this router already knows is forgotten first (a new attempt).
        """
        self.withdraw(job_id)
        job = self.submit(job_id, request, now, pools=pools)
        result = TickResult()
        self._schedule(job, {p.name: self.view(p) for p in self.fleet.pools}, now, result)
        return result

    def _schedule(self, job: JobState, views: dict[str, list[int]], now: float, result: TickResult) -> None:
        """Place ``job`` in a free slot, else by evicting lower bands; record what happened in ``result``."""
        placement = self._find_slot(job, views, now)
        if placement is None and job.request.band > 0:
            placement = self._preempt_for(job, views, now, result)
        if placement is not None:
            self._place(job, placement, views)
            result.placements.append(placement)

    def _candidate_pools(self, job: JobState) -> list[Pool]:
        """The pools ``job`` may go to: its kind and region, big enough, among ``job.pools`` if set."""
        r = job.request
        return [
            p
            for p in self.fleet.matching(r.accelerator, r.region)
            if r.chips <= p.capacity and (job.pools is None or p.name in job.pools)
        ]

    def _find_slot(self, job: JobState, views: dict[str, list[int]], now: float) -> Placement | None:
        """The best free place for ``job`` without evicting anything, or None."""
        chips = job.request.chips
        best = None  # (key, placement)
        for order, pool in enumerate(self._candidate_pools(job)):
            used = views[pool.name]
            if pool.fits_one_domain(chips):
                for d, u in enumerate(used):
                    free = pool.domain_chips - u
                    if free >= chips:
                        key = (free, order, d)  # best fit: the tightest domain
                        if best is None or key < best[0]:
                            best = (key, Placement(job.job_id, pool.name, (d,), (chips,), now))
            else:
                need = pool.domains_needed(chips)
                empty = [d for d, u in enumerate(used) if u == 0]
                if len(empty) >= need:
                    key = (len(empty), order, 0)  # the pool with the fewest empty domains
                    doms = tuple(empty[:need])
                    if best is None or key < best[0]:
                        best = (key, Placement(job.job_id, pool.name, doms, (pool.domain_chips,) * need, now))
        return None if best is None else best[1]

    def _residents(self, pool: str, domain: int) -> list[JobState]:
        """The running jobs that hold chips in ``domain`` of ``pool``."""
        jobs = (self.jobs[j] for j in self._running[pool])
        return [j for j in jobs if domain in j.held().domains]

    @staticmethod
    def _held_in(job: JobState, domain: int) -> int:
        """Chips a running job holds in ``domain``."""
        p = job.held()
        return p.chips[p.domains.index(domain)]

    @staticmethod
    def _victim_order(j: JobState) -> tuple:
        """Eviction order: lowest band first, newest first, then id (deterministic)."""
        return (j.request.band, -j.held().at, j.job_id)

    def _preempt_for(self, job: JobState, views, now: float, result: TickResult) -> Placement | None:
        """Evict the cheapest set of lower-band jobs that makes room for ``job``; its placement, or None."""
        best = None  # (key, victims, placement)
        for order, pool in enumerate(self._candidate_pools(job)):
            if pool.fits_one_domain(job.request.chips):
                options = self._one_domain_options(job, pool, views[pool.name])
            else:
                options = self._whole_domain_options(job, pool, views[pool.name])
            for victims, domains, chips in options:
                key = (sum(v.request.chips for v in victims), order, domains[0])
                if best is None or key < best[0]:
                    best = (key, victims, Placement(job.job_id, pool.name, domains, chips, now))
        if best is None:
            return None
        _, victims, placement = best
        for v in victims:
            result.preemptions.append(self._evict(v, job.job_id, views, now))
        return placement

    def _one_domain_options(self, job: JobState, pool: Pool, used: list[int]) -> list[_Option]:
        """Per healthy domain, the victims (lowest band, newest first) that make ``job`` fit there."""
        chips, band = job.request.chips, job.request.band
        options = []
        for d in range(pool.domains):
            if not self._healthy[pool.name][d]:
                continue
            free = pool.domain_chips - used[d]
            victims = []
            for v in sorted(self._residents(pool.name, d), key=self._victim_order):
                if free >= chips:
                    break
                if v.request.band >= band:
                    break  # sorted by band: nothing evictable remains
                victims.append(v)
                free += self._held_in(v, d)
            if free >= chips and victims:
                options.append((victims, (d,), (chips,)))
        return options

    def _whole_domain_options(self, job: JobState, pool: Pool, used: list[int]) -> list[_Option]:
        """The cheapest whole domains of ``pool`` that can be cleared for ``job`` (every resident of a
        lower band), with their victims; empty if too few or nothing needs evicting."""
        band, need = job.request.band, pool.domains_needed(job.request.chips)
        options = []
        for d in range(pool.domains):
            if not self._healthy[pool.name][d]:
                continue
            residents = self._residents(pool.name, d)
            if used[d] == 0:
                options.append((0, d, []))
            elif residents and all(v.request.band < band for v in residents):
                # Only clear a domain whose whole usage is explained by known residents.
                if sum(self._held_in(v, d) for v in residents) == used[d]:
                    options.append((sum(v.request.chips for v in residents), d, residents))
        if len(options) < need:
            return []
        chosen = sorted(options, key=lambda o: (o[0], o[1]))[:need]
        victims = sorted({v.job_id: v for _, _, vs in chosen for v in vs}.values(), key=self._victim_order)
        return [(victims, tuple(sorted(d for _, d, _ in chosen)), (pool.domain_chips,) * need)] if victims else []

    def _evict(self, victim: JobState, by: str, views, now: float) -> Preemption:
        """Release a victim's chips (ledger and this tick's views) and queue it again."""
        p = victim.held()
        self.ledger.release(victim.job_id, p.pool, p.domains, p.chips, now)
        used = views[p.pool]
        for d, c in zip(p.domains, p.chips):
            used[d] -= c
        victim.preemptions += 1
        self._requeue(victim)
        return Preemption(victim.job_id, by, p, victim.resume_from)

    def _place(self, job: JobState, placement: Placement, views) -> None:
        """Reserve ``placement`` for ``job`` (ledger and this tick's views) and mark it running."""
        self.ledger.reserve(job.job_id, placement.pool, placement.domains, placement.chips, placement.at)
        used = views[placement.pool]
        for d, c in zip(placement.domains, placement.chips):
            used[d] += c
        self._unindex(job)
        job.status = RUNNING
        job.placement = placement
        self._running[placement.pool].add(job.job_id)
        if job.first_placed_at is None:
            job.first_placed_at = placement.at

    # ---- bookkeeping ----------------------------------------------------------------------

    def adopt(self, job_id: str, request: JobRequest, placement: Placement) -> None:
        """Record a job already running at ``placement`` that this router did not place (a launcher
        restarted: its runs in flight are read back from run storage). The heartbeat counts its chips."""
        self.withdraw(job_id)
        job = JobState(job_id, request, placement.at, status=RUNNING, placement=placement, first_placed_at=placement.at)
        self.jobs[job_id] = job
        self._running[placement.pool].add(job_id)

    def withdraw(self, job_id: str) -> None:
        """Forget a job (no-op if unknown): the launcher keeps no queue of its own (a run that does not
        fit waits in Dagster's queue), and a preempted run comes back as a new run."""
        job = self.jobs.pop(job_id, None)
        if job is not None:
            self._unindex(job)

    def active(self) -> int:
        """Jobs the router still has to see through: queued or (as far as it knows) running."""
        return len(self._queued) + sum(len(r) for r in self._running.values())

    def counts(self) -> dict[str, int]:
        """How many jobs are queued, running and done."""
        out = {QUEUED: 0, RUNNING: 0, DONE: 0}
        for j in self.jobs.values():
            out[j.status] += 1
        return out
