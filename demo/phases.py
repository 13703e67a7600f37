"""The Tootsie run of the demo: the phase controller sensor decides every phase of train/demo.

The sensor decides every phase; this driver only does what the daemon and a person would:
tick the sensor, execute the runs it requests, and - as the person - edit the budget
file twice: raise it once the controller stops for lack of budget (more compute appeared),
and cut it while the re-warm phase (Phoenix) runs (time is short again).

The person acts at training steps, not at wall-clock moments, so a fresh demo tells the same
story on an idle or a saturated machine: the cut is written by a hook of the running phase's
steps (``hooks_in_this_context``) at its ``after_steps``-th step. The trainer reads the budget
file at each permanent checkpoint step (every ``checkpoint_every_steps``, train/budget.py) and
ends the phase at the first one the cut budget no longer covers, checkpointed; the next tick
decides the cooldown (Starling) from that checkpoint with what the cut left. Meanwhile the
daemon keeps ticking the sensor (on a watcher thread, while the run executes on this one): a
trainer that does not read the budget itself is ended by the sensor's ``end_phase`` instead,
at its next step after the tick that saw the cut. A phase that finishes before its cut step
gets the cut after it ends.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dagster as dg

from assets.run_plan import STEP_TOKENS
from demo.progress import Execute, run_directly
from marin_assets.orchestration.launcher import in_process_tags
from marin_assets.train.budget import Budget, load_budget, write_budget
from marin_assets.train.hooks import Hooks, StepInfo, hooks_in_this_context


# The demo's budget file as the user first writes it, and the two edits the user makes
# later: the data allotment is a per-source quota, so "a source runs out" happens within a
# CPU-sized run.
def demo_budget() -> Budget:
    return Budget(
        budget_tokens=(48 + 16) * STEP_TOKENS,
        data_allotment_tokens={"sotu": 10_000, "shakespeare": 10_000, "spam_assassin": 14_000},
        hardware_available=("cpu",),
    )


def demo_raise(budget: Budget, tokens_trained: int) -> Budget:
    """More compute appeared, and more data with it."""
    return dataclasses.replace(
        budget,
        budget_tokens=tokens_trained + (32 + 16) * STEP_TOKENS,
        data_allotment_tokens={k: v + 40_000 for k, v in budget.data_allotment_tokens.items()},
    )


def demo_cut(budget: Budget, tokens_trained: int) -> Budget:
    """Time is short again: 19 more steps of budget from the step the person cut at (Phoenix's
    2nd, global step 66; Phoenix was to run to 96). At its next permanent checkpoint (step 80)
    the budget covers 5 of the 16 steps Phoenix has left: Phoenix ends there and Starling cools
    down in those 5 (85 steps in all). Cut after a phase, 19 steps hold the plan's 16-step
    cooldown and leave less than another phase needs."""
    return dataclasses.replace(budget, budget_tokens=tokens_trained + 19 * STEP_TOKENS)


@dataclasses.dataclass
class MidPhaseCut:
    """The person's cut at a running phase's ``after_steps``-th step, and the daemon's ticks until
    the controller reacts (or the phase ends)."""

    sensor: Any
    defs: dg.Definitions
    instance: dg.DagsterInstance
    budget_file: Path
    cut_to: Callable[[Budget, int], Budget]
    log: Callable[[str], None]
    cursor: str | None
    after_steps: int = 2  # the phase's own steps before the person cuts
    poll_s: float = 0.1
    first_step: int | None = None
    cut_step: int | None = None  # the global step the cut was written at
    reaction: str | None = None  # the controller's end_phase message, when the sensor ended the phase
    decided: dg.SensorResult | None = None  # a tick of this thread that requested the successor's run
    done: threading.Event = dataclasses.field(default_factory=threading.Event)

    def hook(self, info: StepInfo) -> None:
        """On the training thread, after each step of the phase: the cut, once, at its ``after_steps``-th step."""
        self.first_step = info.step if self.first_step is None else self.first_step
        row = info.row
        if self.cut_step is None and row is not None and info.step - self.first_step + 1 >= self.after_steps:
            self._cut(info.step, int(row["tokens"]))

    def _cut(self, step: int, tokens: int) -> None:
        write_budget(self.budget_file, self.cut_to(load_budget(self.budget_file), tokens))
        self.cut_step = step
        self.log(f"user: budget cut to {load_budget(self.budget_file).budget_tokens:,} tokens at step {step}")

    def tick(self) -> None:
        """The daemon, on a watcher thread: the sensor's ticks from the cut until it ends the phase
        (``end_phase``) or the phase ends on its own. A tick that already decides the successor (the
        phase materialised before the driver stopped this thread) is handed to the driver as its next
        tick (``decided``), as the daemon's tick would be: its runs are the ones executed next."""
        while not self.done.wait(self.poll_s):
            if self.cut_step is None:
                continue
            result = self.sensor(dg.build_sensor_context(instance=self.instance, cursor=self.cursor, definitions=self.defs))
            self.cursor = getattr(result, "cursor", None) or self.cursor
            if isinstance(result, dg.SensorResult) and result.run_requests:
                self.decided = result  # the phase materialised before this thread was told: the driver runs it
                return
            message = _skip_message(result)
            if message.startswith("end_phase"):
                self.reaction = message
                self.log(f"controller: {message}")
                return


