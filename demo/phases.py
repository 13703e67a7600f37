"""The Tootsie run of the demo: the phase controller sensor decides every phase of train/demo.

The sensor decides every phase; this driver only does what the daemon and a person would:
tick the sensor, execute the runs it requests, and - as the person - edit the budget
file twice: raise it once the controller stops for lack of budget (more compute appeared),
and cut it while the re-warm phase (Phoenix) runs (time is short again).

The cut lands mid-phase: once Phoenix's live telemetry shows a few steps, the person writes
it and the daemon keeps ticking the sensor (on a watcher thread, while the run executes on
this one). The sensor sees the cut in the live metrics and terminates the run; the trainer
checkpoints the step it is on and returns; the next tick decides Starling from that
checkpoint, its reason naming the step. A phase that finishes before any telemetry shows
(the stand-in assets of the tests) gets the cut after it ends, as before.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dagster as dg

from demo.progress import Execute, run_directly

from marin_assets.telemetry import default_root as default_telemetry_root
from marin_assets.orchestration.launcher import in_process_tags
from marin_assets.phases.budget import Budget, load_budget, write_budget
from marin_assets.phases.plan import phase_telemetry_run
from marin_assets.telemetry import TelemetryStore



# The demo's budget file as the user first writes it, and the two edits the user makes
# later: the data allotment is a per-source quota, so "a source runs out" happens within a
# CPU-sized run.
def demo_budget() -> Budget:
    return Budget(budget_tokens=(48 + 16) * 512, data_allotment_tokens={"sotu": 10_000, "shakespeare": 10_000, "spam_assassin": 14_000},
                  hardware_available=("cpu",))


def demo_raise(budget: Budget, tokens_trained: int) -> Budget:
    """More compute appeared, and more data with it."""
    return dataclasses.replace(budget, budget_tokens=tokens_trained + (32 + 16) * 512,
                               data_allotment_tokens={k: v + 40_000 for k, v in budget.data_allotment_tokens.items()})


def demo_cut(budget: Budget, tokens_trained: int) -> Budget:
    """Time is short again: only 16 more steps of budget from the step the person saw (Phoenix,
    32 steps, needs more); what the controller's reaction time leaves goes to Starling."""
    return dataclasses.replace(budget, budget_tokens=tokens_trained + 16 * 512)


@dataclasses.dataclass
class MidPhaseCut:
    """The person's cut during a running phase, and the controller's ticks until it reacts."""

    sensor: Any
    defs: dg.Definitions
    instance: dg.DagsterInstance
    budget_file: Path
    cut_to: Callable[[Budget, int], Budget]
    telemetry_run: str
    log: Callable[[str], None]
    cursor: str | None
    # Live steps of the phase seen before the person cuts. The demo's phases run in seconds,
    # so the demo cuts at the first flushed step (right after the step function compiles).
    after_steps: int = 1
    poll_s: float = 0.1
    cut_step: int | None = None  # the live step the cut was written at
    reaction: str | None = None  # the controller's end_phase message
    done: threading.Event = dataclasses.field(default_factory=threading.Event)

    def watch(self) -> None:
        started, store = time.time(), TelemetryStore(default_telemetry_root())
        while not self.done.is_set():
            tokens = store.query(run=self.telemetry_run, metric="tokens", times=(started, None), latest=True)
            if len(tokens) >= self.after_steps:
                self._cut(int(tokens["step"][-1]), int(tokens["value"][-1]))
                self._tick_until_reaction()
                return
            self.done.wait(self.poll_s)

    def _cut(self, step: int, tokens: int) -> None:
        write_budget(self.budget_file, self.cut_to(load_budget(self.budget_file), tokens))
        self.cut_step = step
        self.log(f"user: budget cut to {load_budget(self.budget_file).budget_tokens:,} tokens while "
                 f"{self.telemetry_run} runs (step {step})")

    def _tick_until_reaction(self) -> None:
        while not self.done.is_set():
            result = self.sensor(dg.build_sensor_context(instance=self.instance, cursor=self.cursor,
                                                         definitions=self.defs))
            self.cursor = result.cursor or self.cursor
            message = _skip_message(result)
            if message.startswith("end_phase"):
                self.reaction = message
                self.log(f"controller: {message}")
                return
            self.done.wait(self.poll_s)


