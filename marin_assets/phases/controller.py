"""The Tootsie phase controller, without Dagster: its state and the pure tick that decides each phase.

    state = ControllerState.from_json(cursor)      # the sensor's cursor (today's or an older format)
    out = tick(plan, state, facts, launch)         # facts: what the sensor read this tick
    out.requests, out.observations, out.cancel     # what the sensor asks Dagster for
    out.state.to_json()                            # the next cursor

Each tick looks at the newest phase of the run. Until the run requested for it has materialised it, the tick
waits. Then it builds the signals (tokens left per source under the data allotment, the budget from the
user-edited budget file, free hardware, recent losses), calls the pure ``decide`` and, when the decision names
a next phase, requests its run. Every decision is recorded once, as an observation on the phase's partition
(action + reason), so the run's history reads like the Tootsie log. A replayed tick finds the same state and
returns the same run key, which Dagster runs once.

While the requested run is still going, the tick reads its live metrics (``Facts.live``: the telemetry the
trainer logs under ``phase_telemetry_run(plan.run, phase)``) and asks the pure ``end_phase_now``: on a budget
cut below what the phase still needs, or a loss spike, it names the run to terminate (the trainer checkpoints
the step it is on and returns). The sensor tries, and ticks again knowing whether it could (``Facts.cancelled``):
the tick records why, and waits for the stopped phase to materialise; ``decide`` then picks the successor,
which warm-starts from that checkpoint.

A roll-back retries the phase under its name with ``attempt`` + 1 (``RunState.rollbacks``). A
``switch_architecture`` replaces the diverged phase in the chain by its successor, which starts from the same
warm start (version and tokens) and carries its weights over by the spec's ``transplant``; the replaced name
stays used. The finished phase's ``recent_drop_rates`` feed the plan's ``max_drop_rate`` hold, which a phase
named in the budget file's ``released_holds`` no longer gets.

With a ladder watch, the tick hands ``decide``/``end_phase_now`` the watch's ``BandSignal`` and records each new
verdict (after any cancel: drawing its plot takes longer than a step). A plan's branches leave the main run
from checkpoints it accepted (branches.py).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any

from marin_assets.phases.branches import BranchStart, branch_starts
from marin_assets.phases.decide import Decision, decide, end_phase_now
from marin_assets.phases.observe import finished_view, live_view
from marin_assets.phases.plan import PhasePlan, PhaseSpec
from marin_assets.phases.signals import BandSignal, Signals
from marin_assets.train.budget import Budget

CURSOR_FORMAT = 2  # 1 (no "format" key): the sensor's dict cursor before this state, upgraded on reading


@dataclasses.dataclass(frozen=True)
class Ending:
    """Why the controller ended a running phase mid-way, the step it had reached, and whether its run stopped."""

    reason: str
    step: int | None
    terminated: bool


@dataclasses.dataclass(frozen=True)
class PhaseEntry:
    """A phase of the main run as the controller requested it: its run's key, its attempt (roll-backs), the
    content version it warm-starts from, the run's tokens before it, the phases an architecture switch replaced
    by it (their names stay used), and how the controller ended it, if it did."""

    spec: PhaseSpec
    run_key: str
    attempt: int = 0
    warm_version: str = ""
    tokens_before: int = 0
    replaces: tuple[str, ...] = ()
    ending: Ending | None = None


@dataclasses.dataclass(frozen=True)
class LastDecision:
    """The controller's newest decision that requested no phase: a tick that decides it again records nothing."""

    phase: str
    action: str
    reason: str


