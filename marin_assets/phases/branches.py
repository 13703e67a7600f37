"""Branches: phases that leave the main run from one of its checkpoints and lead nowhere.

Marin cooled the 535B run down early, for one to two days, off a checkpoint of the main run to get a
checkpoint for RL, while the main run went on as it was. A ``BranchSpec`` (plan.py) declares such a
phase; ``branch_phase`` makes its ``PhaseSpec`` from the source phase's. A branch is a partition of
its own, ``"<source>+<branch>"``: ``+`` is a partition-key character the store accepts
(store/names.py) and no main phase name may contain (``PhasePlan`` refuses one), so a branch never
collides with a main phase and ``is_branch_partition`` tells the two apart by the key alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from marin_assets.phases.plan import BRANCH_MARK, BranchSpec, PhasePlan, PhaseSpec

if TYPE_CHECKING:  # controller.py imports this module: its state is read here, never built
    from marin_assets.phases.controller import ControllerState, PhaseEntry


def is_branch_partition(key: str) -> bool:
    """Whether a phase partition key names a branch rather than a phase of the main run."""
    return BRANCH_MARK in key


def branch_phase(branch: BranchSpec, source: PhaseSpec) -> PhaseSpec:
    """The branch's phase: warm-started from ``source``'s final checkpoint, on its model (with the branch's
    ``model_changes`` on top), batch and hardware; schedule, length and (where the branch sets them) mix, peak LR,
    z-loss, context length and sequence axis of its own."""
    if source.name != branch.from_phase:
        raise ValueError(f"branch {branch.name!r} leaves from {branch.from_phase!r}, not from {source.name!r}")
    return dataclasses.replace(
        source,
        name=branch.partition,
        warm_start_from=source.name,
        transplant=None,  # the source already carries any switched architecture
        schedule=branch.schedule,
        mixture=dict(branch.mixture) if branch.mixture is not None else source.mixture,
        token_budget=branch.token_budget,
        peak_lr=branch.peak_lr if branch.peak_lr is not None else source.peak_lr,
        is_cooldown=branch.is_cooldown,
        z_loss=branch.z_loss if branch.z_loss is not None else source.z_loss,
        start_fraction=branch.start_fraction,
        warmup_start_fraction=0.0,
        seq_len=branch.seq_len if branch.seq_len is not None else source.seq_len,
        model_changes={**(source.model_changes or {}), **(branch.model_changes or {})} or None,
        sequence_parallel=branch.sequence_parallel if branch.sequence_parallel is not None else source.sequence_parallel,
    )


# Decisions that do not accept the phase they judge: no branch leaves from its checkpoint.
NOT_ACCEPTED = ("roll_back", "switch_architecture", "hold")


@dataclasses.dataclass(frozen=True)
class BranchStart:
    """A branch that leaves now: its phase, the content version of the source checkpoint it warm-starts from,
    and its run's key (``<run>-branch-<partition>``: no main phase's run key has a ``+``)."""

    spec: PhaseSpec
    source_version: str
    run_key: str

    @property
    def partition(self) -> str:
        return self.spec.name

    @property
    def config(self) -> dict[str, Any]:
        """The train asset's run config: the phase, its warm start's version (so its version chains to it), attempt 0."""
        return {"phase": dataclasses.asdict(self.spec), "warm_start_version": self.source_version, "attempt": 0}

    @property
    def tags(self) -> dict[str, str]:
        return {"marin/branch_of": self.spec.warm_start_from or ""}

    @property
    def metadata(self) -> dict[str, str]:
        """Its lineage, recorded on the branch's partition as the controller records its decisions."""
        source = self.spec.warm_start_from or ""
        return {
            "decision": "branch",
            "reason": f"{self.partition} leaves {source} at version {self.source_version[:16]}",
            "next_phase": "",
            "from_phase": source,
            "from_version": self.source_version,
        }


def branch_starts(plan: PhasePlan, state: ControllerState, versions: Mapping[str, str]) -> list[BranchStart]:
    """The branches of ``plan`` that leave now, read off the phase controller's state after its tick on the main
    run. ``versions``: {run key: the content version that run materialised} of the ``branch_sources``.

    A source the main run moved on from is accepted; the newest phase only once ``decide`` judged it with an
    action not in ``NOT_ACCEPTED``, so a branch never leaves from a checkpoint that is rolled back or held."""
    starts = []
    for branch in plan.branches:
        entry = _source(state, branch)
        if entry is None or (entry is state.newest and not _judged_good(state, branch.from_phase)):
            continue
        version = versions.get(entry.run_key)
        if version is not None:
            starts.append(BranchStart(branch_phase(branch, entry.spec), version, f"{plan.run}-branch-{branch.partition}"))
    return starts


def branch_sources(plan: PhasePlan, state: ControllerState) -> list[PhaseEntry]:
    """The phases of the main run that branches not requested yet leave from: whose versions ``branch_starts`` reads."""
    return [entry for branch in plan.branches if (entry := _source(state, branch)) is not None]


def _source(state: ControllerState, branch: BranchSpec) -> PhaseEntry | None:
    """The main run's phase ``branch`` leaves from, unless the branch was requested already or the phase is not in the chain."""
    if branch.partition in state.branches:
        return None
    return next((e for e in state.phases if e.spec.name == branch.from_phase), None)


def _judged_good(state: ControllerState, phase: str) -> bool:
    """Whether the controller's newest decision is on ``phase`` and accepts its checkpoint."""
    return state.last is not None and state.last.phase == phase and state.last.action not in NOT_ACCEPTED
