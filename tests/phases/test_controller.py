"""The phase controller's state and pure tick, without Dagster: cursors as the sensor wrote them before the typed
state read back and decided on as then, and each path of a tick (start, wait, live check, end, decide, watch,
branch) on typed facts."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from marin_assets.phases.branches import BranchStart, branch_phase
from marin_assets.phases.controller import (
    ControllerState,
    Decided,
    Ending,
    Facts,
    LastDecision,
    Launch,
    LiveSteps,
    PhaseEntry,
    WatchVerdict,
    tick,
)
from marin_assets.phases.observe import finished_view
from marin_assets.phases.plan import ArchitectureSwitch, BranchSpec, PhasePlan, PhaseSpec
from marin_assets.phases.signals import BandSignal
from marin_assets.train.budget import Budget

KESTREL = PhaseSpec(
    name="kestrel",
    warm_start_from=None,
    schedule="wsd",
    mixture={"web": 1.0},
    batch_size=8,
    hardware="cpu",
    token_budget=1000,
    peak_lr=1e-3,
)
PLAN = PhasePlan(
    run="sw",
    first=KESTREL,
    phase_names=("kestrel", "ocelot", "jellyfish", "phoenix"),
    cooldown_tokens=500,
    min_cooldown_tokens=100,
)
SWITCHING = dataclasses.replace(PLAN, architecture_switch=ArchitectureSwitch(mapping="qk_norm", model_changes={"qk_norm": True}))
CALM = [2.9 + 0.01 * (i % 3) for i in range(12)]
SPIKE = "loss spike: loss 50 > mean 2.91 + 6*std 0.00816 = 2.959 over the last 12 steps"
KESTREL_VERSION = "1ef0bbbe2a7909cbbe5c31ad01dc5cacee12d9aebd743da4d8de1a074265c4e5"

# Cursors as the sensor wrote them before the typed state (format 1), taken from its runs in tests/sensors/:
# ocelot rolled back twice (test_phase_controller.py's switch run), ...
OCELOT_ATTEMPT_2 = r"""{"history": [{"spec": "{\"batch_size\": 8, \"hardware\": \"cpu\", \"is_cooldown\": false, \"mixture\": {\"web\": 1.0}, \"model_changes\": null, \"name\": \"kestrel\", \"peak_lr\": 0.001, \"schedule\": \"wsd\", \"seq_len\": null, \"start_fraction\": 1.0, \"token_budget\": 1000, \"transplant\": null, \"warm_start_from\": null, \"warmup_start_fraction\": 0.0, \"z_loss\": null}", "run_key": "sw-0-kestrel-0", "attempt": 0, "warm_version": "", "tokens_before": 0}, {"spec": "{\"batch_size\": 8, \"hardware\": \"cpu\", \"is_cooldown\": true, \"mixture\": {\"web\": 1.0}, \"model_changes\": null, \"name\": \"ocelot\", \"peak_lr\": 0.001, \"schedule\": \"linear_decay\", \"seq_len\": null, \"start_fraction\": 1.0, \"token_budget\": 500, \"transplant\": null, \"warm_start_from\": \"kestrel\", \"warmup_start_fraction\": 0.0, \"z_loss\": null}", "run_key": "sw-1-ocelot-2", "attempt": 2, "warm_version": "1ef0bbbe2a7909cbbe5c31ad01dc5cacee12d9aebd743da4d8de1a074265c4e5", "tokens_before": 1000}], "last": null}"""  # noqa: E501
# ... the run stopped after the switch, its last decision as "phase:action:reason" ...
STOPPED = r"""{"history": [{"spec": "{\"batch_size\": 8, \"hardware\": \"cpu\", \"is_cooldown\": false, \"mixture\": {\"web\": 1.0}, \"model_changes\": null, \"name\": \"kestrel\", \"peak_lr\": 0.001, \"schedule\": \"wsd\", \"seq_len\": null, \"start_fraction\": 1.0, \"token_budget\": 1000, \"transplant\": null, \"warm_start_from\": null, \"warmup_start_fraction\": 0.0, \"z_loss\": null}", "run_key": "sw-0-kestrel-0", "attempt": 0, "warm_version": "", "tokens_before": 0}, {"spec": "{\"batch_size\": 8, \"hardware\": \"cpu\", \"is_cooldown\": true, \"mixture\": {\"web\": 1.0}, \"model_changes\": {\"qk_norm\": true}, \"name\": \"jellyfish\", \"peak_lr\": 0.001, \"schedule\": \"linear_decay\", \"seq_len\": null, \"start_fraction\": 1.0, \"token_budget\": 500, \"transplant\": \"qk_norm\", \"warm_start_from\": \"kestrel\", \"warmup_start_fraction\": 0.0, \"z_loss\": null}", "run_key": "sw-1-jellyfish-0", "attempt": 0, "warm_version": "1ef0bbbe2a7909cbbe5c31ad01dc5cacee12d9aebd743da4d8de1a074265c4e5", "tokens_before": 1000, "replaces": ["ocelot"]}], "last": "jellyfish:stop:budget spent: 1,500 of 1,500 tokens trained, 0 left is less than the minimum phase (100)"}"""  # noqa: E501
# ... a phase the ladder watch ended mid-way, whose run could not be terminated (test_ladder_watch.py) ...
ENDED = r"""{"history": [{"spec": "{\"batch_size\": 8, \"hardware\": \"cpu\", \"is_cooldown\": false, \"mixture\": {\"web\": 1.0}, \"model_changes\": null, \"name\": \"kestrel\", \"peak_lr\": 0.5, \"schedule\": \"wsd\", \"seq_len\": null, \"start_fraction\": 1.0, \"token_budget\": 30720, \"transplant\": null, \"warm_start_from\": null, \"warmup_start_fraction\": 0.0, \"z_loss\": null}", "run_key": "watched-0-kestrel-0", "attempt": 0, "warm_version": "", "tokens_before": 0, "ending": {"reason": "off the ladder's band at step 30: loss left the ladder's band at step 21: 6.238 > 5.604 at 10,752 tokens (law 5.504); gradient norm left the ladder's band at step 21: 4.353 > 3.514 at 35% of the phase", "step": 30, "terminated": false}}], "last": null, "watch": {"kestrel#0": "False:21:rollback"}}"""  # noqa: E501
# ... and two branches requested (test_branch_bytes.py).
BRANCHED = r"""{"history": [{"spec": "{\"batch_size\": 4, \"hardware\": \"cpu\", \"is_cooldown\": false, \"mixture\": {\"shakespeare\": 0.5, \"sotu\": 0.5}, \"model_changes\": null, \"name\": \"kestrel\", \"peak_lr\": 0.003, \"schedule\": \"wsd\", \"seq_len\": null, \"start_fraction\": 1.0, \"token_budget\": 1024, \"transplant\": null, \"warm_start_from\": null, \"warmup_start_fraction\": 0.0, \"z_loss\": null}", "run_key": "demo-0-kestrel-0", "attempt": 0, "warm_version": "", "tokens_before": 0}], "last": null, "branches": {"kestrel+early_cooldown": "demo-branch-kestrel+early_cooldown", "kestrel+sft": "demo-branch-kestrel+sft"}}"""  # noqa: E501
OLD_CURSORS = [OCELOT_ATTEMPT_2, STOPPED, ENDED, BRANCHED]


def _result(phase_tokens: int, tokens_trained: int, losses: list[float], version: str = "v", **more) -> dict:
    """A phase's materialisation metadata, as the train asset reports it."""
    return {
        "count/phase_tokens": phase_tokens,
        "count/tokens_trained": tokens_trained,
        "version": version,
        "count/tokens_consumed": {"web": tokens_trained},
        "count/tokens_available": {"web": 1_000_000},
        "count/recent_losses": losses,
        **more,
    }


