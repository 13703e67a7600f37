"""The phase controller's pure decision function.

    decide(plan, state, signals) -> Decision(action, reason, next_phase)

Actions, checked in this priority order (the first that applies wins, and its reason
names the signal):

1. ``roll_back``  the newest loss is non-finite or a spike, or the phase left the ladder's
                  band and the watch says ``rollback``: restart the current phase from its
                  last good checkpoint (no point planning ahead on a diverged model).
1b. ``switch_architecture``  a loss spike after ``after_rollbacks`` roll-backs of the phase, and
                  the plan's ``architecture_switch`` not made yet: the phase, under a new name,
                  restarts from the same last good checkpoint on the switched model (the executor
                  carries the weights over with the switch's ``transplant`` mapping), warming up
                  anew. Without a checkpoint before the phase (the first one) it rolls back.
2. ``stop``       the budget is spent (less than ``min_cooldown_tokens`` left) and the
                  current phase is over or is a cooldown that has reached its end.
2b. ``hold``      the phase left the ladder's band and the watch says ``hold``: request no
                  next phase until a person releases it (the budget file's ``released_holds``).
                  Likewise when the plan sets ``max_drop_rate`` and the MoE's mean drop rate
                  over the phase's last ``spike_window`` steps is above it: a router that drops
                  that much needs a person (capacity factor, balancing), not another phase.
3. ``cool_down``  the budget no longer covers the current phase (budget cut): a linear
                  cooldown to 5% of peak that ends exactly when the budget does, on the
                  high-quality mix; a second or later cooldown adds z-loss (Starling). An
                  ongoing cooldown is re-timed instead (the 535B contingency).
4. ``cool_down``  the mix is running out of data (total tokens left < ``low_data_tokens``):
                  cooldown with ``cooldown_hq_fraction`` high-quality data (Jellyfish).
5. ``change_mix`` one source of the mix is exhausted but the rest is not: drop it and
                  renormalise.
6. ``migrate``    bigger hardware on the plan's ladder is free: batch scales with the
                  hardware size, peak LR by the square-root rule (Ocelot).
7. ``re_warm``    a cooldown finished and the budget has room for more (Phoenix): warm up
                  from the cooled LR to peak, with the plan's re-warm mix.
8. ``cool_down``  a stable phase reached its token budget: the planned cooldown.
9. ``continue``   nothing to do.

Every new phase warm-starts from the current one; the trainer keeps the data position.

While a phase runs, ``end_phase_now(plan, state, signals)`` (the same signals, read live
from the telemetry store) says whether to end it at its next checkpoint rather than let it
run its course: a loss spike, the ladder's band left with ``rollback``, or a budget cut below
what the phase still needs (not the drop rate: like the band's ``hold``, it waits for the
phase's end). The controller then stops the run, and ``decide`` on the stopped phase picks the
successor, which starts from that checkpoint.
"""

from __future__ import annotations

import dataclasses
import math

from marin_assets.phases.plan import PhasePlan, PhaseSpec, normalise
from marin_assets.phases.signals import RunState, Signals, drop_rate_alarm, loss_spike
from marin_assets.train.budget import budget_cut

SPIKE = "loss spike"
OFF_BAND = "off the ladder's band"
ACTIONS = ("continue", "cool_down", "re_warm", "change_mix", "migrate", "roll_back", "stop", "hold", "switch_architecture")


@dataclasses.dataclass(frozen=True)
class Decision:
    action: str
    reason: str
    next_phase: PhaseSpec | None = None

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"Decision.action must be one of {ACTIONS}, got {self.action!r}")


def _used(state: RunState) -> tuple[str, ...]:
    return (*state.phases_done, state.phase.name)


def _successor(plan: PhasePlan, state: RunState, **changes) -> PhaseSpec:
    """The current phase's spec as the next phase: warm-started from it, on its model (no transplant again)."""
    return dataclasses.replace(
        state.phase, name=plan.name_after(_used(state)), warm_start_from=state.phase.name, transplant=None, **changes
    )


