"""What the phase controller reads each tick (sensors/phase_controller.py): the newest phase's materialisation and
the run requested for it (Dagster), its live telemetry, the budget file, the newest datasets and the ladder watch's
verdict, as the ``Facts`` the pure ``tick`` (marin_assets/phases/controller.py) decides on."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import dagster as dg

from marin_assets.phases.branches import branch_sources
from marin_assets.phases.controller import ControllerState, Facts, LiveSteps, PhaseEntry, WatchVerdict
from marin_assets.phases.plan import PhasePlan, phase_telemetry_run
from marin_assets.telemetry import TelemetryStore
from marin_assets.train.budget import Budget, load_budget
from sensors.ladder_watch import LadderWatch, PhaseView, watch_verdict


def phase_result(instance: dg.DagsterInstance, train_key: dg.AssetKey, phase: str, run_key: str) -> dict | None:
    """Metadata of the phase's materialisation by the run we requested, if it finished."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=train_key, asset_partitions=[phase]), limit=5
    ).records
    for record in records:
        run = instance.get_run_by_id(record.event_log_entry.run_id)
        materialization = record.event_log_entry.asset_materialization
        if run is not None and run.tags.get("dagster/run_key") == run_key and materialization is not None:
            return {k: v.value for k, v in materialization.metadata.items()}
    return None


def newest_dataset_tokens(instance: dg.DagsterInstance, datasets: Mapping[str, str]) -> dict[str, int]:
    """{source: train tokens} of the newest materialisation of each dataset asset ({source: asset key}) there is."""
    out = {}
    for source, key in datasets.items():
        event = instance.get_latest_materialization_event(dg.AssetKey(key.split("/")))
        materialization = event.asset_materialization if event is not None else None
        tokens = materialization.metadata.get("count/train_tokens") if materialization is not None else None
        if tokens is not None and isinstance(tokens.value, int):
            out[source] = tokens.value
    return out


def read_live(store: TelemetryStore, run_name: str, since: float | None, window: int) -> LiveSteps | None:
    """A running phase's newest step, the run's tokens then and its last ``window`` + 1 losses (None before its
    first flushed step). ``since`` (unix s) drops rows of an earlier attempt of the phase."""
    frame = store.query(run=run_name, metric=["tokens", "loss"], times=(since, None), latest=True)
    tokens = frame.filter(frame["metric"] == "tokens")
    if tokens.is_empty():
        return None
    last = tokens.row(-1, named=True)
    losses = frame.filter(frame["metric"] == "loss")["value"].fill_null(float("nan")).to_list()[-window - 1 :]
    return LiveSteps(int(last["step"]), int(last["value"]), tuple(losses))


def _run_record(instance: dg.DagsterInstance, run_key: str) -> dg.RunRecord | None:
    records = instance.get_run_records(dg.RunsFilter(tags={"dagster/run_key": run_key}), limit=1)
    return records[0] if records else None


@dataclasses.dataclass(frozen=True)
class RunReader:
    """What the controller of ``plan`` on the train asset ``train_key`` reads for a tick: only what that tick needs
    (an ended phase's run is waited for, not read; the budget file is read when the phase is judged)."""

    plan: PhasePlan
    train_key: dg.AssetKey
    budget_file: Callable[[], Path]
    telemetry_root: Callable[[], str]
    watch: LadderWatch | None = None
    datasets: Mapping[str, str] = dataclasses.field(default_factory=dict)  # {source: dataset asset key}

    def facts(self, instance: dg.DagsterInstance, state: ControllerState) -> Facts:
        newest = state.newest
        if newest is None:
            return Facts()
        result = phase_result(instance, self.train_key, newest.spec.name, newest.run_key)
        versions = self._versions(instance, state, result) if self.plan.branches else {}
        if result is not None:
            return self._finished(instance, newest, result, versions)
        return self._running(instance, newest, versions)

    def _finished(self, instance: dg.DagsterInstance, newest: PhaseEntry, result: dict, versions: dict[str, str]) -> Facts:
        budget = load_budget(self.budget_file())
        record = _run_record(instance, newest.run_key) if self.watch else None
        verdict = self._verdict(newest, record.start_time if record else None, budget, final=True)
        return Facts(
            result=result,
            budget=budget,
            datasets=newest_dataset_tokens(instance, self.datasets),
            verdict=verdict,
            versions=versions,
        )

    def _running(self, instance: dg.DagsterInstance, newest: PhaseEntry, versions: dict[str, str]) -> Facts:
        record = None if newest.ending else _run_record(instance, newest.run_key)
        if record is None or record.dagster_run.status != dg.DagsterRunStatus.STARTED:
            return Facts(versions=versions)
        telemetry_run = phase_telemetry_run(self.plan.run, newest.spec.name)
        live = read_live(TelemetryStore(self.telemetry_root()), telemetry_run, record.start_time, self.plan.spike_window)
        if live is None:
            return Facts(running=record.dagster_run.run_id, versions=versions)
        budget = load_budget(self.budget_file())
        return Facts(
            running=record.dagster_run.run_id,
            live=live,
            budget=budget,
            versions=versions,
            verdict=self._verdict(newest, record.start_time, budget, final=False),
        )

    def _verdict(self, newest: PhaseEntry, since: float | None, budget: Budget, final: bool) -> WatchVerdict | None:
        if self.watch is None:
            return None
        phase = newest.spec.name
        view = PhaseView(
            phase,
            newest.spec.token_budget,
            newest.attempt,
            newest.tokens_before,
            phase_telemetry_run(self.plan.run, phase),
            since,
            final,
        )
        return watch_verdict(self.watch, view, self.telemetry_root(), budget.released_holds)

    def _versions(self, instance: dg.DagsterInstance, state: ControllerState, result: Mapping[str, Any] | None) -> dict[str, str]:
        """{run key: content version} of the runs branches may leave from (the newest phase's: its result, read already)."""
        out = {}
        for entry in branch_sources(self.plan, state):
            meta = result if entry is state.newest else phase_result(instance, self.train_key, entry.spec.name, entry.run_key)
            if meta is not None and meta.get("version") is not None:
                out[entry.run_key] = meta["version"]
        return out
