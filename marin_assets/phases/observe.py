"""The run as ``decide`` and ``end_phase_now`` see it (``RunState`` and ``Signals``), from the controller's state
(marin_assets/phases/controller.py) and what the sensor read: the newest phase's materialisation once it finished,
its live telemetry while it runs, the budget file and the newest datasets."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from marin_assets.phases.signals import RunState, Signals
from marin_assets.train.budget import Budget
from marin_assets.train.stopping import STOP_SIGNAL_NAMES

if TYPE_CHECKING:  # controller.py imports this module: its state is read here, never built
    from marin_assets.phases.controller import ControllerState, LiveSteps


def run_state(
    state: ControllerState, phase_tokens: int, tokens_trained: int, step: int | None, ended_early: str | None
) -> RunState:
    """The run at its newest phase, which has trained ``phase_tokens`` so far."""
    specs = [e.spec for e in state.phases]
    # A phase an architecture switch replaced left the chain but keeps its name (its partition exists).
    names = [name for e in state.phases for name in (*e.replaces, e.spec.name)]
    return RunState(
        phase=specs[-1],
        phase_tokens=phase_tokens,
        tokens_trained=tokens_trained,
        phases_done=tuple(names[:-1]),
        cooldowns_done=sum(s.is_cooldown for s in specs[:-1]),
        last_good_checkpoint=specs[-2].name if len(specs) > 1 else None,
        step=step,
        ended_early=ended_early,
        rollbacks=state.phases[-1].attempt,
        switches_done=tuple(s.transplant for s in specs if s.transplant),
    )


def _own_stop(stopped_by: str | None) -> str | None:
    """Why the trainer ended the phase itself (its budget check), or None: a signal's stop is the
    controller's ``ending`` (or a preemption, which the run's retry resumes)."""
    return stopped_by if stopped_by and stopped_by not in STOP_SIGNAL_NAMES else None


def finished_view(
    result: Mapping[str, Any], state: ControllerState, budget: Budget, datasets: Mapping[str, int] | None = None
) -> tuple[RunState, Signals]:
    """The run after its newest phase finished (or was ended), from the phase's materialisation metadata.
    ``datasets``: {source: train tokens} of the newest materialisation of each dataset, read now: a source that
    arrived or grew after the phase reported counts from there, less what the run has consumed of it."""
    consumed = result["count/tokens_consumed"]
    available = {
        **result["count/tokens_available"],
        **{s: max(0, total - consumed.get(s, 0)) for s, total in (datasets or {}).items()},
    }
    ending, step = state.phases[-1].ending, result.get("count/final_step")
    run = run_state(
        state,
        int(result["count/phase_tokens"]),
        int(result["count/tokens_trained"]),
        int(step) if step is not None else None,
        ending.reason if ending is not None and ending.terminated else _own_stop(result.get("count/stopped_by")),
    )
    # A phase a person released (the budget file's released_holds) is not held again for its drops.
    drops = () if run.phase.name in budget.released_holds else result.get("count/recent_drop_rates") or ()
    signals = Signals(
        tokens_left=budget.tokens_left(consumed, available),
        budget_tokens=budget.budget_tokens,
        hardware_available=budget.hardware_available,
        recent_losses=tuple(result["count/recent_losses"]),
        recent_drop_rates=tuple(math.nan if x is None else x for x in drops),
    )
    return run, signals


def live_view(state: ControllerState, live: LiveSteps, budget: Budget) -> tuple[RunState, Signals]:
    """The run while its newest phase runs, from the phase's live telemetry."""
    run = run_state(state, live.tokens_trained - state.phases[-1].tokens_before, live.tokens_trained, live.step, None)
    signals = Signals(
        tokens_left={},
        budget_tokens=budget.budget_tokens,
        hardware_available=budget.hardware_available,
        recent_losses=live.losses,
    )
    return run, signals