def _finished(result: dict, budget_tokens: int = 1500, **more) -> Facts:
    return Facts(result=result, budget=Budget(budget_tokens=budget_tokens), **more)


@pytest.mark.parametrize("cursor", OLD_CURSORS, ids=["rolled-back", "stopped", "ended", "branched"])
def test_an_old_cursor_reads_as_the_typed_state_and_round_trips(cursor):
    state = ControllerState.from_json(cursor)
    old = json.loads(cursor)
    assert [(p.spec, p.run_key, p.attempt, p.warm_version, p.tokens_before) for p in state.phases] == [
        (PhaseSpec(**json.loads(h["spec"])), h["run_key"], h["attempt"], h["warm_version"], h["tokens_before"])
        for h in old["history"]
    ]
    assert state.branches == old.get("branches", {}) and state.watch == old.get("watch", {})
    text = state.to_json()
    assert json.loads(text)["format"] == 2 and ControllerState.from_json(text) == state
    assert ControllerState.from_json(text).to_json() == text


def test_an_old_cursors_last_decision_replaces_and_ending_become_typed_values():
    stopped = ControllerState.from_json(STOPPED)
    reason = "budget spent: 1,500 of 1,500 tokens trained, 0 left is less than the minimum phase (100)"
    assert stopped.last == LastDecision("jellyfish", "stop", reason)  # the reason's own colons kept
    assert stopped.phases[-1].replaces == ("ocelot",) and stopped.phases[-1].spec.model_changes == {"qk_norm": True}
    ended = ControllerState.from_json(ENDED).phases[-1].ending
    assert ended is not None and (ended.step, ended.terminated) == (30, False) and ended.reason.startswith("off the ladder's")
    assert ControllerState.from_json(None) == ControllerState.from_json("") == ControllerState()


