"""The Tootsie phase controller: reads the run's signals, decides, requests the next phase.

Each tick looks at the newest phase of the run. Until the run it requested for that
phase has materialised it, the tick skips. Then the tick builds the signals (tokens left
per source under the data allotment, the budget from the user-edited budget file, free
hardware, recent losses), calls the pure ``decide`` and, when the decision names a next
phase, adds its partition and requests its run. Every decision is recorded as an
observation on the phase's partition (action + reason), so the run's history reads like
the Tootsie log. The cursor holds the phases requested so far; a replayed tick finds the
same state and returns the same run_key, which Dagster runs once.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import dagster as dg

from assets.training import DEMO_PLAN, TRAIN_KEY, phases, spec_from_json, spec_to_json
from marin_assets.phases.budget import load_budget
from marin_assets.phases.decide import Decision, decide
from marin_assets.phases.signals import RunState, Signals

BUDGET_ENV = "MARIN_BUDGET_FILE"
TRAIN_ASSET = dg.AssetKey(TRAIN_KEY.split("/"))
TRAIN_OP = "train__demo"


def budget_path() -> Path:
    return Path(os.environ.get(BUDGET_ENV) or Path(os.environ.get("MARIN_PREFIX", "artifacts")) / "budget.yaml")


def phase_result(instance: dg.DagsterInstance, phase: str, run_key: str) -> dict | None:
    """Metadata of the phase's materialisation by the run we requested, if it finished."""
    records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=TRAIN_ASSET, asset_partitions=[phase]), limit=5).records
    for record in records:
        run = instance.get_run_by_id(record.event_log_entry.run_id)
        if run is not None and run.tags.get("dagster/run_key") == run_key:
            return {k: v.value for k, v in record.event_log_entry.asset_materialization.metadata.items()}
    return None


def observe(meta: dict, history: list[dict], budget_file: Path) -> tuple[RunState, Signals]:
    """The controller's view of the run after its newest phase finished."""
    earlier = [spec_from_json(h["spec"]) for h in history[:-1]]
    budget = load_budget(budget_file)
    state = RunState(
        phase=spec_from_json(history[-1]["spec"]),
        phase_tokens=int(meta["count/phase_tokens"]),
        tokens_trained=int(meta["count/tokens_trained"]),
        phases_done=tuple(s.name for s in earlier),
        cooldowns_done=sum(s.is_cooldown for s in earlier),
        last_good_checkpoint=earlier[-1].name if earlier else None,
    )
    signals = Signals(
        tokens_left=budget.tokens_left(meta["count/tokens_consumed"], meta["count/tokens_available"]),
        budget_tokens=budget.budget_tokens,
        hardware_available=budget.hardware_available,
        recent_losses=tuple(meta["count/recent_losses"]),
    )
    return state, signals


def _record(instance: dg.DagsterInstance, phase: str, decision: Decision, signals: Signals) -> None:
    metadata = {
        "decision": decision.action,
        "reason": decision.reason,
        "next_phase": decision.next_phase.name if decision.next_phase else "",
        "budget_tokens": signals.budget_tokens,
        "tokens_left": dg.MetadataValue.json(dict(signals.tokens_left)),
    }
    instance.report_runless_asset_event(dg.AssetObservation(asset_key=TRAIN_ASSET, partition=phase, metadata=metadata))


def _request(history: list[dict], decision: Decision, warm_version: str, attempt: int) -> dg.SensorResult:
    spec = decision.next_phase
    run_key = f"{DEMO_PLAN.run}-{len(history)}-{spec.name}-{attempt}"
    entry = {"spec": spec_to_json(spec), "run_key": run_key, "attempt": attempt, "warm_version": warm_version}
    config = {"phase": entry["spec"], "warm_start_version": warm_version, "attempt": attempt}
    request = dg.RunRequest(
        run_key=run_key,
        partition_key=spec.name,
        run_config={"ops": {TRAIN_OP: {"config": config}}},
        tags={"marin/phase": spec.name, "marin/action": decision.action, "marin/accelerator": spec.hardware, "marin/priority": "production"},
    )
    return dg.SensorResult(
        run_requests=[request],
        dynamic_partitions_requests=[phases.build_add_request([spec.name])],
        cursor=json.dumps({"history": [*history, entry], "last": None}),
    )


@dg.sensor(name="phase_controller", asset_selection=[TRAIN_KEY, f"eval/{DEMO_PLAN.run}"], minimum_interval_seconds=30,
           default_status=dg.DefaultSensorStatus.STOPPED)
def phase_controller(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
    cursor = json.loads(context.cursor) if context.cursor else {"history": [], "last": None}
    history: list[dict] = cursor["history"]
    if not history:
        return _request([], Decision("continue", "start of the plan", DEMO_PLAN.first), warm_version="", attempt=0)
    current = history[-1]
    name = spec_from_json(current["spec"]).name
    meta = phase_result(context.instance, name, current["run_key"])
    if meta is None:
        return dg.SkipReason(f"waiting for phase {name} (run {current['run_key']}) to materialise")
    state, signals = observe(meta, history, budget_path())
    decision = decide(DEMO_PLAN, state, signals)
    said = f"{name}:{decision.action}:{decision.reason}"
    if said != cursor.get("last"):
        _record(context.instance, name, decision, signals)
    if decision.next_phase is None:
        return dg.SensorResult(skip_reason=f"{decision.action}: {decision.reason}", cursor=json.dumps({**cursor, "last": said}))
    if decision.action == "roll_back":  # retry the phase from the same warm start, fresh randomness
        return _request(history[:-1], decision, current["warm_version"], current["attempt"] + 1)
    return _request(history, decision, meta["version"], 0)
