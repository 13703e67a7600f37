"""The Tootsie phase controller as a Dagster sensor: a thin adapter over the pure ``tick``.

Each tick reads what the tick needs (sensors/run_view.py: the newest phase's materialisation and run, its live
telemetry, the budget file, the newest datasets, the ladder watch's verdict), calls ``tick``
(marin_assets/phases/controller.py, where what the controller decides and why is said), and hands Dagster the
result: the runs to request (each phase a dynamic partition of the train asset), the decisions to record as
observations, the run to terminate, and the cursor (``ControllerState`` as JSON).

``phase_controller_sensor(plan, train_asset)`` builds one for any run: the train asset
(dynamically partitioned by phase, config ``phase``/``warm_start_version``/``attempt``)
names the op and the partitions; definitions.py builds the demo's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import dagster as dg

from marin_assets.phases.controller import ControllerState, Launch, Observation, PhaseRun, Tick, tick
from marin_assets.phases.plan import PhasePlan
from marin_assets.telemetry import default_root as default_telemetry_root
from marin_assets.train.budget import budget_path
from sensors.ladder_watch import LadderWatch
from sensors.run_view import RunReader


def phase_controller_sensor(
    plan: PhasePlan,
    train_asset: dg.AssetsDefinition,
    *,
    also: Sequence[dg.AssetsDefinition] = (),
    name: str = "phase_controller",
    budget_file: Callable[[], Path] = budget_path,
    minimum_interval_seconds: int = 30,
    telemetry_root: Callable[[], str] = default_telemetry_root,
    chips: Mapping[str, int] | None = None,
    run_tags: Mapping[str, str] | None = None,
    watch: LadderWatch | None = None,
    trainer_checks_budget: bool = False,
    datasets: Mapping[str, str] | None = None,
) -> dg.SensorDefinition:
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
    partitions = _phase_partitions(train_asset)
    reader = RunReader(plan, train_asset.key, budget_file, telemetry_root, watch, datasets or {})

    @dg.sensor(
        name=name,
        asset_selection=[train_asset, *also],
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description=f"Decides each phase of the {plan.run!r} run.",
    )
    def _controller(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        state = ControllerState.from_json(context.cursor)
        launch = Launch(chips or {}, run_tags or {}, str(budget_file()) if trainer_checks_budget else None)
        facts = reader.facts(context.instance, state)
        out = tick(plan, state, facts, launch)
        if out.cancel is not None:  # what the tick records says whether the run stopped: try, then tick again knowing
            facts = dataclasses.replace(facts, cancelled=bool(context.instance.run_coordinator.cancel_run(out.cancel)))
            out = tick(plan, state, facts, launch)
        for observation in out.observations:
            context.instance.report_runless_asset_event(_asset_observation(train_asset.key, observation))
        return _sensor_result(out, partitions, train_asset.op.name)

    return _controller


def _phase_partitions(train_asset: dg.AssetsDefinition) -> dg.DynamicPartitionsDefinition:
    partitions = train_asset.partitions_def
    if not isinstance(partitions, dg.DynamicPartitionsDefinition):
        raise ValueError(
            f"phase_controller_sensor: {train_asset.key.to_user_string()} must be partitioned by a "
            f"DynamicPartitionsDefinition (one partition per phase), got {type(partitions).__name__}"
        )
    return partitions


def _sensor_result(out: Tick, partitions: dg.DynamicPartitionsDefinition, op_name: str) -> dg.SensorResult | dg.SkipReason:
    """The tick as Dagster takes it: one that only waited leaves the cursor as it was (a SkipReason)."""
    if out.waiting:
        return dg.SkipReason(out.skip)
    runs = [_run_request(run, op_name) for run in out.requests]
    added = [partitions.build_add_request([run.partition for run in out.requests])] if runs else []
    return dg.SensorResult(run_requests=runs, skip_reason=out.skip, cursor=out.state.to_json(), dynamic_partitions_requests=added)


def _run_request(run: PhaseRun, op_name: str) -> dg.RunRequest:
    return dg.RunRequest(
        run_key=run.run_key,
        partition_key=run.partition,
        run_config={"ops": {op_name: {"config": dict(run.config)}}},
        tags=dict(run.tags),
    )


def _asset_observation(train_key: dg.AssetKey, observation: Observation) -> dg.AssetObservation:
    """An observation on the phase's partition; a mapping in its metadata (tokens left per source) as JSON."""
    metadata: dict[str, Any] = {
        k: dg.MetadataValue.json(dict(v)) if isinstance(v, Mapping) else v for k, v in observation.metadata.items()
    }
    return dg.AssetObservation(asset_key=train_key, partition=observation.partition, metadata=metadata)
