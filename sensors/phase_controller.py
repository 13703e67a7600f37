"""The Tootsie phase controller: reads the run's signals, decides, requests the next phase.

Each tick looks at the newest phase of the run. Until the run it requested for that
phase has materialised it, the tick skips. Then the tick builds the signals (tokens left
per source under the data allotment, the budget from the user-edited budget file, free
hardware, recent losses), calls the pure ``decide`` and, when the decision names a next
phase, adds its partition and requests its run. Every decision is recorded as an
observation on the phase's partition (action + reason), so the run's history reads like
the Tootsie log. The cursor holds the phases requested so far; a replayed tick finds the
same state and returns the same run_key, which Dagster runs once.

While the requested run is still going, each tick reads its live metrics from the telemetry
store (the trainer logs under ``phase_telemetry_run(plan.run, phase)``) and the budget file,
and asks the pure ``end_phase_now``: on a budget cut below what the phase still needs, or a
loss spike, it terminates the run (``run_coordinator.cancel_run``: the trainer checkpoints the
step it is on and returns), records why, and waits for the stopped phase to materialise;
``decide`` then picks the successor, which warm-starts from that checkpoint.

A roll-back retries the phase under its name with ``attempt`` + 1 (``RunState.rollbacks``). A
``switch_architecture`` replaces the diverged phase in the chain by its successor, which starts from
the same warm start (version and tokens) and carries its weights over by the spec's ``transplant``;
the replaced name stays used. The finished phase's ``recent_drop_rates`` (its metrics' MoE drop rate)
feed the plan's ``max_drop_rate`` hold, which a phase named in ``released_holds`` no longer gets.

With a ``watch`` (sensors/ladder_watch.py), every tick also compares the phase with the ladder's
expected trajectory, live and once it has materialised, records each new verdict with its plot
(after acting on it: a plot takes longer than a step), and hands ``decide``/``end_phase_now`` a
``BandSignal`` when the phase left the band. What it reads of the run is sensors/run_view.py.

``phase_controller_sensor(plan, train_asset)`` builds one for any run: the train asset
(dynamically partitioned by phase, config ``phase``/``warm_start_version``/``attempt``)
names the op and the partitions; definitions.py builds the demo's.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import dagster as dg

from marin_assets.phases.branches import branch_starts
from marin_assets.phases.decide import Decision, decide, end_phase_now
from marin_assets.phases.plan import PhasePlan, PhaseSpec, phase_telemetry_run
from marin_assets.phases.signals import Signals
from marin_assets.telemetry import TelemetryStore
from marin_assets.telemetry import default_root as default_telemetry_root
from marin_assets.train.budget import budget_path
from sensors.ladder_watch import LadderWatch, PhaseView, band_signal
from sensors.run_view import (
    _run_start,
    _running,
    _spec_from_json,
    _spec_to_json,
    newest_dataset_tokens,
    observe,
    observe_live,
    phase_result,
)


def _record(instance: dg.DagsterInstance, train_key: dg.AssetKey, phase: str, decision: Decision, signals: Signals) -> None:
    _observe(instance, train_key, phase, decision.action, decision.reason,
             decision.next_phase.name if decision.next_phase else "", signals)


def _observe(instance: dg.DagsterInstance, train_key: dg.AssetKey, phase: str, action: str, reason: str,
             next_phase: str, signals: Signals, **extra) -> None:
    metadata = {
        "decision": action,
        "reason": reason,
        "next_phase": next_phase,
        "budget_tokens": signals.budget_tokens,
        "tokens_left": dg.MetadataValue.json(dict(signals.tokens_left)),
        **extra,
    }
    instance.report_runless_asset_event(dg.AssetObservation(asset_key=train_key, partition=phase, metadata=metadata))


def phase_run_tags(spec: PhaseSpec, action: str, chips: Mapping[str, int], run_tags: Mapping[str, str]) -> dict:
    """The tags of a phase's run: what the routing launcher and the training backend size it by."""
    tags = {**run_tags, "marin/phase": spec.name, "marin/action": action, "marin/accelerator": spec.hardware,
            "marin/priority": "production"}
    if spec.hardware in chips:
        tags["marin/chips"] = str(chips[spec.hardware])
    return tags


