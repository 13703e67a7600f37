"""The phase controller's view of the run: what it reads from Dagster (the phase's materialisation, the run
it requested) and from the live telemetry store, as the pure ``RunState`` and ``Signals`` that ``decide`` and
``end_phase_now`` take (sensors/phase_controller.py)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path

import dagster as dg

from marin_assets.phases.plan import PhaseSpec
from marin_assets.phases.signals import RunState, Signals
from marin_assets.telemetry import TelemetryStore
from marin_assets.train.budget import load_budget
from marin_assets.train.signals import STOP_SIGNAL_NAMES


def _spec_to_json(spec: PhaseSpec) -> str:
    return json.dumps(dataclasses.asdict(spec), sort_keys=True)


def _spec_from_json(text: str) -> PhaseSpec:
    return PhaseSpec(**json.loads(text))


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


def _run_state(
    history: list[dict], phase_tokens: int, tokens_trained: int, step: int | None, ended_early: str | None
) -> RunState:
    specs = [_spec_from_json(h["spec"]) for h in history]
    earlier, current = specs[:-1], specs[-1]
    # A phase an architecture switch replaced left the chain but keeps its name (its partition exists).
    names = [name for h, s in zip(history, specs, strict=True) for name in (*h.get("replaces", ()), s.name)]
    return RunState(
        phase=current,
        phase_tokens=phase_tokens,
        tokens_trained=tokens_trained,
        phases_done=tuple(names[:-1]),
        cooldowns_done=sum(s.is_cooldown for s in earlier),
        last_good_checkpoint=earlier[-1].name if earlier else None,
        step=step,
        ended_early=ended_early,
        rollbacks=int(history[-1].get("attempt", 0)),
        switches_done=tuple(s.transplant for s in specs if s.transplant),
    )


def _own_stop(stopped_by: str | None) -> str | None:
    """Why the trainer ended the phase itself (its budget check), or None: a signal's stop is the
    controller's ``ending`` (or a preemption, which the run's retry resumes)."""
    return stopped_by if stopped_by and stopped_by not in STOP_SIGNAL_NAMES else None


def observe(
    meta: dict, history: list[dict], budget_file: Path, datasets: Mapping[str, int] | None = None
) -> tuple[RunState, Signals]:
    """The controller's view of the run after its newest phase finished (or was ended). ``datasets``:
    {source: train tokens} of the newest materialisation of each dataset, read now: a source that
    arrived or grew after the phase reported counts from there, less what the run has consumed of it."""
    budget = load_budget(budget_file)
    consumed = meta["count/tokens_consumed"]
    available = {
        **meta["count/tokens_available"],
        **{s: max(0, total - consumed.get(s, 0)) for s, total in (datasets or {}).items()},
    }
    ending = history[-1].get("ending") or {}
    step = meta.get("count/final_step")
    state = _run_state(
        history,
        int(meta["count/phase_tokens"]),
        int(meta["count/tokens_trained"]),
        int(step) if step is not None else None,
        ending.get("reason") if ending.get("terminated") else _own_stop(meta.get("count/stopped_by")),
    )
    # A phase a person released (the budget file's released_holds) is not held again for its drops.
    drops = () if state.phase.name in budget.released_holds else meta.get("count/recent_drop_rates") or ()
    signals = Signals(
        tokens_left=budget.tokens_left(consumed, available),
        budget_tokens=budget.budget_tokens,
        hardware_available=budget.hardware_available,
        recent_losses=tuple(meta["count/recent_losses"]),
        recent_drop_rates=tuple(math.nan if x is None else x for x in drops),
    )
    return state, signals


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


def observe_live(
    store: TelemetryStore, run_name: str, entry: dict, history: list[dict], budget_file: Path, since: float | None, window: int
) -> tuple[RunState, Signals] | None:
    """The controller's view of a running phase from its live telemetry (None before its
    first flushed step). ``since`` (unix s) drops rows of an earlier attempt of the phase."""
    frame = store.query(run=run_name, metric=["tokens", "loss"], times=(since, None), latest=True)
    tokens = frame.filter(frame["metric"] == "tokens")
    if tokens.is_empty():
        return None
    last = tokens.row(-1, named=True)
    step, trained = int(last["step"]), int(last["value"])
    losses = frame.filter(frame["metric"] == "loss")["value"].fill_null(float("nan")).to_list()[-window - 1 :]
    budget = load_budget(budget_file)
    state = _run_state(history, trained - int(entry.get("tokens_before", 0)), trained, step, None)
    return state, Signals(
        tokens_left={},
        budget_tokens=budget.budget_tokens,
        hardware_available=budget.hardware_available,
        recent_losses=tuple(losses),
    )


def _running(instance: dg.DagsterInstance, run_key: str):
    """The record of the run we requested for a phase, if it has started and not finished."""
    records = instance.get_run_records(dg.RunsFilter(tags={"dagster/run_key": run_key}), limit=1)
    if records and records[0].dagster_run.status == dg.DagsterRunStatus.STARTED:
        return records[0]
    return None


def _run_start(instance: dg.DagsterInstance, run_key: str) -> float | None:
    records = instance.get_run_records(dg.RunsFilter(tags={"dagster/run_key": run_key}), limit=1)
    return records[0].start_time if records else None
