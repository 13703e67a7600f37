"""Capacity admission: the run launcher starts a run only where its fleet pool has room.

One implementation with the fleet simulation: ``CapacityAdmission`` holds a
``cluster.routing.Router`` (the same placement and preemption rules, the same reservation
ledger) and offers it each run through ``Router.admit``, a tick of that one run. What the
simulator's pools report in heartbeats, Dagster's run storage reports here: before each
admission every pool's heartbeat is read from the runs in flight (Dagster's
ACTIVE_RUN_STATUSES: starting, started, canceling) and the placement the launcher wrote on
each (the ``marin/placement`` tag), so a launcher that restarts reads its placements back.
The ledger then holds what this admission placed or evicted until a heartbeat shows it.

The launcher (``launcher.py``) acts on the answer:

* a run that fits is placed: its placement is written onto the run, then it is launched;
* a run that does not fit goes back to Dagster's run queue, holding nothing, and the queue
  daemon offers it again on its next pass, in Dagster's queue order (``dagster/priority``,
  which ``run_queue.MarinQueuedRunCoordinator`` derives from marin/priority);
* a run that fits only by evicting lower-priority runs evicts them first (``stop_victim``):
  the launcher terminates each victim through its backend and marks it failed, and Dagster's
  run retries (``run_retries``, tag ``dagster/max_retries``) re-execute it as a new run that
  waits in the queue like any other and resumes from its newest checkpoint.

Admissions are serialised by a lock: Dagster's queue daemon may dequeue in threads. One
daemon process launches runs (Dagster runs one); a second admitting process would see the
first one's placements only through run storage, after they are written.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from dagster import DagsterRun, RunsFilter

from marin_assets.cluster.fleet import Fleet, Pool, check_record
from marin_assets.cluster.routing import RUNNING, Placement, PoolHeartbeat, Router
from marin_assets.cluster.tags import PLACEMENT_TAG, POOL_TAG, JobRequest, check_name, classify_tags
from marin_assets.orchestration.compat import ACTIVE_RUN_STATUSES

_PLACEMENT_FIELDS = {"pool", "domains", "chips", "at"}
_MAX_WAITING_NOTES = 100_000  # run ids told why they wait; forgotten wholesale past this


def placement_tag(placement: Placement) -> str:
    """The ``marin/placement`` value recording ``placement`` on its run (compact JSON)."""
    return json.dumps(
        {"pool": placement.pool, "domains": list(placement.domains), "chips": list(placement.chips), "at": placement.at},
        separators=(",", ":"),
    )


def parse_placement(value: str, fleet: Fleet, *, run_id: str) -> Placement:
    """A ``marin/placement`` value read back from run storage; ValueError naming the run and field."""
    where = f"run {run_id}: tag {PLACEMENT_TAG}"
    try:
        raw = json.loads(value)
    except ValueError:
        raise ValueError(f"{where}: {value[:80]!r} is not JSON") from None
    check_record(raw, _PLACEMENT_FIELDS, where)
    if set(raw) != _PLACEMENT_FIELDS:
        raise ValueError(f"{where}: needs the fields {sorted(_PLACEMENT_FIELDS)}")
    try:
        pool = fleet.pool(check_name(f"{where}: pool", raw["pool"]))
    except KeyError as err:
        raise ValueError(f"{where}: {err.args[0]}") from None
    domains, chips, at = raw["domains"], raw["chips"], raw["at"]
    if (
        not _int_list(domains, 0, pool.domains - 1)
        or not _int_list(chips, 1, pool.domain_chips)
        or len(domains) != len(chips)
        or len(set(domains)) != len(domains)
    ):
        raise ValueError(f"{where}: domains {domains!r} and chips {chips!r} do not fit pool {pool.name}")
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
        raise ValueError(f"{where}: at {at!r} is not a finite time")
    return Placement(run_id, pool.name, tuple(domains), tuple(chips), float(at))


def _int_list(values, lo: int, hi: int) -> bool:
    """A non-empty list of integers (not bools) in [lo, hi]."""
    return (
        isinstance(values, list)
        and bool(values)
        and all(isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi for v in values)
    )


def candidate_pools(fleet: Fleet, request: JobRequest, tags: Mapping[str, str], regions: Iterable[str]) -> frozenset[str]:
    """The pools a run may be placed on: its kind and size, its ``marin/pool`` tag if any, and
    the regions of the backend that will run it (none listed: any region)."""
    regions = set(regions)
    names = frozenset(
        p.name
        for p in fleet.matching(request.accelerator, request.region)
        if request.chips <= p.capacity and (not regions or p.region in regions) and tags.get(POOL_TAG) in (None, p.name)
    )
    if not names:
        where = f" in {sorted(regions)}" if regions else ""
        raise ValueError(
            f"no pool of the fleet{where} can hold {request.chips} x {request.accelerator}"
            + (f" (tag {POOL_TAG}: {tags[POOL_TAG]})" if POOL_TAG in tags else "")
        )
    return names


@dataclass(frozen=True)
class Admission:
    """The answer for one run: its placement and the runs evicted for it, or why it waits."""

    placement: Placement | None
    victims: tuple[str, ...] = ()
    reason: str = ""  # why it was not placed


class CapacityAdmission:
    """The launcher's Router, fed heartbeats from Dagster's run storage."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.router = Router(fleet)
        self._lock = threading.Lock()
        self._waiting_noted: set[str] = set()

    def admit(
        self, instance, run_id: str, request: JobRequest, pools: frozenset[str], stop_victim: Callable[[str], None]
    ) -> Admission:
        """Place run ``run_id`` now if its pools have room, calling ``stop_victim`` for each run
        evicted to make it, then write the placement onto the run; else say why it waits."""
        with self._lock:
            now = time.time()
            try:
                self._heartbeat(instance, exclude=run_id, now=now)
            except ValueError as err:  # a damaged placement: count nothing as free until it is gone
                return Admission(None, reason=f"the fleet's usage cannot be read ({err})")
            result = self.router.admit(run_id, request, now, pools=pools)
            if not result.placements:
                self.router.withdraw(run_id)
                return Admission(None, reason=_waiting_reason(request, pools))
            victims = tuple(p.victim for p in result.preemptions)
            for victim in victims:
                self.router.withdraw(victim)  # a preempted run comes back as a new run
                stop_victim(victim)
            [placement] = result.placements
            instance.add_run_tags(run_id, {PLACEMENT_TAG: placement_tag(placement)})
            self._waiting_noted.discard(run_id)
            return Admission(placement, victims)

    def first_wait(self, run_id: str) -> bool:
        """True the first time ``run_id`` waits (so its reason is reported once, not every pass)."""
        if run_id in self._waiting_noted:
            return False
        if len(self._waiting_noted) >= _MAX_WAITING_NOTES:
            self._waiting_noted.clear()
        self._waiting_noted.add(run_id)
        return True

    def view(self, pool: str) -> list[int]:
        """Chips per domain of ``pool`` as the router must assume them now (snapshot + ledger)."""
        return self.router.view(self.fleet.pool(pool))

    def _heartbeat(self, instance, *, exclude: str, now: float) -> None:
        """Every pool reports the runs in flight placed on it (all but ``exclude``, the run being
        admitted); runs the router placed that are no longer in flight are finished and forgotten."""
        placed = _placed_runs(instance, self.fleet, exclude)
        for pool in self.fleet.pools:
            mine = placed[pool.name]
            for run_id, (placement, run) in mine.items():
                if run_id not in self.router.jobs:
                    self.router.adopt(run_id, classify_tags(run.tags), placement)
            finished = frozenset(
                j
                for j, s in self.router.jobs.items()
                if s.status == RUNNING and s.placement is not None and s.placement.pool == pool.name and j not in mine
            )
            self.router.heartbeat(
                PoolHeartbeat(pool.name, now, _usage(pool, mine.values()), (True,) * pool.domains, frozenset(mine), finished)
            )
            for run_id in finished:
                self.router.withdraw(run_id)