def _active(mixture, signals: Signals) -> dict[str, float]:
    return {k: v for k, v in mixture.items() if v > 0 and signals.tokens_left.get(k, 0) > 0}


def _cooldown(plan: PhasePlan, state: RunState, signals: Signals, tokens: int, why: str) -> Decision:
    current = state.phase
    hq = [s for s in plan.high_quality_sources if signals.tokens_left.get(s, 0) > 0]
    rest = _active(current.mixture, signals)
    rest = {k: v for k, v in rest.items() if k not in hq} or rest
    if hq:
        base = normalise(rest) if rest else {}
        mix = {k: (1 - plan.cooldown_hq_fraction) * v for k, v in base.items()}
        for s in hq:
            mix[s] = mix.get(s, 0.0) + plan.cooldown_hq_fraction / len(hq)
        mix = normalise(mix)
        mix_note = f"{plan.cooldown_hq_fraction:.0%} high-quality data ({', '.join(hq)})"
    else:
        mix = normalise(rest or current.mixture)
        mix_note = "no high-quality source has data left, keeping the mix"
    z = plan.late_cooldown_z_loss if state.cooldowns_done >= 1 else current.z_loss
    z_note = f", z-loss {z:g} (cooldown #{state.cooldowns_done + 1})" if state.cooldowns_done >= 1 else ""
    spec = PhaseSpec(
        name=plan.name_after(_used(state)),
        warm_start_from=current.name,
        schedule="linear_decay",
        mixture=mix,
        batch_size=current.batch_size,
        hardware=current.hardware,
        token_budget=tokens,
        peak_lr=current.peak_lr,
        is_cooldown=True,
        z_loss=z,
        model_changes=current.model_changes,
    )
    return Decision("cool_down", f"{why}: linear cooldown to 5% of peak over {tokens:,} tokens with {mix_note}{z_note}", spec)


