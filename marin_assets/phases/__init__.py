"""The Tootsie phase plan and the pure decision function over signals.

Public API
----------
PhaseSpec, PhasePlan                       the declarative plan (plan.py)
ArchitectureSwitch                         the plan's switch when roll-backs do not cure a spike (plan.py)
BranchSpec                                 a branch off a main-run phase, e.g. an early cooldown (plan.py)
branch_phase, is_branch_partition          a branch's PhaseSpec; whether a partition key is a branch (branches.py)
Signals, RunState, loss_spike              what the controller observes (signals.py)
drop_rate_alarm, DROP_RATE                 the MoE drop-rate signal and its metrics column (signals.py)
BandSignal(reason, action, step)           the main run left the ladder's band (scaling/trajectory.py)
decide(plan, state, signals) -> Decision   action in ACTIONS, reason, next_phase (decide.py)
end_phase_now(plan, state, signals)         while a phase runs: why to end it now, or None
ControllerState, tick(plan, state, facts)   the controller's state (its cursor) and pure tick (controller.py)
Facts, Launch, Tick, PhaseRun, Decided      what a tick reads, how runs launch, what it asks for (controller.py)
phase_telemetry_run(run, phase)             the telemetry run name a phase's trainer logs under
phase_train_config(base_train_config, spec) -> TrainConfig for the next phase
"""

from marin_assets.phases.branches import branch_phase, is_branch_partition
from marin_assets.phases.controller import ControllerState, Decided, Facts, Launch, PhaseRun, Tick, tick
from marin_assets.phases.decide import ACTIONS, Decision, decide, end_phase_now
from marin_assets.phases.plan import (
    ArchitectureSwitch,
    BranchSpec,
    PhasePlan,
    PhaseSpec,
    normalise,
    phase_telemetry_run,
    phase_train_config,
)
from marin_assets.phases.signals import BandSignal, RunState, Signals, drop_rate_alarm, loss_spike

__all__ = [
    "ACTIONS",
    "ArchitectureSwitch",
    "BandSignal",
    "BranchSpec",
    "branch_phase",
    "is_branch_partition",
    "ControllerState",
    "Decided",
    "Facts",
    "Launch",
    "PhaseRun",
    "Tick",
    "tick",
    "DROP_RATE",
    "Decision",
    "decide",
    "drop_rate_alarm",
    "end_phase_now",
    "PhasePlan",
    "PhaseSpec",
    "normalise",
    "phase_telemetry_run",
    "phase_train_config",
    "RunState",
    "Signals",
    "loss_spike",
]
from marin_assets.train.metrics import DROP_RATE  # the column the drop-rate hold reads