def test_a_cursor_of_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="format 3 is not 2"):
        ControllerState.from_json(json.dumps({"format": 3}))


def test_an_old_cursor_gives_the_decisions_it_gave():
    """What the sensor requested and recorded from these cursors before the typed state (its runs in tests/sensors/)."""
    # ocelot spiked again after two roll-backs: the architecture switch, from kestrel's checkpoint
    out = tick(SWITCHING, ControllerState.from_json(OCELOT_ATTEMPT_2), _finished(_result(500, 1500, [*CALM, 50.0])))
    (run,) = out.requests
    jellyfish = dataclasses.replace(
        KESTREL,
        name="jellyfish",
        warm_start_from="kestrel",
        schedule="linear_decay",
        token_budget=500,
        is_cooldown=True,
        model_changes={"qk_norm": True},
        transplant="qk_norm",
    )
    assert (run.run_key, run.partition, run.action) == ("sw-1-jellyfish-0", "jellyfish", "switch_architecture")
    assert run.config == {"attempt": 0, "phase": dataclasses.asdict(jellyfish), "warm_start_version": KESTREL_VERSION}
    assert run.tags == {
        "marin/accelerator": "cpu",
        "marin/action": "switch_architecture",
        "marin/phase": "jellyfish",
        "marin/priority": "production",
    }
    (record,) = out.observations
    assert (
        isinstance(record, Decided)
        and record.partition == "ocelot"
        and record.metadata
        == {
            "budget_tokens": 1500,
            "decision": "switch_architecture",
            "next_phase": "jellyfish",
            "tokens_left": {"web": 1_000_000},
            "reason": f"{SPIKE}; 2 roll-back(s) of ocelot did not cure it: switch to the qk_norm architecture (qk_norm=True) "
            "as jellyfish from kestrel",
        }
    )
    assert out.state.phases[-1] == PhaseEntry(jellyfish, "sw-1-jellyfish-0", 0, KESTREL_VERSION, 1000, ("ocelot",))
    assert out.state == ControllerState.from_json(STOPPED.replace(_last(STOPPED), "null"))  # what the sensor kept
    # the stopped run stops again, and says so once
    again = tick(SWITCHING, ControllerState.from_json(STOPPED), _finished(_result(500, 1500, CALM)))
    assert again.requests == () and again.observations == () and again.state == ControllerState.from_json(STOPPED)
    assert again.skip == "stop: budget spent: 1,500 of 1,500 tokens trained, 0 left is less than the minimum phase (100)"
    # the ended phase is waited for
    waited = tick(PLAN, ControllerState.from_json(ENDED), Facts())
    assert waited.waiting and waited.skip.startswith(
        "waiting for phase kestrel (run watched-0-kestrel-0) to materialise: "
        "could not end it, it runs its course (off the ladder's band at step 30"
    )


def _last(cursor: str) -> str:
    return json.dumps(json.loads(cursor)["last"])


# ---- each path of a tick on typed facts -------------------------------------------------------------------

KESTREL_RUN = ControllerState(phases=(PhaseEntry(KESTREL, "sw-0-kestrel-0"),))


def test_the_first_tick_requests_the_plans_first_phase_as_it_is_launched():
    out = tick(PLAN, ControllerState(), Facts(), Launch({"cpu": 4}, {"dagster/max_retries": "2"}, "/budget.yaml"))
    (run,) = out.requests
    assert (run.run_key, run.action, run.spec) == ("sw-0-kestrel-0", "continue", KESTREL)
    assert run.config == {
        "phase": dataclasses.asdict(KESTREL),
        "warm_start_version": "",
        "attempt": 0,
        "budget_file": "/budget.yaml",
    }
    assert run.tags == {
        "dagster/max_retries": "2",
        "marin/phase": "kestrel",
        "marin/action": "continue",
        "marin/accelerator": "cpu",
        "marin/chips": "4",
        "marin/priority": "production",
    }
    assert out.state == KESTREL_RUN and out.skip is None and not out.waiting and out.cancel is None
    assert "budget_file" not in tick(PLAN, ControllerState(), Facts()).requests[0].config


