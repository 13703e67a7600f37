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
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

ACCELERATOR_TAG = "marin/accelerator"
CHIPS_TAG = "marin/chips"
REGION_TAG = "marin/region"
PRIORITY_TAG = "marin/priority"
CLUSTER_TAG = "marin/cluster"  # optional: pin a run to one named launcher backend
ROUTING_TAGS = (ACCELERATOR_TAG, CHIPS_TAG, REGION_TAG, PRIORITY_TAG, CLUSTER_TAG)

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


def _show(value: str) -> str:
    # repr() keeps control characters and quotes visible without interpreting them.
    return repr(value[:80])


def check_name(kind: str, value: str) -> str:
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
        raise ValueError(
            f"{kind} {_show(str(value))} is not a valid name: use lower-case letters, digits and '-'"
        )
    return value


def check_region(value: str, *, what: str = f"tag {REGION_TAG}") -> str:
    if not isinstance(value, str) or not _REGION_RE.fullmatch(value):
        raise ValueError(f"{what}: {_show(str(value))} is not a region like 'us-central2'")
    return value


def check_accelerator(value: str, *, what: str = f"tag {ACCELERATOR_TAG}") -> str:
    if value not in ACCELERATORS:
        raise ValueError(
            f"{what}: unknown accelerator {_show(str(value))}; expected one of {', '.join(ACCELERATORS)}"
        )
    return value


def check_priority(value: str, *, what: str = f"tag {PRIORITY_TAG}") -> str:
    if value not in PRIORITY_BANDS:
        raise ValueError(
            f"{what}: unknown priority {_show(str(value))}; expected one of "
            f"{', '.join(sorted(PRIORITY_BANDS, key=PRIORITY_BANDS.get, reverse=True))}"
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
