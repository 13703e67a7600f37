"""The Tootsie phase controller: reads the run's signals, decides, requests the next phase.

Each tick looks at the newest phase of the run. Until the run it requested for that
phase has materialised it, the tick skips. Then the tick builds the signals (tokens left
per source under the data allotment, the budget from the user-edited budget file, free
hardware, recent losses), calls the pure ``decide`` and, when the decision names a next
phase, adds its partition and requests its run. Every decision is recorded as an
observation on the phase's partition (action + reason), so the run's history reads like
the Tootsie log. The cursor holds the phases requested so far; a replayed tick finds the
same state and returns the same run_key, which Dagster runs once.

``phase_controller_sensor(plan, train_asset)`` builds one for any run: the train asset
(dynamically partitioned by phase, config ``phase``/``warm_start_version``/``attempt``)
names the op and the partitions; definitions.py builds the demo's.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import dagster as dg

from marin_assets.phases.budget import load_budget
from marin_assets.phases.decide import Decision, decide
from marin_assets.phases.plan import PhasePlan, PhaseSpec
from marin_assets.phases.signals import RunState, Signals

BUDGET_ENV = "MARIN_BUDGET_FILE"


def budget_path() -> Path:
    return Path(os.environ.get(BUDGET_ENV) or Path(os.environ.get("MARIN_PREFIX", "artifacts")) / "budget.yaml")


def _spec_to_json(spec: PhaseSpec) -> str:
    return json.dumps(dataclasses.asdict(spec), sort_keys=True)


def _spec_from_json(text: str) -> PhaseSpec:
    return PhaseSpec(**json.loads(text))


def phase_result(instance: dg.DagsterInstance, train_key: dg.AssetKey, phase: str, run_key: str) -> dict | None:
    """Metadata of the phase's materialisation by the run we requested, if it finished."""
    records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=train_key, asset_partitions=[phase]), limit=5).records
    for record in records:
        run = instance.get_run_by_id(record.event_log_entry.run_id)
        if run is not None and run.tags.get("dagster/run_key") == run_key:
            return {k: v.value for k, v in record.event_log_entry.asset_materialization.metadata.items()}
    return None


def observe(meta: dict, history: list[dict], budget_file: Path) -> tuple[RunState, Signals]:
    """The controller's view of the run after its newest phase finished."""
    earlier = [_spec_from_json(h["spec"]) for h in history[:-1]]
    budget = load_budget(budget_file)
    state = RunState(
        phase=_spec_from_json(history[-1]["spec"]),
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


def _record(instance: dg.DagsterInstance, train_key: dg.AssetKey, phase: str, decision: Decision, signals: Signals) -> None:
    metadata = {
        "decision": decision.action,
        "reason": decision.reason,
        "next_phase": decision.next_phase.name if decision.next_phase else "",
        "budget_tokens": signals.budget_tokens,
        "tokens_left": dg.MetadataValue.json(dict(signals.tokens_left)),
    }
    instance.report_runless_asset_event(dg.AssetObservation(asset_key=train_key, partition=phase, metadata=metadata))


def phase_controller_sensor(plan: PhasePlan, train_asset: dg.AssetsDefinition, *, also: Sequence[dg.AssetsDefinition] = (),
                            name: str = "phase_controller", budget_file: Callable[[], Path] = budget_path,
                            minimum_interval_seconds: int = 30) -> dg.SensorDefinition:
    """A sensor that runs ``plan`` phase by phase on ``train_asset`` (and the ``also`` assets,
    e.g. the phase's evaluation, in the same run)."""
    partitions = train_asset.partitions_def
    if not isinstance(partitions, dg.DynamicPartitionsDefinition):
        raise ValueError(f"phase_controller_sensor: {train_asset.key.to_user_string()} must be partitioned by a "
                         f"DynamicPartitionsDefinition (one partition per phase), got {type(partitions).__name__}")
    train_key, op_name = train_asset.key, train_asset.op.name

    def request(history: list[dict], decision: Decision, warm_version: str, attempt: int) -> dg.SensorResult:
        spec = decision.next_phase
        run_key = f"{plan.run}-{len(history)}-{spec.name}-{attempt}"
        entry = {"spec": _spec_to_json(spec), "run_key": run_key, "attempt": attempt, "warm_version": warm_version}
        config = {"phase": dataclasses.asdict(spec), "warm_start_version": warm_version, "attempt": attempt}
        run = dg.RunRequest(
            run_key=run_key,
            partition_key=spec.name,
            run_config={"ops": {op_name: {"config": config}}},
            tags={"marin/phase": spec.name, "marin/action": decision.action, "marin/accelerator": spec.hardware,
                  "marin/priority": "production"},
        )
        return dg.SensorResult(run_requests=[run], dynamic_partitions_requests=[partitions.build_add_request([spec.name])],
                               cursor=json.dumps({"history": [*history, entry], "last": None}))

    @dg.sensor(name=name, asset_selection=[train_asset, *also], minimum_interval_seconds=minimum_interval_seconds,
               default_status=dg.DefaultSensorStatus.STOPPED, description=f"Decides each phase of the {plan.run!r} run.")
    def _controller(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        cursor = json.loads(context.cursor) if context.cursor else {"history": [], "last": None}
        history: list[dict] = cursor["history"]
        if not history:
            return request([], Decision("continue", "start of the plan", plan.first), warm_version="", attempt=0)
        current = history[-1]
        phase = _spec_from_json(current["spec"]).name
        meta = phase_result(context.instance, train_key, phase, current["run_key"])
        if meta is None:
            return dg.SkipReason(f"waiting for phase {phase} (run {current['run_key']}) to materialise")
        state, signals = observe(meta, history, budget_file())
        decision = decide(plan, state, signals)
        said = f"{phase}:{decision.action}:{decision.reason}"
        if said != cursor.get("last"):
            _record(context.instance, train_key, phase, decision, signals)
        if decision.next_phase is None:
            return dg.SensorResult(skip_reason=f"{decision.action}: {decision.reason}", cursor=json.dumps({**cursor, "last": said}))
        if decision.action == "roll_back":  # retry the phase from the same warm start, fresh randomness
            return request(history[:-1], decision, current["warm_version"], current["attempt"] + 1)
        return request(history, decision, meta["version"], 0)

    return _controller