def phase_controller_sensor(plan: PhasePlan, train_asset: dg.AssetsDefinition, *, also: Sequence[dg.AssetsDefinition] = (),
                            name: str = "phase_controller", budget_file: Callable[[], Path] = budget_path,
                            minimum_interval_seconds: int = 30,
                            telemetry_root: Callable[[], str] = default_telemetry_root,
                            chips: Mapping[str, int] | None = None,
                            run_tags: Mapping[str, str] | None = None,
                            watch: LadderWatch | None = None,
                            trainer_checks_budget: bool = False,
                            datasets: Mapping[str, str] | None = None) -> dg.SensorDefinition:
    """A sensor that runs ``plan`` phase by phase on ``train_asset`` (and the ``also`` assets,
    e.g. the phase's evaluation, in the same run); the train asset must log its steps to the
    telemetry store under ``phase_telemetry_run(plan.run, phase)`` for the mid-phase checks.

    chips: hardware tag -> chips to request (``marin/chips``, which sizes the training
      backend); a phase on hardware not listed gets no chips tag (the launcher's default).
    run_tags: added to every phase run, e.g. ``{"dagster/max_retries": "2"}`` so a failed
      phase is retried by the instance's run-retry daemon and resumes from its checkpoint.
    watch: compare each phase with a ladder's expected trajectory and act on leaving its band.
    trainer_checks_budget: the train asset's config takes ``budget_file``: each phase run gets the
      budget file's path and its trainer ends the phase at the first permanent checkpoint step the
      budget no longer covers (``train.budget.BudgetStop``: a bound in steps, whatever the tick
      interval), so the live ticks leave budget cuts to it and watch for spikes and the band only.
    datasets: {source: dataset asset key}; each decision reads their newest materialisations, so data
      that arrived after the phase reported (a user's new files) is a source the next phase can take.
    """
    partitions = train_asset.partitions_def
    if not isinstance(partitions, dg.DynamicPartitionsDefinition):
        raise ValueError(f"phase_controller_sensor: {train_asset.key.to_user_string()} must be partitioned by a "
                         f"DynamicPartitionsDefinition (one partition per phase), got {type(partitions).__name__}")
    train_key, op_name = train_asset.key, train_asset.op.name

    def request(cursor: dict, history: list[dict], decision: Decision, warm_version: str, attempt: int,
                tokens_before: int, replaces: Sequence[str] = ()) -> dg.SensorResult:
        spec = decision.next_phase
        run_key = f"{plan.run}-{len(history)}-{spec.name}-{attempt}"
        entry = {"spec": _spec_to_json(spec), "run_key": run_key, "attempt": attempt, "warm_version": warm_version,
                 "tokens_before": tokens_before, **({"replaces": list(replaces)} if replaces else {})}
        config = {"phase": dataclasses.asdict(spec), "warm_start_version": warm_version, "attempt": attempt,
                  **({"budget_file": str(budget_file())} if trainer_checks_budget else {})}
        run = dg.RunRequest(
            run_key=run_key,
            partition_key=spec.name,
            run_config={"ops": {op_name: {"config": config}}},
            tags=phase_run_tags(spec, decision.action, chips or {}, run_tags or {}),
        )
        return dg.SensorResult(run_requests=[run], dynamic_partitions_requests=[partitions.build_add_request([spec.name])],
                               cursor=json.dumps({**cursor, "history": [*history, entry], "last": None}))

    def watched(context, cursor: dict, signals: Signals, phase: str, since: float | None, final: bool):
        """``signals`` with the watch's verdict, the cursor, and the call recording a new verdict (``band_signal``)."""
        if watch is None:
            return signals, cursor, lambda: None
        current = cursor["history"][-1]
        view = PhaseView(phase, _spec_from_json(current["spec"]).token_budget, int(current.get("attempt", 0)),
                         int(current.get("tokens_before", 0)), phase_telemetry_run(plan.run, phase), since, final)
        band, cursor, record = band_signal(watch, context.instance, train_key, view, telemetry_root(), budget_file(), cursor)
        return dataclasses.replace(signals, off_band=band), cursor, record or (lambda: None)

    def while_running(context: dg.SensorEvaluationContext, cursor: dict, phase: str) -> dg.SensorResult | dg.SkipReason:
        history, current = cursor["history"], cursor["history"][-1]
        waiting = f"waiting for phase {phase} (run {current['run_key']}) to materialise"
        ending = current.get("ending")
        if ending:
            how = "ending it at its checkpoint" if ending["terminated"] else "could not end it, it runs its course"
            return dg.SkipReason(f"{waiting}: {how} ({ending['reason']})")
        record = _running(context.instance, current["run_key"])
        if record is None:
            return dg.SkipReason(waiting)
        view = observe_live(TelemetryStore(telemetry_root()), phase_telemetry_run(plan.run, phase), current, history,
                            budget_file(), record.start_time, plan.spike_window)
        if view is None:
            return dg.SkipReason(f"{waiting}: no live telemetry yet")
        state, signals = view
        signals, cursor, record_verdict = watched(context, cursor, signals, phase, record.start_time, final=False)
        reason = end_phase_now(plan, state, signals, budget=not trainer_checks_budget)
        terminated = reason is not None and bool(context.instance.run_coordinator.cancel_run(record.dagster_run.run_id))
        record_verdict()  # after any cancel: the run stops at its next step, not after the verdict's plot
        if reason is None:
            return dg.SensorResult(skip_reason=f"{waiting}: step {state.step}, {state.phase_tokens:,} of "
                                               f"{state.phase.token_budget:,} tokens, on track", cursor=json.dumps(cursor))
        outcome = "ending it at its next checkpoint" if terminated else "could not terminate its run; it runs its course"
        _observe(context.instance, train_key, phase, "end_phase", f"{reason}: {outcome}", "", signals,
                 step=state.step, run_id=record.dagster_run.run_id)
        ending = {"reason": reason, "step": state.step, "terminated": terminated}
        cursor = {**cursor, "history": [*history[:-1], {**current, "ending": ending}]}
        return dg.SensorResult(skip_reason=f"end_phase: {reason}: {outcome}", cursor=json.dumps(cursor))

    def with_branches(context: dg.SensorEvaluationContext, result: dg.SensorResult | dg.SkipReason):
        """The main run's tick (it never sees a branch), plus a run for each branch that leaves now (phases/branches.py)."""
        cursor = json.loads(result.cursor if isinstance(result, dg.SensorResult) and result.cursor else context.cursor or "{}")
        starts = branch_starts(plan, cursor, lambda p, k: (phase_result(context.instance, train_key, p, k) or {}).get("version"))
        for s in starts:  # its lineage, on its partition: the source phase and the version it leaves from
            context.instance.report_runless_asset_event(dg.AssetObservation(train_key, partition=s.partition, metadata=s.lineage))
        runs = [dg.RunRequest(run_key=s.run_key, partition_key=s.partition, run_config={"ops": {op_name: {"config": s.config}}},
                              tags=phase_run_tags(s.spec, "branch", chips or {}, {**(run_tags or {}), **s.tags})) for s in starts]
        if not runs:
            return result
        main = result if isinstance(result, dg.SensorResult) else dg.SensorResult()  # runs and a skip reason: refused
        cursor["branches"] = {**cursor.get("branches", {}), **{s.partition: s.run_key for s in starts}}
        return dg.SensorResult(run_requests=[*(main.run_requests or []), *runs], cursor=json.dumps(cursor),
                               dynamic_partitions_requests=[*(main.dynamic_partitions_requests or []),
                                                            partitions.build_add_request([s.partition for s in starts])])

    @dg.sensor(name=name, asset_selection=[train_asset, *also], minimum_interval_seconds=minimum_interval_seconds,
               default_status=dg.DefaultSensorStatus.STOPPED, description=f"Decides each phase of the {plan.run!r} run.")
    def _controller(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        return with_branches(context, main_tick(context)) if plan.branches else main_tick(context)

    def main_tick(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        cursor = json.loads(context.cursor) if context.cursor else {"history": [], "last": None}
        history: list[dict] = cursor["history"]
        if not history:
            return request(cursor, [], Decision("continue", "start of the plan", plan.first), warm_version="", attempt=0,
                           tokens_before=0)
        current = history[-1]
        phase = _spec_from_json(current["spec"]).name
        meta = phase_result(context.instance, train_key, phase, current["run_key"])
        if meta is None:
            return while_running(context, cursor, phase)
        state, signals = observe(meta, history, budget_file(), newest_dataset_tokens(context.instance, datasets or {}))
        started = _run_start(context.instance, current["run_key"])
        signals, cursor, record_verdict = watched(context, cursor, signals, phase, started, final=True)
        record_verdict()
        decision = decide(plan, state, signals)
        said = f"{phase}:{decision.action}:{decision.reason}"
        if said != cursor.get("last"):
            _record(context.instance, train_key, phase, decision, signals)
        if decision.next_phase is None:
            return dg.SensorResult(skip_reason=f"{decision.action}: {decision.reason}", cursor=json.dumps({**cursor, "last": said}))
        if decision.action == "roll_back":  # retry the phase from the same warm start, fresh randomness
            return request(cursor, history[:-1], decision, current["warm_version"], current["attempt"] + 1,
                           int(current.get("tokens_before", 0)))
        if decision.action == "switch_architecture":  # the diverged phase leaves the chain: its successor starts where it did
            return request(cursor, history[:-1], decision, current["warm_version"], 0, int(current.get("tokens_before", 0)),
                           replaces=[*current.get("replaces", ()), phase])
        return request(cursor, history, decision, meta["version"], 0, int(meta["count/tokens_trained"]))

    return _controller