def _execute_with_cut(execute: Execute, run: Callable, tags: dict, cut: MidPhaseCut):
    watcher = threading.Thread(target=cut.watch, name="mid-phase-cut", daemon=True)
    watcher.start()
    try:
        return execute(run, tags)
    finally:
        cut.done.set()
        watcher.join()


def run_phase_demo(defs: dg.Definitions, instance: dg.DagsterInstance, budget_file: Path, initial: Budget,
                   raise_to: Callable[[Budget, int], Budget], cut_to: Callable[[Budget, int], Budget], *,
                   sensor_name: str = "phase_controller", job_name: str = "train_phase", max_ticks: int = 16,
                   log: Callable[[str], None] = print, execute: Execute = run_directly,
                   run_config: dict | None = None, plan_run: str = "demo", cut_during: str = "re_warm",
                   cut_after_steps: int = 1) -> list[dict]:
    """Returns the decision log: one entry per tick with the action, reason and phase.

    ``execute(run, tags)`` runs each requested phase (the demo passes a progress reporter);
    ``run_config`` entries other than "ops" (e.g. loggers) join every run's config. The
    budget is cut during the first phase started by ``cut_during`` (after
    ``cut_after_steps`` live steps of ``plan_run``'s telemetry), or right after it when no
    live step showed up while it ran."""
    write_budget(budget_file, initial)
    sensor = defs.resolve_sensor_def(sensor_name)
    job = defs.resolve_job_def(job_name)
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
                write_budget(budget_file, raise_to(load_budget(budget_file), last_tokens))
                raised = True
                log(f"user: budget raised to {load_budget(budget_file).budget_tokens:,} tokens")
                continue
            break
        for request_ in result.dynamic_partitions_requests or []:
            instance.add_dynamic_partitions(request_.partitions_def_name, list(request_.partition_keys))
        for request in requests:
            action = request.tags.get("marin/action")
            tags = {**request.tags, "dagster/run_key": request.run_key, **in_process_tags()}
            log(f"controller: {action} -> {request.partition_key}")
            config = {**(run_config or {}), **request.run_config}
            runner = lambda final_tags: job.execute_in_process(run_config=config, partition_key=request.partition_key,  # noqa: E731
                                                               tags=final_tags, instance=instance, raise_on_error=False)
            mid = None
            if action == cut_during and not cut:
                mid = MidPhaseCut(sensor, defs, instance, budget_file, cut_to,
                                  phase_telemetry_run(plan_run, request.partition_key), log, cursor,
                                  after_steps=cut_after_steps)
                run = _execute_with_cut(execute, runner, tags, mid)
                cursor, cut = mid.cursor, mid.cut_step is not None
            else:
                run = execute(runner, tags)
            if not run.success:
                raise RuntimeError(f"phase {request.partition_key} failed (run {run.run_id})")
            meta = {e.asset_key.to_user_string(): e.materialization.metadata for e in run.get_asset_materialization_events()}
            train_meta = next(m for k, m in meta.items() if k.startswith("train/"))
            tokens_trained = train_meta["count/tokens_trained"].value
            if "marin/branch_of" not in request.tags:  # a branch's tokens are not the main run's
                last_tokens = tokens_trained
            entry = {"action": action, "phase": request.partition_key,
                     "tokens_trained": tokens_trained, "last_loss": train_meta["count/last_loss"].value}
            if "count/final_step" in train_meta:
                entry["final_step"] = train_meta["count/final_step"].value
            if mid is not None and mid.cut_step is not None:
                entry |= {"cut_step": mid.cut_step, "reaction": mid.reaction}
            decisions.append(entry)
            if action == cut_during and not cut:  # it ended before the cut could land mid-phase
                write_budget(budget_file, cut_to(load_budget(budget_file), last_tokens))
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


def run_demo_phases(defs: dg.Definitions, instance: dg.DagsterInstance, train_key: dg.AssetKey, budget_file: Path, *,
                    log: Callable[[str], None] = print, execute: Execute = run_directly, run_config: dict | None = None) -> dict:
    """The demo's run: the user's budget file, raised once and cut once; every decision."""
    started = time.time()
    ticks = run_phase_demo(defs, instance, budget_file, demo_budget(), demo_raise, demo_cut, log=log,
                           execute=execute, run_config=run_config)
    return {"ticks": ticks, "decisions": decision_log(instance, train_key, since=started)}
