"""Run tags that route a job, and the strict validation that turns them into a request.

A run says what it needs with four tags::

    marin/accelerator  one of ACCELERATORS (default: cpu)
    marin/chips        a positive integer, chips/GPUs/cores wanted (default: 1)
    marin/region       a cloud region such as us-central2 (default: any region)
    marin/priority     production | interactive | batch (default: batch)

Tag values come from users (UI launchpad, schedules, sensors) and end up in Kubernetes
objects, so every value is checked against an allow-list or a tight regex here, once,
before anything else looks at it. A bad value is refused with a ValueError naming the tag;
it is never echoed into a command line.

Three more tags size and queue a run's pod (typically set on assets: ``@asset(tags=...)``;
``asset_run_tags`` turns the tags of a run's assets into run tags)::

    marin/pool    the fleet pool: the key of the per-pool run limits (queued runs hold nothing)
    marin/cpu     the run pod's CPU request and limit: '2' cores or '500m' millicores
    marin/memory  the run pod's memory request and limit: '2Gi' or '512Mi'

The launcher writes one tag itself (never read from users: the run coordinator blanks an
inherited one)::

    marin/placement  where capacity admission placed the run: pool, domains, chips (JSON)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

ACCELERATOR_TAG = "marin/accelerator"
CHIPS_TAG = "marin/chips"
REGION_TAG = "marin/region"
PRIORITY_TAG = "marin/priority"
CLUSTER_TAG = "marin/cluster"  # optional: pin a run to one named launcher backend
ROUTING_TAGS = (ACCELERATOR_TAG, CHIPS_TAG, REGION_TAG, PRIORITY_TAG, CLUSTER_TAG)
POOL_TAG = "marin/pool"  # optional: the fleet pool a run uses; the key of the pool run limits
CPU_TAG = "marin/cpu"
MEMORY_TAG = "marin/memory"
PLACEMENT_TAG = "marin/placement"  # written by the launcher's capacity admission

ACCELERATORS = ("cpu", "tpu-v4", "tpu-v5e", "tpu-v5p", "h100x8", "gb200-nvl72")

# Higher band wins; a job may preempt only strictly lower bands.
PRIORITY_BANDS = {"batch": 0, "interactive": 1, "production": 2}

MAX_CHIPS = 1_000_000
_CHIPS_RE = re.compile(r"[1-9][0-9]{0,6}")
# GCP/AWS style regions: us-central2, europe-west4, us-east-1. Lower-case letters, digits, dashes.
_REGION_RE = re.compile(r"[a-z]{2,12}(-[a-z]{2,12}){1,2}-?[0-9]{1,2}")
# A backend name: a DNS-label-like word, safe in k8s labels and log lines.
# All patterns here are used with fullmatch: "$" would accept a trailing newline.
_NAME_RE = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
# Kubernetes quantities, a deliberately small subset: whole cores (<= 9999) or millicores;
# memory in Mi or Gi. Anything else (decimals, exponents, 'GB', spaces) is refused.
_CPU_RE = re.compile(r"[1-9][0-9]{0,3}|[1-9][0-9]{0,6}m")
_MEMORY_RE = re.compile(r"[1-9][0-9]{0,6}(Mi|Gi)")


def _show(value: str) -> str:
    # repr() keeps control characters and quotes visible without interpreting them.
    return repr(value[:80])


def check_name(kind: str, value: str) -> str:
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
        raise ValueError(f"{kind} {_show(str(value))} is not a valid name: use lower-case letters, digits and '-'")
    return value


def check_region(value: str, *, what: str = f"tag {REGION_TAG}") -> str:
    if not isinstance(value, str) or not _REGION_RE.fullmatch(value):
        raise ValueError(f"{what}: {_show(str(value))} is not a region like 'us-central2'")
    return value


def check_accelerator(value: str, *, what: str = f"tag {ACCELERATOR_TAG}") -> str:
    if value not in ACCELERATORS:
        raise ValueError(f"{what}: unknown accelerator {_show(str(value))}; expected one of {', '.join(ACCELERATORS)}")
    return value


def check_priority(value: str, *, what: str = f"tag {PRIORITY_TAG}") -> str:
    if value not in PRIORITY_BANDS:
        raise ValueError(
            f"{what}: unknown priority {_show(str(value))}; expected one of "
            f"{', '.join(sorted(PRIORITY_BANDS, key=PRIORITY_BANDS.__getitem__, reverse=True))}"
        )
    return value


@dataclass(frozen=True)
class JobRequest:
    """What a run asks for, classified at submit time. Validated on construction."""

    accelerator: str = "cpu"
    chips: int = 1
    region: str | None = None
    priority: str = "batch"
    cluster: str | None = None

    def __post_init__(self) -> None:
        check_accelerator(self.accelerator, what="accelerator")
        if isinstance(self.chips, bool) or not isinstance(self.chips, int) or not 1 <= self.chips <= MAX_CHIPS:
            raise ValueError(f"chips: {self.chips!r} must be an integer in [1, {MAX_CHIPS}]")
        if self.region is not None:
            check_region(self.region, what="region")
        check_priority(self.priority, what="priority")
        if self.cluster is not None:
            check_name("cluster", self.cluster)

    @property
    def band(self) -> int:
        return PRIORITY_BANDS[self.priority]


def classify_tags(tags: Mapping[str, str]) -> JobRequest:
    """Turn run tags into a JobRequest, refusing any value outside the allow-lists.

    Tags outside the ``marin/`` routing set are ignored: they belong to Dagster or to users.
    """
    accelerator = tags.get(ACCELERATOR_TAG, "cpu")
    check_accelerator(accelerator)
    chips_text = tags.get(CHIPS_TAG, "1")
    if not isinstance(chips_text, str) or not _CHIPS_RE.fullmatch(chips_text):
        raise ValueError(f"tag {CHIPS_TAG}: {_show(str(chips_text))} is not a positive integer")
    chips = int(chips_text)
    if chips > MAX_CHIPS:
        raise ValueError(f"tag {CHIPS_TAG}: {chips} exceeds the limit of {MAX_CHIPS}")
    region = tags.get(REGION_TAG)
    if region is not None:
        check_region(region)
    priority = tags.get(PRIORITY_TAG, "batch")
    check_priority(priority)
    cluster = tags.get(CLUSTER_TAG)
    if cluster is not None:
        check_name(f"tag {CLUSTER_TAG}:", cluster)
    return JobRequest(accelerator=accelerator, chips=chips, region=region, priority=priority, cluster=cluster)


def request_tags(request: JobRequest) -> dict[str, str]:
    """The inverse of classify_tags: the tags that ask for ``request``."""
    tags = {
        ACCELERATOR_TAG: request.accelerator,
        CHIPS_TAG: str(request.chips),
        PRIORITY_TAG: request.priority,
    }
    if request.region is not None:
        tags[REGION_TAG] = request.region
    if request.cluster is not None:
        tags[CLUSTER_TAG] = request.cluster
    return tags


# ---- pod size and pool: marin/cpu, marin/memory, marin/pool ---------------------------------


def check_cpu(value: str, *, what: str = f"tag {CPU_TAG}") -> str:
    if not isinstance(value, str) or not _CPU_RE.fullmatch(value):
        raise ValueError(f"{what}: {_show(str(value))} is not a CPU quantity like '1' or '500m'")
    return value


def check_memory(value: str, *, what: str = f"tag {MEMORY_TAG}") -> str:
    if not isinstance(value, str) or not _MEMORY_RE.fullmatch(value):
        raise ValueError(f"{what}: {_show(str(value))} is not a memory quantity like '2Gi' or '512Mi'")
    return value


def cpu_millicores(value: str) -> int:
    check_cpu(value, what="cpu")
    return int(value[:-1]) if value.endswith("m") else int(value) * 1000


def memory_bytes(value: str) -> int:
    check_memory(value, what="memory")
    return int(value[:-2]) * (2**30 if value.endswith("Gi") else 2**20)


@dataclass(frozen=True)
class PodResources:
    """CPU and memory of a run pod (requests = limits). Never an accelerator."""

    cpu: str
    memory: str

    def __post_init__(self) -> None:
        check_cpu(self.cpu, what="cpu")
        check_memory(self.memory, what="memory")

    def as_k8s(self) -> dict[str, str]:
        return {"cpu": self.cpu, "memory": self.memory}


def pod_resources(tags: Mapping[str, str], default: PodResources) -> PodResources:
    """The run pod's size: ``marin/cpu`` and ``marin/memory`` where given, else ``default``'s."""
    cpu = tags.get(CPU_TAG)
    memory = tags.get(MEMORY_TAG)
    return PodResources(
        cpu=default.cpu if cpu is None else check_cpu(cpu),
        memory=default.memory if memory is None else check_memory(memory),
    )


def check_resource_tags(tags: Mapping[str, str]) -> None:
    """Refuse a bad ``marin/cpu`` or ``marin/memory`` tag (absent ones are fine)."""
    if CPU_TAG in tags:
        check_cpu(tags[CPU_TAG])
    if MEMORY_TAG in tags:
        check_memory(tags[MEMORY_TAG])


def asset_run_tags(tags_by_asset: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """The ``marin/pool``, ``marin/cpu`` and ``marin/memory`` run tags for a run of these assets.

    Dagster does not copy asset tags onto runs (a backfill's runs carry only the partition
    and backfill tags), so the run coordinator and the launcher derive them here. One run
    pod executes the run's steps, so it gets the largest CPU and the largest memory any of
    its assets asks for; all assets that name a pool must name the same one (a run sits
    in one pool's queue). Errors name the asset and the tag.
    """
    pools: dict[str, str] = {}
    cpu: tuple[int, str] | None = None
    memory: tuple[int, str] | None = None
    for asset, tags in sorted(tags_by_asset.items()):
        if POOL_TAG in tags:
            pools[asset] = check_name(f"asset {asset}: tag {POOL_TAG}:", tags[POOL_TAG])
        if CPU_TAG in tags:
            value = check_cpu(tags[CPU_TAG], what=f"asset {asset}: tag {CPU_TAG}")
            cpu = max(cpu or (0, ""), (cpu_millicores(value), value))
        if MEMORY_TAG in tags:
            value = check_memory(tags[MEMORY_TAG], what=f"asset {asset}: tag {MEMORY_TAG}")
            memory = max(memory or (0, ""), (memory_bytes(value), value))
    if len(set(pools.values())) > 1:
        named = ", ".join(f"{a}={p}" for a, p in pools.items())
        raise ValueError(
            f"tag {POOL_TAG}: the assets of one run name different pools ({named}); materialise them in separate runs"
        )
    out: dict[str, str] = {}
    if pools:
        out[POOL_TAG] = next(iter(pools.values()))
    if cpu is not None:
        out[CPU_TAG] = cpu[1]
    if memory is not None:
        out[MEMORY_TAG] = memory[1]
    return out