def decide(plan: PhasePlan, state: RunState, signals: Signals) -> Decision:
    current = state.phase
    budget_left = signals.budget_tokens - state.tokens_trained
    phase_left = max(current.token_budget - state.phase_tokens, 0)

    # 1. divergence first
    spike = loss_spike(signals.recent_losses, plan.spike_sigma, plan.spike_window)
    if spike is None and state.ended_early is not None and state.ended_early.startswith(SPIKE):
        spike = state.ended_early  # ended mid-phase on a spike: its last losses may look calm again
    where = state.last_good_checkpoint or "the phase's warm-start checkpoint"
    if spike is not None:
        rollback = Decision("roll_back", f"loss spike: {spike}; restart {current.name} from {where}", current)
        return _switch(plan, state, spike, where) or rollback
    off_band = _band_roll_back(state, signals)
    if off_band is not None:
        return Decision("roll_back", f"{off_band}; restart {current.name} from {where}", current)

    # 2. nothing left to spend: no room for the rest of this phase nor for another one
    if budget_left < plan.min_cooldown_tokens and (state.phase_finished or budget_left < phase_left):
        return Decision(
            "stop",
            f"budget spent: {state.tokens_trained:,} of {signals.budget_tokens:,} tokens "
            f"trained, {max(budget_left, 0):,} left is less than the minimum phase "
            f"({plan.min_cooldown_tokens:,})",
        )

    # 2b. the ladder's band was left and the watch holds the run for a person to look
    held = _hold_reason(plan, signals)
    if held is not None:
        return Decision("hold", f"{held}; no next phase until the budget file's released_holds names {current.name}")

    # 3. budget cut below what the current phase needs
    if budget_left < phase_left:
        why = f"budget cut: {budget_left:,} tokens left but {current.name} needs {phase_left:,} more"
        if state.ended_early is not None:
            why = (
                f"budget cut: {current.name} ended early at step {state.step} ({state.ended_early}); "
                f"{budget_left:,} tokens left of the {phase_left + state.phase_tokens:,} it planned"
            )
        if current.is_cooldown:
            spec = _successor(plan, state, token_budget=budget_left, start_fraction=_lr_fraction_now(current, state))
            return Decision(
                "cool_down",
                f"{why}: re-time the running cooldown so it still ends at 5% of peak after {budget_left:,} tokens",
                spec,
            )
        return _cooldown(plan, state, signals, budget_left, why)

    # 4. the data is running out (Jellyfish)
    mix_left = sum(signals.tokens_left.get(k, 0) for k, v in current.mixture.items() if v > 0)
    if not current.is_cooldown and mix_left < plan.low_data_tokens:
        tokens = min(plan.cooldown_tokens, budget_left)
        return _cooldown(
            plan,
            state,
            signals,
            tokens,
            f"data running out: {mix_left:,} tokens left in the mix (threshold {plan.low_data_tokens:,})",
        )

    # 5. one source exhausted
    exhausted = sorted(k for k, v in current.mixture.items() if v > 0 and signals.tokens_left.get(k, 0) == 0)
    if exhausted:
        remaining = _active(current.mixture, signals)
        if remaining:
            spec = _successor(
                plan, state, mixture=normalise(remaining), token_budget=max(phase_left, 1), warmup_start_fraction=1.0
            )
            return Decision(
                "change_mix",
                f"source(s) {', '.join(exhausted)} exhausted: drop from the mix, renormalise to {_fmt_mix(spec.mixture)}",
                spec,
            )

    # 6. bigger hardware (Ocelot)
    if plan.hardware_ladder and not current.is_cooldown and not state.phase_finished:
        size_now = plan.hardware_ladder[current.hardware]
        bigger = [h for h in signals.hardware_available if plan.hardware_ladder.get(h, 0) > size_now]
        if bigger:
            target = max(bigger, key=lambda h: (plan.hardware_ladder[h], h))
            ratio = plan.hardware_ladder[target] / size_now
            batch = int(round(current.batch_size * ratio))
            lr = current.peak_lr * math.sqrt(batch / current.batch_size)
            spec = _successor(
                plan,
                state,
                hardware=target,
                batch_size=batch,
                peak_lr=lr,
                token_budget=max(phase_left, 1),
                warmup_start_fraction=1.0 / math.sqrt(ratio),
            )
            return Decision(
                "migrate",
                f"{target} is free ({ratio:g}x {current.hardware}): batch "
                f"{current.batch_size} -> {batch}, peak LR {current.peak_lr:.3g} -> {lr:.3g} "
                f"(sqrt rule)",
                spec,
            )

    # 7. a finished cooldown with budget to spare (Phoenix)
    if current.is_cooldown and state.phase_finished:
        tokens = min(plan.rewarm_tokens, budget_left)
        mix = _active(plan.rewarm_mixture or current.mixture, signals) or _active(current.mixture, signals)
        if not mix:
            return Decision("stop", "cooldown finished and no source in the re-warm mix has data left")
        base = _last_stable_lr(plan, state)
        spec = PhaseSpec(
            name=plan.name_after(_used(state)),
            warm_start_from=current.name,
            schedule="wsd",
            mixture=normalise(mix),
            batch_size=current.batch_size,
            hardware=current.hardware,
            token_budget=tokens,
            peak_lr=base,
            warmup_start_fraction=plan.rewarm_start_fraction,
            model_changes=current.model_changes,
        )
        return Decision(
            "re_warm",
            f"budget raised to {signals.budget_tokens:,} tokens ({budget_left:,} left) after "
            f"{current.name}'s cooldown: re-warm from {plan.rewarm_start_fraction:.0%} to peak "
            f"{base:.3g} with mix {_fmt_mix(spec.mixture)}",
            spec,
        )

    # 8. a stable phase used its tokens
    if state.phase_finished:
        return _cooldown(
            plan,
            state,
            signals,
            min(plan.cooldown_tokens, budget_left),
            f"{current.name} reached its token budget ({current.token_budget:,})",
        )

    return Decision(
        "continue",
        f"{current.name} on track: {state.phase_tokens:,} of {current.token_budget:,} tokens, {budget_left:,} left in the budget",
    )


