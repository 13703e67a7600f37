"""Drive the phase controller sensor through a whole run, in-process.

The sensor decides every phase; this driver only does what the daemon and a person would:
tick the sensor, execute the runs it requests, and - as the person - edit the budget
file twice: raise it once the controller stops for lack of budget (more compute appeared),
and cut it once the re-warm phase has finished (time is short again).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import dagster as dg

from marin_assets.phases.budget import Budget, load_budget, write_budget


def run_phase_demo(defs: dg.Definitions, instance: dg.DagsterInstance, budget_file: Path, initial: Budget,
                   raise_to: Callable[[Budget, int], Budget], cut_to: Callable[[Budget, int], Budget],
                   max_ticks: int = 16, log: Callable[[str], None] = print) -> list[dict]:
    """Returns the decision log: one entry per tick with the action, reason and phase."""
    write_budget(budget_file, initial)
    sensor = defs.resolve_sensor_def("phase_controller")
    job = defs.resolve_job_def("train_phase")
    cursor, decisions, raised, cut, last_tokens = None, [], False, False, 0
    for _ in range(max_ticks):
        result = sensor(dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs))
        cursor = result.cursor or cursor
        requests = result.run_requests or []
        if not requests:
            reason = _skip_message(result)
            decisions.append({"action": reason.split(":", 1)[0], "reason": reason})
            log(f"controller: {reason}")
            if reason.startswith("stop") and not raised:
                budget = load_budget(budget_file)
                write_budget(budget_file, raise_to(budget, last_tokens))
                raised = True
                log(f"user: budget raised to {load_budget(budget_file).budget_tokens:,} tokens")
                continue
            break
        for request_ in result.dynamic_partitions_requests or []:
            instance.add_dynamic_partitions(request_.partitions_def_name, list(request_.partition_keys))
        for request in requests:
            tags = {**request.tags, "dagster/run_key": request.run_key}
            log(f"controller: {request.tags.get('marin/action')} -> {request.partition_key}")
            run = job.execute_in_process(run_config=request.run_config, partition_key=request.partition_key, tags=tags, instance=instance)
            if not run.success:
                raise RuntimeError(f"phase {request.partition_key} failed (run {run.run_id})")
            meta = {e.asset_key.to_user_string(): e.materialization.metadata for e in run.get_asset_materialization_events()}
            train_meta = next(m for k, m in meta.items() if k.startswith("train/"))
            last_tokens = train_meta["count/tokens_trained"].value
            decisions.append({"action": request.tags.get("marin/action"), "phase": request.partition_key,
                              "tokens_trained": last_tokens, "last_loss": train_meta["count/last_loss"].value})
            if request.tags.get("marin/action") == "re_warm" and not cut:
                budget = load_budget(budget_file)
                write_budget(budget_file, cut_to(budget, last_tokens))
                cut = True
                log(f"user: budget cut to {load_budget(budget_file).budget_tokens:,} tokens")
    return decisions


def _skip_message(result: dg.SensorResult | dg.SkipReason) -> str:
    if isinstance(result, dg.SkipReason):
        return result.skip_message or ""
    return result.skip_reason.skip_message if result.skip_reason else ""


def decision_log(instance: dg.DagsterInstance, asset_key: dg.AssetKey, since: float = 0.0) -> list[dict]:
    """The controller's recorded decisions (observations on the train asset), oldest first."""
    records = instance.fetch_observations(dg.AssetRecordsFilter(asset_key=asset_key, after_timestamp=since), limit=100).records
    out = []
    for record in reversed(records):
        obs = record.event_log_entry.asset_observation
        out.append({"phase": obs.partition, **{k: v.value for k, v in obs.metadata.items() if k in ("decision", "reason", "next_phase")}})
    return out


def dumps(decisions: list[dict]) -> str:
    return json.dumps(decisions, indent=1)
