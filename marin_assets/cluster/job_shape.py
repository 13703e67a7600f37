"""The shape of a job on a pool (``job_shape``): the whole domains, hosts per domain and chips per
host a job of so many chips takes, or a one-line ValueError when the pool cannot hold it."""

from __future__ import annotations

from dataclasses import dataclass

from marin_assets.cluster.fleet import Pool


@dataclass(frozen=True)
class JobShape:
    """How a job of ``chips`` chips sits on a pool: whole domains, hosts per domain, chips per host."""

    pool: Pool
    domains: int
    hosts_per_domain: int
    chips_per_host: int

    @property
    def chips(self) -> int:
        return self.domains * self.hosts_per_domain * self.chips_per_host

    @property
    def processes(self) -> int:
        return self.domains * self.hosts_per_domain


def job_shape(pool: Pool, chips: int) -> JobShape:
    """The shape of a ``chips``-chip job on ``pool``; ValueError naming the pool if it has none.

    A job larger than a domain, or any job on a whole-domain pool (a TPU slice), takes whole
    domains, so its size must be a multiple of the domain. A smaller job on a shared pool
    (GPU nodes, a GB200 rack) takes whole hosts of one domain, or part of a single host.
    """
    where = f"pool {pool.name} ({pool.accelerator}, {pool.domain_chips} chips per domain)"
    if isinstance(chips, bool) or not isinstance(chips, int) or chips < 1:
        raise ValueError(f"{where}: chips must be a positive integer, got {chips!r}")
    if pool.whole_domain or chips > pool.domain_chips:
        if chips % pool.domain_chips:
            raise ValueError(
                f"{where}: {chips} chips is not a whole number of domains; ask for a multiple of {pool.domain_chips}"
            )
        domains = chips // pool.domain_chips
        if domains > pool.domains:
            raise ValueError(f"{where}: {chips} chips needs {domains} domains but the pool has {pool.domains}")
        return JobShape(pool, domains, pool.hosts_per_domain, pool.chips_per_host)
    if chips < pool.chips_per_host:
        return JobShape(pool, 1, 1, chips)
    if chips % pool.chips_per_host:
        raise ValueError(f"{where}: {chips} chips is not a whole number of hosts; ask for a multiple of {pool.chips_per_host}")
    return JobShape(pool, 1, chips // pool.chips_per_host, pool.chips_per_host)