def end_phase_now(plan: PhasePlan, state: RunState, signals: Signals, *, budget: bool = True) -> str | None:
    """While ``state.phase`` runs (state and signals read live): why to end it at its next
    checkpoint, or None to let it run. A loss spike, the ladder's band left with ``rollback``,
    or (``budget``: unless the trainer checks the budget file itself) a budget cut that leaves
    less than the phase still needs; a phase that has (nearly) finished anyway is left alone."""
    current = state.phase
    phase_left = max(current.token_budget - state.phase_tokens, 0)
    if phase_left == 0:
        return None
    at = f" at step {state.step}" if state.step is not None else ""
    spike = loss_spike(signals.recent_losses, plan.spike_sigma, plan.spike_window)
    if spike is not None:
        return f"{SPIKE}{at}: {spike}"
    if signals.off_band is not None and signals.off_band.action == "rollback":
        return f"{OFF_BAND}{at}: {signals.off_band.reason}"
    if not budget:
        return None
    return budget_cut(signals.budget_tokens, state.tokens_trained, current.name, phase_left, state.step)


def _switch(plan: PhasePlan, state: RunState, spike: str, where: str) -> Decision | None:
    """The plan's architecture switch, if roll-backs did not cure the spike and it was not made yet. The
    switched phase starts where the roll-back would (the last good checkpoint, not the diverged phase's
    end) and so gets the whole phase's token budget."""
    switch, current = plan.architecture_switch, state.phase
    if switch is None or state.rollbacks < switch.after_rollbacks or switch.mapping in state.switches_done:
        return None
    if current.warm_start_from is None:
        return None  # no checkpoint before the first phase to carry over
    spec = dataclasses.replace(
        current,
        name=plan.name_after(_used(state)),
        transplant=switch.mapping,
        model_changes={**(current.model_changes or {}), **switch.model_changes},
        warmup_start_fraction=switch.warmup_start_fraction,
    )
    return Decision(
        "switch_architecture",
        f"{SPIKE}: {spike}; {state.rollbacks} roll-back(s) of {current.name} did not "
        f"cure it: switch to the {switch.mapping} architecture "
        f"({_fmt_changes(switch.model_changes)}) as {spec.name} from {where}",
        spec,
    )


def _hold_reason(plan: PhasePlan, signals: Signals) -> str | None:
    """Why to hold the run for a person: the watch's ``hold`` on the ladder's band, or MoE drops above the plan's limit."""
    if signals.off_band is not None and signals.off_band.action == "hold":
        return f"{OFF_BAND}: {signals.off_band.reason}"
    if plan.max_drop_rate is not None:
        return drop_rate_alarm(signals.recent_drop_rates, plan.max_drop_rate, plan.spike_window)
    return None


def _band_roll_back(state: RunState, signals: Signals) -> str | None:
    """Why to roll back for the ladder's band: the watch says so now, or it ended the phase mid-way."""
    if signals.off_band is not None and signals.off_band.action == "rollback":
        return f"{OFF_BAND}: {signals.off_band.reason}"
    if state.ended_early is not None and state.ended_early.startswith(OFF_BAND):
        return state.ended_early
    return None


def _lr_fraction_now(phase: PhaseSpec, state: RunState) -> float:
    """Where a linear cooldown's LR is now, as a fraction of peak."""
    done = min(state.phase_tokens / phase.token_budget, 1.0)
    return phase.start_fraction + (0.05 - phase.start_fraction) * done


def _last_stable_lr(plan: PhasePlan, state: RunState) -> float:
    return state.phase.peak_lr


def _fmt_changes(changes) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(changes.items()))


def _fmt_mix(mix) -> str:
    return ", ".join(f"{k} {v:.0%}" for k, v in sorted(mix.items()))
