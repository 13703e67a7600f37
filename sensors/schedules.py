"""Periodic work: re-run every phase's evaluation nightly (off by default).

Evaluations are content-versioned, so a night with no change to the eval code, config or
checkpoint costs only cache hits; a changed eval set or metric re-scores every phase.
"""

from __future__ import annotations

import dagster as dg

from assets.partitions import demo_phases
from jobs import eval_job


@dg.schedule(name="nightly_evals", cron_schedule="0 3 * * *", job=eval_job, default_status=dg.DefaultScheduleStatus.STOPPED)
def nightly_evals(context: dg.ScheduleEvaluationContext):
    keys = context.instance.get_dynamic_partitions(demo_phases.name)
    if not keys:
        return dg.SkipReason("no phase has been trained yet")
    day = context.scheduled_execution_time.strftime("%Y-%m-%d")
    return [dg.RunRequest(run_key=f"eval-{key}-{day}", partition_key=key) for key in keys]