def _execute_phase(
    job, config: dict, partition: str | None, instance: dg.DagsterInstance, tags: dict
) -> dg.ExecuteInProcessResult:
    """One phase's run in process, with the tags the executor adds last."""
    return job.execute_in_process(run_config=config, partition_key=partition, tags=tags, instance=instance, raise_on_error=False)


def _execute_with_cut(execute: Execute, run: Callable, tags: dict, cut: MidPhaseCut):
    hooks = Hooks()
    hooks.add_hook(cut.hook, every=1)
    watcher = threading.Thread(target=cut.tick, name="mid-phase-ticks", daemon=True)
    watcher.start()
    try:
        with hooks_in_this_context(hooks):
            return execute(run, tags)
    finally:
        cut.done.set()
        watcher.join()


def run_phase_demo(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    budget_file: Path,
    initial: Budget,
    raise_to: Callable[[Budget, int], Budget],
    cut_to: Callable[[Budget, int], Budget],
    *,
    sensor_name: str = "phase_controller",
    job_name: str = "train_phase",
    max_ticks: int = 16,
    log: Callable[[str], None] = print,
    execute: Execute = run_directly,
    run_config: dict | None = None,
    cut_during: str = "re_warm",
    cut_after_steps: int = 2,
) -> list[dict]:
    """Returns the decision log: one entry per tick with the action, reason and phase.

    ``execute(run, tags)`` runs each requested phase (the demo passes a progress reporter);
    ``run_config`` entries other than "ops" (e.g. loggers) join every run's config. The
    budget is cut during the first phase started by ``cut_during``, at its ``cut_after_steps``-th
    step, or right after it when it ran fewer steps."""
    write_budget(budget_file, initial)
    sensor = defs.resolve_sensor_def(sensor_name)
    job = defs.resolve_job_def(job_name)
    cursor, decisions, raised, cut, last_tokens = None, [], False, False, 0
    decided = None  # the watcher thread's tick that already requested the next runs
    for _ in range(max_ticks):
        result = decided or sensor(dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs))
        decided = None
        if not isinstance(result, dg.SensorResult):  # no phase runs between ticks here: the controller decides
            raise TypeError(f"sensor {sensor_name} returned {type(result).__name__}, not a SensorResult")
        cursor = getattr(result, "cursor", None) or cursor
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

            runner = functools.partial(_execute_phase, job, config, request.partition_key, instance)

            mid = None
            if action == cut_during and not cut:
                mid = MidPhaseCut(sensor, defs, instance, budget_file, cut_to, log, cursor, after_steps=cut_after_steps)
                run = _execute_with_cut(execute, runner, tags, mid)
                cursor, cut, decided = mid.cursor, mid.cut_step is not None, mid.decided
            else:
                run = execute(runner, tags)
            if not run.success:
                raise RuntimeError(f"phase {request.partition_key} failed (run {run.run_id})")
            meta = {e.asset_key.to_user_string(): e.materialization.metadata for e in run.get_asset_materialization_events()}
            train_meta = next(m for k, m in meta.items() if k.startswith("train/"))
            tokens_trained = train_meta["count/tokens_trained"].value
            if "marin/branch_of" not in request.tags:  # a branch's tokens are not the main run's
                last_tokens = tokens_trained
            entry = {
                "action": action,
                "phase": request.partition_key,
                "tokens_trained": tokens_trained,
                "last_loss": train_meta["count/last_loss"].value,
            }
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
    return (result.skip_reason.skip_message or "") if result.skip_reason else ""


def decision_log(instance: dg.DagsterInstance, asset_key: dg.AssetKey, since: float = 0.0) -> list[dict]:
    """The controller's recorded decisions (observations on the train asset), oldest first."""
    records = instance.fetch_observations(dg.AssetRecordsFilter(asset_key=asset_key, after_timestamp=since), limit=100).records
    out = []
    for record in reversed(records):
        obs = record.event_log_entry.asset_observation
        if obs is None:
            raise ValueError(f"{asset_key.to_user_string()}: an observation record without its observation")
        out.append(
            {"phase": obs.partition, **{k: v.value for k, v in obs.metadata.items() if k in ("decision", "reason", "next_phase")}}
        )
    return out


def run_demo_phases(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    train_key: dg.AssetKey,
    budget_file: Path,
    *,
    log: Callable[[str], None] = print,
    execute: Execute = run_directly,
    run_config: dict | None = None,
) -> dict:
    """The demo's run: the user's budget file, raised once and cut once; every decision."""
    started = time.time()
    ticks = run_phase_demo(
        defs, instance, budget_file, demo_budget(), demo_raise, demo_cut, log=log, execute=execute, run_config=run_config
    )
    return {"ticks": ticks, "decisions": decision_log(instance, train_key, since=started)}
