"""`dagster-daemon`, as the daemon test runs it: Dagster's own daemon CLI, with the backfill daemon's
loop period at ``BACKFILL_LOOP_S`` instead of Dagster's 30 s.

The asset backfill daemon looks at a backfill once per loop and launches the runs whose parents
are done. The period is a module constant with no instance setting,
``dagster._daemon.controller.DEFAULT_DAEMON_INTERVAL_SECONDS``, read when the backfill loop
starts (after this module set it). The user-shards sensor's backfill over the DataKit's sharded
graph is 8 waves (each partitions definition's steps, one run each), so at 30 s the test slept
through 4 of its 7 minutes (measured: backfill evaluations at 20:09:21 .. 20:13:21, a run
launched within 4 s of each). Everything else is the daemon as deployed.

    python -m tests.e2e.daemon_lab.daemon run -w workspace.yaml
"""

from __future__ import annotations

import sys

from dagster._daemon import controller
from dagster._daemon.cli import main

BACKFILL_LOOP_S = 2

if __name__ == "__main__":
    if not isinstance(getattr(controller, "DEFAULT_DAEMON_INTERVAL_SECONDS", None), int):
        raise SystemExit("dagster._daemon.controller.DEFAULT_DAEMON_INTERVAL_SECONDS is gone: this Dagster loops otherwise")
    controller.DEFAULT_DAEMON_INTERVAL_SECONDS = BACKFILL_LOOP_S
    sys.exit(main())
