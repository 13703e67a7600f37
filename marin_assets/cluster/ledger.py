"""The reservation ledger: what the scheduler changed since a pool's last heartbeat.

The router sees a pool through heartbeats (every 30 s) but schedules on every tick (every
few seconds). Between two heartbeats the snapshot is stale: a slot handed out on tick 1
still looks free on tick 2. The ledger records every placement (a *reservation*) and every
eviction the router ordered (a *release*) with the time it happened, and the router's view
of a domain is ``snapshot + reservations - releases``.

A heartbeat is authoritative for everything that happened before its ``as_of`` time, so
entries older than that are dropped. The two kinds are cleared asymmetrically, each in the
safe direction: a reservation is kept while the snapshot may not show it yet (``at >=
as_of``; counting it twice only makes the router cautious), while a release is kept only
while the snapshot certainly still shows the victim (``at > as_of`` and the victim is still
reported running); counting a release twice would hand out slots that are not free.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class LedgerEntry:
    job_id: str
    pool: str
    domains: tuple[int, ...]
    chips: tuple[int, ...]  # chips per domain, parallel to ``domains``
    at: float
    sign: int  # +1 reservation, -1 release


class ReservationLedger:
    def __init__(self) -> None:
        self._entries: dict[str, list[LedgerEntry]] = {}

    def reserve(self, job_id: str, pool: str, domains: Iterable[int], chips: Iterable[int], at: float) -> None:
        self._add(LedgerEntry(job_id, pool, tuple(domains), tuple(chips), at, +1))

    def release(self, job_id: str, pool: str, domains: Iterable[int], chips: Iterable[int], at: float) -> None:
        self._add(LedgerEntry(job_id, pool, tuple(domains), tuple(chips), at, -1))

    def _add(self, entry: LedgerEntry) -> None:
        if len(entry.domains) != len(entry.chips):
            raise ValueError("ledger entry needs one chip count per domain")
        self._entries.setdefault(entry.pool, []).append(entry)

    def delta(self, pool: str, num_domains: int) -> list[int]:
        """Net chips per domain placed (+) or evicted (-) since the pool's last heartbeat."""
        out = [0] * num_domains
        for entry in self._entries.get(pool, ()):
            for d, c in zip(entry.domains, entry.chips):
                out[d] += entry.sign * c
        return out

    def on_heartbeat(self, pool: str, as_of: float, running: frozenset[str]) -> None:
        kept = []
        for entry in self._entries.get(pool, ()):
            if entry.sign > 0:
                keep = entry.at >= as_of and entry.job_id not in running
            else:
                keep = entry.at > as_of and entry.job_id in running
            if keep:
                kept.append(entry)
        self._entries[pool] = kept

    def entries(self, pool: str) -> list[LedgerEntry]:
        return list(self._entries.get(pool, ()))
