"""Periodic work: re-run every phase's evaluation nightly (off by default).

Evaluations are content-versioned, so a night with no change to the eval code, config or
checkpoint costs only cache hits; a changed eval set or metric re-scores every phase.
"""

from __future__ import annotations

import dagster as dg

from assets.partitions import demo_phases
from jobs import eval_job


def nightly_evals_schedule(
    job: dg.UnresolvedAssetJobDefinition,
    phases: dg.DynamicPartitionsDefinition,
    *,
    name: str = "nightly_evals",
    cron: str = "0 3 * * *",
) -> dg.ScheduleDefinition:
    """A schedule that re-runs ``job`` (an evaluation, partitioned by ``phases``) on every phase at each
    ``cron`` tick: one run per phase. The run key (phase and day) makes a tick idempotent when the daemon
    retries it after a crash (Dagster scopes a schedule's run keys to its tick, not to the day: a second
    tick runs again, all cache hits unless the evaluation changed; tests/e2e/test_daemon_drives_the_lab.py)."""

    @dg.schedule(name=name, cron_schedule=cron, job=job, default_status=dg.DefaultScheduleStatus.STOPPED)
    def _nightly(context: dg.ScheduleEvaluationContext):
        keys = phases.get_partition_keys(dynamic_partitions_store=context.instance)
        if not keys:
            return dg.SkipReason("no phase has been trained yet")
        day = context.scheduled_execution_time.strftime("%Y-%m-%d")
        return [dg.RunRequest(run_key=f"eval-{key}-{day}", partition_key=key) for key in keys]

    return _nightly


nightly_evals = nightly_evals_schedule(eval_job, demo_phases)