def test_until_the_phase_materialises_the_tick_waits_or_checks_its_live_steps():
    waiting = "waiting for phase kestrel (run sw-0-kestrel-0) to materialise"
    assert (tick(PLAN, KESTREL_RUN, Facts()).skip, tick(PLAN, KESTREL_RUN, Facts()).waiting) == (waiting, True)
    no_steps = tick(PLAN, KESTREL_RUN, Facts(running="r1"))
    assert no_steps.waiting and no_steps.skip == f"{waiting}: no live telemetry yet"
    live = Facts(running="r1", live=LiveSteps(step=3, tokens_trained=300, losses=tuple(CALM)), budget=Budget(budget_tokens=1500))
    on_track = tick(PLAN, KESTREL_RUN, live)
    assert on_track.skip == f"{waiting}: step 3, 300 of 1,000 tokens, on track"
    assert not on_track.waiting and on_track.state == KESTREL_RUN and on_track.requests == on_track.observations == ()


def test_a_budget_cut_mid_phase_cancels_its_run_then_records_whether_it_stopped():
    cut = Facts(running="r1", live=LiveSteps(step=3, tokens_trained=300, losses=tuple(CALM)), budget=Budget(budget_tokens=500))
    asked = tick(PLAN, KESTREL_RUN, cut)
    assert asked.cancel == "r1" and asked.state == KESTREL_RUN
    reason = "budget cut at step 3 to 500 tokens"
    for stopped, outcome, how in (
        (True, "ending it at its next checkpoint", "ending it at its checkpoint"),
        (False, "could not terminate its run; it runs its course", "could not end it, it runs its course"),
    ):
        out = tick(PLAN, KESTREL_RUN, dataclasses.replace(cut, cancelled=stopped))
        (record,) = out.observations
        assert out.cancel is None and out.skip.startswith(f"end_phase: {reason}") and out.skip.endswith(outcome)
        assert record.metadata["decision"] == "end_phase" and record.metadata["reason"] == out.skip.removeprefix("end_phase: ")
        assert (record.metadata["step"], record.metadata["run_id"], record.metadata["tokens_left"]) == (3, "r1", {})
        ending = out.state.phases[-1].ending
        assert ending == Ending(record.metadata["reason"].removesuffix(f": {outcome}"), 3, stopped)
        assert tick(PLAN, out.state, Facts()).skip.endswith(f"{how} ({ending.reason})")
    # a trainer that checks the budget itself ends the phase: the live tick leaves the cut to it
    assert tick(PLAN, KESTREL_RUN, cut, Launch(trainer_budget_file="/budget.yaml")).cancel is None


def test_a_finished_phase_is_decided_its_decision_recorded_once_and_its_successor_requested():
    out = tick(PLAN, KESTREL_RUN, _finished(_result(1000, 1000, CALM, version="v-kestrel")))
    (run,) = out.requests
    assert (run.run_key, run.action, run.config["warm_start_version"]) == ("sw-1-ocelot-0", "cool_down", "v-kestrel")
    assert out.state.phases[-1] == PhaseEntry(run.spec, "sw-1-ocelot-0", 0, "v-kestrel", 1000)
    assert [o.metadata["decision"] for o in out.observations] == ["cool_down"] and out.state.last is None
    # a spike retries the phase from the same warm start, as attempt 1
    spiked = tick(PLAN, out.state, _finished(_result(500, 1500, [*CALM, 50.0])))
    assert [(r.run_key, r.action, r.config["attempt"]) for r in spiked.requests] == [("sw-1-ocelot-1", "roll_back", 1)]
    assert spiked.state.phases[-1] == dataclasses.replace(out.state.phases[-1], run_key="sw-1-ocelot-1", attempt=1)
    # a decision that requests nothing is kept, and recorded the first time only
    stopped = tick(PLAN, out.state, _finished(_result(500, 1500, CALM)))
    assert stopped.state.last is not None and stopped.state.last.action == "stop" and len(stopped.observations) == 1
    assert tick(PLAN, stopped.state, _finished(_result(500, 1500, CALM))).observations == ()


