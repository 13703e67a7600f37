"""The fleet: pools of identical interconnect domains.

A *domain* is the largest set of chips that talks over the fast interconnect: one TPU
slice (ICI), one GB200 NVL72 rack (NVLink, 72 GPUs), one 8xH100 node, one CPU node.
Capacity is counted per domain and never adds across domains or pools, so an 8-GPU job
is never split 4+4 over two nodes. A job bigger than one domain takes whole domains of a
single pool (multislice TPU, multi-rack GB200), never a partial one.

Fleet file schema (YAML or JSON)::

    pools:
      - name: gb200            # unique, lower-case letters/digits/'-'
        accelerator: gb200-nvl72  # cpu | tpu-v4 | tpu-v5e | tpu-v5p | h100x8 | gb200-nvl72
        region: us-central1
        domains: 11            # how many racks / slices / nodes
        domain_chips: 72       # optional, default per accelerator (TPU: product of topology)
        chips_per_host: 4      # optional, default per accelerator
        topology: 16x16        # TPU only (required there): e.g. 16x16 (v5e), 4x8x8 (v5p)
        ep_domain_chips: 64    # optional: expert-parallel group inside a domain (GB200: 64): whole
                               # hosts, or part of one; the pods' MARIN_EP_DOMAIN_CHIPS, the bound
                               # of the training mesh's expert axis (default: one host's chips)
        whole_domain: true     # optional: jobs take whole domains (default: true for TPU)
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marin_assets.cluster.tags import ACCELERATORS, MAX_CHIPS, check_accelerator, check_name, check_region
from marin_assets.config_files import MAX_CONFIG_BYTES, load_structured  # noqa: F401 (re-exported)
from marin_assets.numeric_checks import check_int

# Bounds that keep a simulation or a rendered manifest finite and in memory. Real fleets sit
# far below them: the largest pools today have thousands of racks or slices.
MAX_DOMAINS = 100_000  # per pool
MAX_FLEET_DOMAINS = 1_000_000  # all pools together
MAX_POOLS = 1_000


@dataclass(frozen=True)
class AcceleratorSpec:
    kind: str
    chips_per_host: int
    domain_chips: int | None  # None: set by the TPU topology
    is_tpu: bool
    gke_accelerator: str | None = None  # cloud.google.com/gke-tpu-accelerator value
    chip_resource: str | None = None  # Kubernetes extended resource for one chip


ACCELERATOR_SPECS: dict[str, AcceleratorSpec] = {
    "cpu": AcceleratorSpec("cpu", chips_per_host=64, domain_chips=64, is_tpu=False, chip_resource="cpu"),
    "tpu-v4": AcceleratorSpec("tpu-v4", 4, None, True, "tpu-v4-podslice", "google.com/tpu"),
    "tpu-v5e": AcceleratorSpec("tpu-v5e", 4, None, True, "tpu-v5-lite-podslice", "google.com/tpu"),
    "tpu-v5p": AcceleratorSpec("tpu-v5p", 4, None, True, "tpu-v5p-slice", "google.com/tpu"),
    "h100x8": AcceleratorSpec("h100x8", 8, 8, False, None, "nvidia.com/gpu"),
    "gb200-nvl72": AcceleratorSpec("gb200-nvl72", 4, 72, False, None, "nvidia.com/gpu"),
}
assert set(ACCELERATOR_SPECS) == set(ACCELERATORS)

_TOPOLOGY_RE = re.compile(r"[1-9][0-9]{0,2}(x[1-9][0-9]{0,2}){1,2}")


def topology_chips(topology: str) -> int:
    if not isinstance(topology, str) or not _TOPOLOGY_RE.fullmatch(topology):
        raise ValueError(f"topology {topology!r} is not like '16x16' or '4x8x8'")
    return math.prod(int(d) for d in topology.split("x"))


@dataclass(frozen=True)
class Pool:
    name: str
    accelerator: str
    region: str
    domains: int
    domain_chips: int = 0  # 0: take the accelerator default / topology
    chips_per_host: int = 0  # 0: take the accelerator default
    topology: str | None = None
    ep_domain_chips: int | None = None
    whole_domain: bool | None = None  # None: TPU pools are whole-slice, others share domains

    def __post_init__(self) -> None:
        where = f"pool {self.name!r}"
        check_name("pool name", self.name)
        check_accelerator(self.accelerator, what=f"{where}: accelerator")
        check_region(self.region, what=f"{where}: region")
        spec = ACCELERATOR_SPECS[self.accelerator]
        check_int(f"{where}: domains", self.domains, 1, MAX_DOMAINS)
        check_int(f"{where}: domain_chips", self.domain_chips, 0, MAX_CHIPS)
        check_int(f"{where}: chips_per_host", self.chips_per_host, 0, MAX_CHIPS)
        if self.ep_domain_chips is not None:
            check_int(f"{where}: ep_domain_chips", self.ep_domain_chips, 1, MAX_CHIPS)
        if self.whole_domain is not None and not isinstance(self.whole_domain, bool):
            raise ValueError(f"{where}: whole_domain must be true or false, got {self.whole_domain!r}")
        if spec.is_tpu:
            if self.topology is None:
                raise ValueError(f"{where}: TPU pools need a topology such as '16x16'")
            chips = topology_chips(self.topology)
            if chips > MAX_CHIPS:
                raise ValueError(f"{where}: topology {self.topology} has {chips} chips, more than {MAX_CHIPS}")
            if self.domain_chips not in (0, chips):
                raise ValueError(
                    f"{where}: domain_chips {self.domain_chips} disagrees with topology {self.topology} ({chips} chips)"
                )
            object.__setattr__(self, "domain_chips", chips)
        else:
            if self.topology is not None:
                raise ValueError(f"{where}: topology is only meaningful for TPU pools")
            if self.domain_chips == 0:
                object.__setattr__(self, "domain_chips", spec.domain_chips)
        if self.chips_per_host == 0:
            # A CPU node is its own domain and host, whatever its core count.
            default = self.domain_chips if self.accelerator == "cpu" else spec.chips_per_host
            object.__setattr__(self, "chips_per_host", default)
        if not isinstance(self.domain_chips, int) or self.domain_chips < 1:
            raise ValueError(f"{where}: domain_chips must be a positive integer")
        if self.chips_per_host < 1 or self.domain_chips % self.chips_per_host:
            raise ValueError(f"{where}: chips_per_host {self.chips_per_host} must divide domain_chips {self.domain_chips}")
        if self.ep_domain_chips is not None and not 1 <= self.ep_domain_chips <= self.domain_chips:
            raise ValueError(f"{where}: ep_domain_chips must be in [1, domain_chips={self.domain_chips}]")
        if (
            self.ep_domain_chips is not None
            and self.ep_domain_chips % self.chips_per_host
            and self.chips_per_host % self.ep_domain_chips
        ):
            # An expert group is a run of whole, consecutive processes (one per host) or part of one.
            raise ValueError(
                f"{where}: ep_domain_chips {self.ep_domain_chips} is neither whole hosts nor part of one "
                f"(chips_per_host {self.chips_per_host})"
            )
        if self.whole_domain is None:
            object.__setattr__(self, "whole_domain", spec.is_tpu)

    @property
    def capacity(self) -> int:
        return self.domains * self.domain_chips

    @property
    def hosts_per_domain(self) -> int:
        return self.domain_chips // self.chips_per_host

    def domains_needed(self, chips: int) -> int:
        """Whole domains a job of ``chips`` takes if it cannot live inside one domain."""
        return math.ceil(chips / self.domain_chips)

    def fits_one_domain(self, chips: int) -> bool:
        return chips <= self.domain_chips and not self.whole_domain


@dataclass(frozen=True)
class Fleet:
    pools: tuple[Pool, ...]
    _by_name: dict[str, Pool] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.pools:
            raise ValueError("a fleet needs at least one pool")
        if len(self.pools) > MAX_POOLS:
            raise ValueError(f"a fleet of {len(self.pools)} pools is more than the limit of {MAX_POOLS}")
        total = sum(p.domains for p in self.pools)
        if total > MAX_FLEET_DOMAINS:
            raise ValueError(f"the fleet has {total} domains in all, more than the limit of {MAX_FLEET_DOMAINS}")
        by_name: dict[str, Pool] = {}
        for pool in self.pools:
            if pool.name in by_name:
                raise ValueError(f"pool name {pool.name!r} appears twice")
            by_name[pool.name] = pool
        object.__setattr__(self, "_by_name", by_name)

    def pool(self, name: str) -> Pool:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no pool named {name!r} (pools: {', '.join(self._by_name)})") from None

    def matching(self, accelerator: str, region: str | None) -> list[Pool]:
        return [p for p in self.pools if p.accelerator == accelerator and (region is None or p.region == region)]


_POOL_FIELDS = {
    "name",
    "accelerator",
    "region",
    "domains",
    "domain_chips",
    "chips_per_host",
    "topology",
    "ep_domain_chips",
    "whole_domain",
}


def check_record(raw: Any, allowed: set[str], where: str) -> None:
    """A config record must be a mapping with only known fields; say where it is not."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where} is not a mapping")
    unknown = set(raw) - allowed
    if unknown:
        raise ValueError(f"{where} has unknown fields {sorted(unknown, key=repr)}")


def fleet_from_dict(data: Mapping[str, Any], *, source: str = "fleet") -> Fleet:
    if not isinstance(data, Mapping) or not isinstance(data.get("pools"), list):
        raise ValueError(f"{source}: expected a mapping with a 'pools' list")
    pools = []
    for i, raw in enumerate(data["pools"]):
        check_record(raw, _POOL_FIELDS, f"{source}: pools[{i}]")
        try:
            pools.append(Pool(**raw))
        except (TypeError, ValueError) as err:
            raise ValueError(f"{source}: pools[{i}]: {err}") from None
    try:
        return Fleet(tuple(pools))
    except ValueError as err:
        raise ValueError(f"{source}: {err}") from None


def load_fleet(path: str | Path) -> Fleet:
    return fleet_from_dict(load_structured(path), source=str(path))