def _placed_runs(instance, fleet: Fleet, exclude: str) -> dict[str, dict[str, tuple[Placement, DagsterRun]]]:
    """{pool: {run id: (placement, run)}} over the runs in flight that carry a placement."""
    placed: dict[str, dict[str, tuple[Placement, DagsterRun]]] = {p.name: {} for p in fleet.pools}
    for run in instance.get_runs(RunsFilter(statuses=list(ACTIVE_RUN_STATUSES))):
        value = run.tags.get(PLACEMENT_TAG)
        if run.run_id != exclude and value:
            placement = parse_placement(value, fleet, run_id=run.run_id)
            placed[placement.pool][run.run_id] = (placement, run)
    return placed


def _usage(pool: Pool, placed: Iterable[tuple[Placement, DagsterRun]]) -> tuple[int, ...]:
    """Chips in use per domain of ``pool`` by these placements."""
    used = [0] * pool.domains
    for placement, _ in placed:
        for d, c in zip(placement.domains, placement.chips, strict=True):
            used[d] += c
    return tuple(used)


def _waiting_reason(request: JobRequest, pools: frozenset[str]) -> str:
    """Why a run was not placed."""
    evict = "" if request.band == 0 else f"; no runs of a lower priority than {request.priority} can make room"
    return f"{request.chips} x {request.accelerator} does not fit in pool {', '.join(sorted(pools))} now{evict}"
