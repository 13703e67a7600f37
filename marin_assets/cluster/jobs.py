"""The jobs file of the fleet simulation: job and domain-failure records, read and checked.

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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from marin_assets.cluster.fleet import check_record, load_structured
from marin_assets.cluster.tags import ACCELERATOR_TAG, CHIPS_TAG, PRIORITY_TAG, REGION_TAG, JobRequest, check_name, classify_tags
from marin_assets.numeric_checks import check_float, check_int

# Bounds that keep one replay finite: a year of simulated time and a million jobs.
MAX_TIME_S = 366 * 86400.0
MAX_JOBS = 1_000_000


@dataclass(frozen=True)
class SimJob:
    """One job of the stream: when it arrives, how much work it is, what it asks for."""

    id: str
    submit_s: float
    duration_s: float
    request: JobRequest
    checkpoint_interval_s: float | None = None

    def __post_init__(self) -> None:
        where = f"job {self.id!r}"
        object.__setattr__(self, "submit_s", check_float(f"{where}: submit_s", self.submit_s, 0, MAX_TIME_S))
        object.__setattr__(self, "duration_s", check_float(f"{where}: duration_s", self.duration_s, 0, MAX_TIME_S, lo_open=True))
        if self.checkpoint_interval_s is not None:
            object.__setattr__(
                self,
                "checkpoint_interval_s",
                check_float(f"{where}: checkpoint_interval_s", self.checkpoint_interval_s, 0, MAX_TIME_S, lo_open=True),
            )

    def newest_checkpoint(self, progress: float) -> float:
        """Progress saved by the newest checkpoint at or before ``progress``."""
        if self.checkpoint_interval_s is None:
            return 0.0
        return math.floor(progress / self.checkpoint_interval_s) * self.checkpoint_interval_s


@dataclass(frozen=True)
class DomainFailure:
    """Domain ``domain`` of ``pool`` is down from ``at_s`` for ``down_s`` seconds."""

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
    """One ``jobs:`` record as a SimJob; ValueError naming ``where`` and the field."""
    check_record(raw, _JOB_FIELDS, where)
    try:
        job_id = check_name("job id", str(raw["id"]))
        tags = {
            ACCELERATOR_TAG: str(raw.get("accelerator", "cpu")),
            CHIPS_TAG: str(raw.get("chips", 1)),
            PRIORITY_TAG: str(raw.get("priority", "batch")),
        }
        if raw.get("region") is not None:
            tags[REGION_TAG] = str(raw["region"])
        return SimJob(job_id, raw["submit_s"], raw["duration_s"], classify_tags(tags), raw.get("checkpoint_interval_s"))
    except KeyError as err:
        raise ValueError(f"{where}: missing field {err}") from None
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: {err}") from None


def jobs_from_dict(data: Mapping[str, Any], *, source: str = "jobs") -> tuple[list[SimJob], list[DomainFailure]]:
    """The jobs and failures of a parsed jobs file; ValueError naming ``source`` and the record."""
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
    return jobs, [failure_from_dict(raw, f"{source}: failures[{i}]") for i, raw in enumerate(raw_failures)]


def failure_from_dict(raw: Mapping[str, Any], where: str) -> DomainFailure:
    """One ``failures:`` record as a DomainFailure; ValueError naming ``where`` and the field."""
    check_record(raw, _FAILURE_FIELDS, where)
    missing = sorted(_FAILURE_FIELDS - set(raw))
    if missing:
        raise ValueError(f"{where}: missing field(s) {missing}")
    try:
        return DomainFailure(**raw)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: {err}") from None


def load_jobs(path) -> tuple[list[SimJob], list[DomainFailure]]:
    """Read and check a jobs file (YAML or JSON)."""
    return jobs_from_dict(load_structured(path), source=str(path))