@dataclasses.dataclass(frozen=True)
class ControllerState:
    """What the controller keeps between ticks (the sensor's cursor, as JSON)."""

    phases: tuple[PhaseEntry, ...] = ()  # the main run's chain, oldest first: a retried or replaced phase is replaced
    last: LastDecision | None = None  # None once the newest decision requested a phase
    branches: Mapping[str, str] = dataclasses.field(default_factory=dict)  # partition -> run key of branches requested
    watch: Mapping[str, str] = dataclasses.field(default_factory=dict)  # the ladder watch's newest verdict per slot (its words)

    @property
    def newest(self) -> PhaseEntry | None:
        return self.phases[-1] if self.phases else None

    def to_json(self) -> str:
        return json.dumps({"format": CURSOR_FORMAT, **dataclasses.asdict(self)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> ControllerState:
        """The state a cursor holds: an empty one for none; a format-1 cursor is upgraded."""
        if not text:
            return cls()
        data = json.loads(text)
        if data.get("format", 1) == 1:
            data = _upgrade(data)
        elif data["format"] != CURSOR_FORMAT:
            raise ValueError(f"phase controller cursor: format {data['format']!r} is not {CURSOR_FORMAT} (a newer controller's?)")
        return cls(
            phases=tuple(_entry(e) for e in data["phases"]),
            last=LastDecision(**data["last"]) if data["last"] else None,
            branches=dict(data["branches"]),
            watch=dict(data["watch"]),
        )


def _upgrade(cursor: Mapping[str, Any]) -> dict[str, Any]:
    """A format-1 cursor as format 2: there each phase's spec was a JSON string, the newest decision the string
    ``"phase:action:reason"`` (no phase name or action holds a colon; a reason may), and the branches and the
    watch's slots were left out until used."""
    last = cursor.get("last")
    phase, action, reason = last.split(":", 2) if last else ("", "", "")
    return {
        "phases": [{**entry, "spec": json.loads(entry["spec"])} for entry in cursor.get("history", [])],
        "last": {"phase": phase, "action": action, "reason": reason} if last else None,
        "branches": cursor.get("branches", {}),
        "watch": cursor.get("watch", {}),
    }


def _entry(data: Mapping[str, Any]) -> PhaseEntry:
    ending = data.get("ending")
    return PhaseEntry(
        spec=PhaseSpec(**data["spec"]),
        run_key=data["run_key"],
        attempt=int(data.get("attempt", 0)),
        warm_version=data.get("warm_version", ""),
        tokens_before=int(data.get("tokens_before", 0)),
        replaces=tuple(data.get("replaces", ())),
        ending=Ending(**ending) if ending else None,
    )


# ---- what a tick reads, and what it asks for ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LiveSteps:
    """The running phase's newest telemetry (this attempt's rows): its step, the run's tokens, its newest losses."""

    step: int
    tokens_trained: int
    losses: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class WatchVerdict:
    """The ladder watch's verdict on the newest phase (sensors/ladder_watch.py judges it). ``slot`` and ``said``
    are the watch's own words: the state keeps the newest ``said`` per slot and a verdict is recorded when it
    changes; ``render`` makes what is recorded (a plot: drawn only then)."""

    partition: str
    slot: str
    said: str
    signal: BandSignal | None
    render: Callable[[], Mapping[str, Any]] = dataclasses.field(compare=False, repr=False)

    @property
    def metadata(self) -> Mapping[str, Any]:
        return self.render()


@dataclasses.dataclass(frozen=True)
class Facts:
    """What the sensor read for this tick about the state's newest phase; what the tick does not need stays unread."""

    result: Mapping[str, Any] | None = None  # its materialisation's metadata by the run requested for it (None: not yet)
    running: str | None = None  # that run's id while it runs (started, not finished)
    live: LiveSteps | None = None  # its newest telemetry while it runs (None: no step flushed yet)
    budget: Budget | None = None  # the budget file, read when the tick judges the phase
    datasets: Mapping[str, int] = dataclasses.field(default_factory=dict)  # {source: train tokens} of the newest datasets
    verdict: WatchVerdict | None = None  # the ladder watch's (None: no watch, or nothing to judge yet)
    versions: Mapping[str, str] = dataclasses.field(default_factory=dict)  # {run key: version} of runs branches leave from
    cancelled: bool | None = None  # whether the run this tick asked to cancel stopped (None: not asked yet)


@dataclasses.dataclass(frozen=True)
class Launch:
    """How phase runs are launched: chips per hardware tag (``marin/chips`` sizes the training backend), tags on
    every run (e.g. a retry policy), and the budget file the trainer checks itself (None: it does not, and the
    controller ends a phase on a budget cut)."""

    chips: Mapping[str, int] = dataclasses.field(default_factory=dict)
    run_tags: Mapping[str, str] = dataclasses.field(default_factory=dict)
    trainer_budget_file: str | None = None


@dataclasses.dataclass(frozen=True)
class PhaseRun:
    """A run the tick requests: its phase, on the phase's partition, under a run key Dagster runs once."""

    spec: PhaseSpec
    run_key: str
    action: str
    config: Mapping[str, Any]  # the train asset's op config
    tags: Mapping[str, str]

    @property
    def partition(self) -> str:
        return self.spec.name


@dataclasses.dataclass(frozen=True)
class Decided:
    """A decision recorded on the phase's partition; an ``end_phase`` names the step and the run it ended."""

    partition: str
    action: str
    reason: str
    next_phase: str
    budget_tokens: int
    tokens_left: Mapping[str, int]
    step: int | None = None
    run_id: str | None = None

    @property
    def metadata(self) -> dict[str, Any]:
        ended = {"step": self.step, "run_id": self.run_id} if self.run_id is not None else {}
        return {
            "decision": self.action,
            "reason": self.reason,
            "next_phase": self.next_phase,
            "budget_tokens": self.budget_tokens,
            "tokens_left": dict(self.tokens_left),
            **ended,
        }


Observation = Decided | BranchStart | WatchVerdict  # each has a partition and the metadata to record there


@dataclasses.dataclass(frozen=True)
class Tick:
    """A tick's outcome: the state to keep, the runs to request, what to record (in order), the run to cancel,
    why nothing is requested, and whether the tick only waited (nothing judged: the cursor stays as it was)."""

    state: ControllerState
    requests: tuple[PhaseRun, ...] = ()
    observations: tuple[Observation, ...] = ()
    cancel: str | None = None
    skip: str | None = None
    waiting: bool = False


def phase_run_tags(spec: PhaseSpec, action: str, chips: Mapping[str, int], run_tags: Mapping[str, str]) -> dict[str, str]:
    """The tags of a phase's run: what the routing launcher and the training backend size it by."""
    tags = {
        **run_tags,
        "marin/phase": spec.name,
        "marin/action": action,
        "marin/accelerator": spec.hardware,
        "marin/priority": "production",
    }
    if spec.hardware in chips:
        tags["marin/chips"] = str(chips[spec.hardware])
    return tags


# ---- the tick ---------------------------------------------------------------------------------------------


def tick(plan: PhasePlan, state: ControllerState, facts: Facts, launch: Launch | None = None) -> Tick:
    """The controller's tick on the main run, plus a run for each branch that leaves now (branches.py)."""
    launch = launch or Launch()
    main = _main_tick(plan, state, facts, launch)
    return _with_branches(plan, main, facts.versions, launch) if plan.branches else main


def _main_tick(plan: PhasePlan, state: ControllerState, facts: Facts, launch: Launch) -> Tick:
    newest = state.newest
    if newest is None:
        first = PhaseEntry(plan.first, f"{plan.run}-0-{plan.first.name}-0")
        return _request(state, (), first, "continue", launch)
    if facts.result is None:
        return _while_running(plan, state, newest, facts, launch)
    return _decided(plan, state, newest, facts, launch)


def _decided(plan: PhasePlan, state: ControllerState, newest: PhaseEntry, facts: Facts, launch: Launch) -> Tick:
    """The newest phase materialised: decide, record a decision unlike the last, request the next phase if any."""
    result = facts.result or {}
    run, signals = finished_view(result, state, _budget(facts), facts.datasets)
    state, signals, seen = _watched(state, signals, facts.verdict)
    decision = decide(plan, run, signals)
    said = LastDecision(newest.spec.name, decision.action, decision.reason)
    new = () if said == state.last else (_decision_record(newest.spec.name, decision, signals),)
    if decision.next_phase is None:
        return Tick(
            dataclasses.replace(state, last=said), observations=(*seen, *new), skip=f"{decision.action}: {decision.reason}"
        )
    kept, entry = _next_entry(plan, state, decision.action, decision.next_phase, result)
    return _request(state, kept, entry, decision.action, launch, (*seen, *new))


def _next_entry(
    plan: PhasePlan, state: ControllerState, action: str, spec: PhaseSpec, result: Mapping[str, Any]
) -> tuple[tuple[PhaseEntry, ...], PhaseEntry]:
    """The chain the next phase joins and its entry. A roll-back retries the phase from its warm start (fresh
    randomness); a switch replaces it by its successor from the same warm start; any other successor
    warm-starts from the phase's result."""
    newest = state.phases[-1]
    if action in ("roll_back", "switch_architecture"):
        kept, warm, before = state.phases[:-1], newest.warm_version, newest.tokens_before
        attempt = newest.attempt + 1 if action == "roll_back" else 0
        replaces = (*newest.replaces, newest.spec.name) if action == "switch_architecture" else ()
    else:
        kept, warm, before, attempt, replaces = state.phases, result["version"], int(result["count/tokens_trained"]), 0, ()
    return kept, PhaseEntry(spec, f"{plan.run}-{len(kept)}-{spec.name}-{attempt}", attempt, warm, before, replaces)


def _request(
    state: ControllerState,
    kept: tuple[PhaseEntry, ...],
    entry: PhaseEntry,
    action: str,
    launch: Launch,
    observations: tuple[Observation, ...] = (),
) -> Tick:
    trainer_budget = {"budget_file": launch.trainer_budget_file} if launch.trainer_budget_file is not None else {}
    config = {
        "phase": dataclasses.asdict(entry.spec),
        "warm_start_version": entry.warm_version,
        "attempt": entry.attempt,
        **trainer_budget,
    }
    run = PhaseRun(entry.spec, entry.run_key, action, config, phase_run_tags(entry.spec, action, launch.chips, launch.run_tags))
    return Tick(dataclasses.replace(state, phases=(*kept, entry), last=None), requests=(run,), observations=observations)


def _while_running(plan: PhasePlan, state: ControllerState, newest: PhaseEntry, facts: Facts, launch: Launch) -> Tick:
    """The newest phase has not materialised: wait, or end its run now (``end_phase_now`` on its live telemetry)."""
    waiting = f"waiting for phase {newest.spec.name} (run {newest.run_key}) to materialise"
    if newest.ending is not None:
        how = "ending it at its checkpoint" if newest.ending.terminated else "could not end it, it runs its course"
        return Tick(state, skip=f"{waiting}: {how} ({newest.ending.reason})", waiting=True)
    if facts.running is None or facts.live is None:
        return Tick(state, skip=waiting if facts.running is None else f"{waiting}: no live telemetry yet", waiting=True)
    run, signals = live_view(state, facts.live, _budget(facts))
    state, signals, seen = _watched(state, signals, facts.verdict)
    reason = end_phase_now(plan, run, signals, budget=launch.trainer_budget_file is None)
    if reason is None:
        on_track = f"step {run.step}, {run.phase_tokens:,} of {run.phase.token_budget:,} tokens, on track"
        return Tick(state, observations=seen, skip=f"{waiting}: {on_track}")
    return _ending(state, reason, run.step, signals, seen, facts)


def _ending(
    state: ControllerState, reason: str, step: int | None, signals: Signals, seen: tuple[Observation, ...], facts: Facts
) -> Tick:
    """End the newest phase's run for ``reason``: ask for the cancel; told whether the run stopped, record it and keep it
    (the next ticks wait for the phase to materialise at its checkpoint)."""
    if facts.cancelled is None:
        return Tick(state, observations=seen, cancel=facts.running, skip=f"end_phase: {reason}: terminating run {facts.running}")
    outcome = "ending it at its next checkpoint" if facts.cancelled else "could not terminate its run; it runs its course"
    newest, budget, left = state.phases[-1], signals.budget_tokens, signals.tokens_left
    record = Decided(newest.spec.name, "end_phase", f"{reason}: {outcome}", "", budget, left, step=step, run_id=facts.running)
    ended = dataclasses.replace(newest, ending=Ending(reason, step, facts.cancelled))
    return Tick(
        dataclasses.replace(state, phases=(*state.phases[:-1], ended)),
        observations=(*seen, record),
        skip=f"end_phase: {reason}: {outcome}",
    )


def _watched(state: ControllerState, signals: Signals, verdict: WatchVerdict | None):
    """``signals`` with the watch's band signal, the state keeping its verdict, and the verdict if it is new."""
    if verdict is None:
        return state, signals, ()
    signals = dataclasses.replace(signals, off_band=verdict.signal)
    if state.watch.get(verdict.slot) == verdict.said:
        return state, signals, ()
    return dataclasses.replace(state, watch={**state.watch, verdict.slot: verdict.said}), signals, (verdict,)


def _with_branches(plan: PhasePlan, main: Tick, versions: Mapping[str, str], launch: Launch) -> Tick:
    """The main run's tick (it never sees a branch), plus a run for each branch that leaves now, its lineage recorded."""
    starts = branch_starts(plan, main.state, versions)
    if not starts:
        return main
    runs = tuple(
        PhaseRun(
            s.spec, s.run_key, "branch", s.config, phase_run_tags(s.spec, "branch", launch.chips, {**launch.run_tags, **s.tags})
        )
        for s in starts
    )
    state = dataclasses.replace(main.state, branches={**main.state.branches, **{s.partition: s.run_key for s in starts}})
    return dataclasses.replace(
        main, state=state, requests=(*main.requests, *runs), observations=(*main.observations, *starts), skip=None, waiting=False
    )


def _decision_record(phase: str, decision: Decision, signals: Signals) -> Decided:
    next_phase = decision.next_phase.name if decision.next_phase else ""
    return Decided(phase, decision.action, decision.reason, next_phase, signals.budget_tokens, signals.tokens_left)


def _budget(facts: Facts) -> Budget:
    if facts.budget is None:
        raise ValueError("Facts.budget: the tick judges the newest phase, which needs the budget file")
    return facts.budget