def test_the_watchs_verdict_is_handed_to_decide_and_recorded_when_it_changes():
    drawn = []
    hold = WatchVerdict(
        "kestrel",
        "kestrel#0",
        "False:12:hold",
        BandSignal("loss left the band", "hold", 12),
        render=lambda: drawn.append(1) or {"ladder_watch": "outside"},
    )
    out = tick(PLAN, KESTREL_RUN, _finished(_result(1000, 1000, CALM), verdict=hold))
    assert out.requests == () and out.skip.startswith("hold: off the ladder's band: loss left the band")
    assert out.observations[0] is hold and out.observations[1].metadata["decision"] == "hold"
    assert out.state.watch == {"kestrel#0": "False:12:hold"} and drawn == []  # drawn when the sensor records it
    again = tick(PLAN, out.state, _finished(_result(1000, 1000, CALM), verdict=hold))
    assert again.observations == () and again.state == out.state


def test_a_branch_leaves_with_the_tick_that_accepts_its_source():
    plan = dataclasses.replace(PLAN, branches=(BranchSpec("cool", "kestrel", 100),))
    finished = _finished(_result(1000, 1000, CALM, version="v-kestrel"), versions={"sw-0-kestrel-0": "v-kestrel"})
    launch = Launch(run_tags={"dagster/max_retries": "2"})
    out = tick(plan, KESTREL_RUN, finished, launch)
    main, branch = out.requests
    assert main.run_key == "sw-1-ocelot-0" and (branch.run_key, branch.partition) == ("sw-branch-kestrel+cool", "kestrel+cool")
    assert branch.config == {
        "phase": dataclasses.asdict(branch_phase(plan.branches[0], KESTREL)),
        "warm_start_version": "v-kestrel",
        "attempt": 0,
    }
    assert branch.tags["marin/branch_of"] == "kestrel" and branch.tags["marin/action"] == "branch"
    assert branch.tags["dagster/max_retries"] == "2"
    decision, lineage = out.observations
    assert isinstance(lineage, BranchStart) and lineage.metadata["from_version"] == "v-kestrel"
    assert decision.metadata["decision"] == "cool_down" and out.state.branches == {"kestrel+cool": "sw-branch-kestrel+cool"}
    assert tick(plan, KESTREL_RUN, dataclasses.replace(finished, versions={}), launch).requests == (main,)  # no version: not yet
    # a held source lets no branch leave
    held = WatchVerdict("kestrel", "kestrel#0", "False:12:hold", BandSignal("off", "hold", 12), render=dict)
    assert tick(plan, KESTREL_RUN, dataclasses.replace(finished, verdict=held)).requests == ()


# ---- the run as decide sees it --------------------------------------------------------------------------


def test_the_phases_drop_rates_reach_decide_until_a_person_releases_it():
    state = ControllerState(phases=(PhaseEntry(KESTREL, "k", attempt=1),))
    result = _result(10, 10, [3.0], **{"count/recent_drop_rates": [0.5, None]})
    run, signals = finished_view(result, state, Budget(budget_tokens=100))
    assert signals.recent_drop_rates[0] == 0.5 and math.isnan(signals.recent_drop_rates[1])  # null (a NaN) stays unreadable
    assert run.rollbacks == 1 and run.switches_done == ()
    assert finished_view(result, state, Budget(budget_tokens=100, released_holds=("kestrel",)))[1].recent_drop_rates == ()
    assert finished_view(_result(10, 10, [3.0]), state, Budget(budget_tokens=100))[1].recent_drop_rates == ()


def test_data_that_arrived_after_the_phase_reported_is_a_source_the_next_decision_sees():
    """The newest datasets, read at the decision: a new source counts whole, a grown one less what the run consumed of
    it; without them the phase's own report stands."""
    state = ControllerState(phases=(PhaseEntry(KESTREL, "k"),))
    budget = Budget(budget_tokens=1000, data_allotment_tokens={"user": 300})
    result = {**_result(10, 10, [3.0]), "count/tokens_available": {"web": 90}}
    assert finished_view(result, state, budget)[1].tokens_left == {"web": 90}
    _, signals = finished_view(result, state, budget, {"web": 150, "user": 500})
    assert signals.tokens_left == {"web": 140, "user": 300}  # user: its allotment caps it
