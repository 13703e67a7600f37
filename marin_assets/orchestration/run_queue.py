"""The run queue side of pools as capacity: asset tags onto queued runs, priorities onto
Dagster's queue order, and the instance's per-pool run limits generated from the fleet.

Dagster copies no asset tags onto runs, so a backfill's runs carry no ``marin/pool``,
``marin/cpu`` or ``marin/memory`` of their own. ``MarinQueuedRunCoordinator`` writes them
on as a run is queued, so ``run_concurrency_config``'s per-pool limits hold queued runs
(holding no pod) and the launcher sizes the run pod from them (``effective_run_tags``).
It also gives each run Dagster's ``dagster/priority`` from its ``marin/priority`` band, so the
queue daemon offers production runs to the launcher's capacity admission (``admission.py``)
before interactive ones, and those before batch ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagster import DagsterRun, QueuedRunCoordinator, SubmitRunContext

from marin_assets.cluster.tags import PLACEMENT_TAG, POOL_TAG, PRIORITY_BANDS, PRIORITY_TAG, asset_run_tags
from marin_assets.orchestration.compat import PRIORITY_TAG as DAGSTER_PRIORITY_TAG


def run_asset_tags(run: DagsterRun, workspace) -> dict[str, Mapping[str, str]]:
    """{asset key: asset tags} for the assets ``run`` materialises, from the workspace's graph.

    Empty when there is no workspace or the run has no asset selection (an op job, or a
    whole-job launch): such runs are sized by their own tags and the cluster defaults.
    """
    if workspace is None or not run.asset_selection:
        return {}
    graph = workspace.asset_graph
    return {key.to_user_string(): graph.get(key).tags for key in run.asset_selection if graph.has(key)}


def effective_run_tags(run: DagsterRun, workspace) -> dict[str, str]:
    """The run's tags over the ``marin/pool``/``cpu``/``memory`` its assets ask for (run tags win)."""
    return {**asset_run_tags(run_asset_tags(run, workspace)), **run.tags}


# ---- the run queue: asset tags onto runs, so per-pool limits see them -------------------------


def queue_tags(run: DagsterRun) -> dict[str, str]:
    """Tags the run queue adds to ``run`` on its own account: ``dagster/priority`` from a valid
    ``marin/priority`` (a ``dagster/priority`` already given wins), and a blank ``marin/placement``
    over one inherited from a retried run (the launcher writes the run's own when it places it)."""
    out = {}
    band = PRIORITY_BANDS.get(run.tags.get(PRIORITY_TAG, "batch"))
    if band is not None and DAGSTER_PRIORITY_TAG not in run.tags:
        out[DAGSTER_PRIORITY_TAG] = str(band)
    if run.tags.get(PLACEMENT_TAG):
        out[PLACEMENT_TAG] = ""
    return out


class MarinQueuedRunCoordinator(QueuedRunCoordinator):
    """Dagster's QueuedRunCoordinator, plus: a run's assets' marin/pool, cpu, memory tags are
    written onto the run as it is queued (tags already on the run win), with ``queue_tags``.

    Dagster copies no asset tags onto runs, so without this a backfill's runs would carry no
    ``marin/pool`` and the ``concurrency: runs: tag_concurrency_limits`` of
    ``run_concurrency_config`` would never hold them back. Same config as QueuedRunCoordinator::

        run_coordinator:
          module: marin_assets.orchestration.run_queue
          class: MarinQueuedRunCoordinator
    """

    def submit_run(self, context: SubmitRunContext) -> DagsterRun:
        """Write the run's derived tags onto it, then queue it as Dagster does."""
        run = context.dagster_run
        try:
            derived = asset_run_tags(run_asset_tags(run, context.workspace))
        except ValueError as err:
            # Queued untagged: the launcher derives the same tags, refuses the run with this
            # message and marks it failed, so it never holds a pod.
            self._instance.report_engine_event(f"queued without its assets' marin/* tags: {err}", run, cls=self.__class__)
            derived = {}
        added = {**{k: v for k, v in derived.items() if k not in run.tags}, **queue_tags(run)}
        if added:
            self._instance.add_run_tags(run.run_id, added)
            run = self._instance.get_run_by_id(run.run_id)
        return super().submit_run(context._replace(dagster_run=run))


# ---- pools as capacity: run concurrency from the fleet ------------------------------------


def pool_run_slots(pool) -> int:
    """The most runs ``pool`` can hold at once.

    A run takes at least one whole domain on a whole-domain pool (a TPU slice runs one job)
    and at least one host elsewhere, so more runs than this cannot all be running: the
    surplus waits in Dagster's queue holding nothing (no run pod, no chips). A run smaller
    than a host is counted as a host, which is conservative.
    """
    return pool.domains if pool.whole_domain else pool.domains * pool.hosts_per_domain


def run_concurrency_config(fleet) -> dict[str, Any]:
    """The instance ``concurrency:`` block: one ``marin/pool`` tag limit per fleet pool."""
    limits = [{"key": POOL_TAG, "value": p.name, "limit": pool_run_slots(p)} for p in fleet.pools]
    return {"runs": {"tag_concurrency_limits": limits}}


def run_concurrency_yaml(fleet) -> str:
    """``run_concurrency_config`` as the YAML to paste into dagster.yaml."""
    import yaml

    return yaml.safe_dump({"concurrency": run_concurrency_config(fleet)}, sort_keys=False)
