"""The run's budget file: the user-editable signal source of the phase controller and the trainer.

YAML with ``budget_tokens`` (the compute/time budget in tokens), optional
``data_allotment_tokens`` ({source: tokens this run may draw, like a data quota}),
``hardware_available`` (tags with free capacity) and ``released_holds`` (phases a person has
looked at after the ladder watch held the run: the controller goes on past them). Editing it
is how a person raises or cuts the budget; the controller reads it on every tick.

A running phase reads it too (``BudgetStop``, a ``train`` stop check): at every permanent
checkpoint step it asks ``budget_cut`` whether the budget still covers the rest of the phase,
and a cut ends the phase at that step, checkpointed. So a cut stops the phase within one
checkpoint interval (``checkpoint_every_steps``) of the step it was written at, however busy
the machine or late the controller's tick: the bound is in steps, not seconds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

import fsspec
import yaml

from marin_assets.config_files import load_structured
from marin_assets.settings import artifact_prefix, setting
from marin_assets.store.fsutil import write_bytes_atomic

BUDGET_ENV = "MARIN_BUDGET_FILE"


def budget_path() -> Path:
    """The run's budget file: $MARIN_BUDGET_FILE, else ``budget.yaml`` under the artifact prefix."""
    return Path(setting(BUDGET_ENV) or Path(artifact_prefix()) / "budget.yaml")


@dataclasses.dataclass(frozen=True)
class Budget:
    budget_tokens: int
    data_allotment_tokens: dict[str, int] = dataclasses.field(default_factory=dict)
    hardware_available: tuple[str, ...] = ()
    released_holds: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.budget_tokens, int) or self.budget_tokens < 0:
            raise ValueError(f"budget_tokens must be a non-negative integer, got {self.budget_tokens!r}")
        bad = {k: v for k, v in self.data_allotment_tokens.items() if not isinstance(v, int) or v < 0}
        if bad:
            raise ValueError(f"data_allotment_tokens must map sources to non-negative integers, got {bad}")
        if not all(isinstance(p, str) and p for p in self.released_holds):
            raise ValueError(f"released_holds must be a list of phase names, got {list(self.released_holds)!r}")

    def tokens_left(self, consumed: dict[str, int], available: dict[str, int]) -> dict[str, int]:
        """Per source: what the data (and its allotment, if any) still holds."""
        left = {}
        for source, remaining in available.items():
            cap = self.data_allotment_tokens.get(source)
            left[source] = remaining if cap is None else max(0, min(remaining, cap - consumed.get(source, 0)))
        return left


def load_budget(path: str | Path) -> Budget:
    path = Path(path)
    try:
        data = load_structured(path) or {}
    except FileNotFoundError:
        raise FileNotFoundError(f"budget file {path} does not exist (write budget_tokens: N into it)") from None
    if not isinstance(data, dict) or "budget_tokens" not in data:
        raise ValueError(f"budget file {path}: expected a mapping with budget_tokens, got {data!r}")
    unknown = set(data) - {"budget_tokens", "data_allotment_tokens", "hardware_available", "released_holds"}
    if unknown:
        raise ValueError(f"budget file {path}: unknown keys {sorted(unknown)}")
    released = data.get("released_holds") or ()
    if isinstance(released, str):
        raise ValueError(f"budget file {path}: released_holds must be a list of phase names, got the string {released!r}")
    try:
        return Budget(
            int(data["budget_tokens"]),
            dict(data.get("data_allotment_tokens") or {}),
            tuple(data.get("hardware_available") or ()),
            tuple(released),
        )
    except ValueError as err:
        raise ValueError(f"budget file {path}: {err}") from None


def write_budget(path: str | Path, budget: Budget) -> None:
    """Replace the budget file at once: a trainer reading it mid-phase sees the old budget or the new one."""
    text = yaml.safe_dump(
        dataclasses.asdict(budget)
        | {"hardware_available": list(budget.hardware_available), "released_holds": list(budget.released_holds)}
    )
    write_bytes_atomic(fsspec.filesystem("file"), os.fspath(path), text.encode("utf-8"), durable=False)


def budget_fingerprint(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def budget_cut(budget_tokens: int, tokens_trained: int, phase: str, phase_left: int, step: int | None = None) -> str | None:
    """Why a phase that still needs ``phase_left`` tokens must end now: the budget left after
    ``tokens_trained`` no longer covers it. None while it does (or the phase is done)."""
    left = budget_tokens - tokens_trained
    if phase_left <= 0 or left >= phase_left:
        return None
    at = f" at step {step}" if step is not None else ""
    return f"budget cut{at} to {budget_tokens:,} tokens: {max(left, 0):,} left but {phase} needs {phase_left:,} more"


@dataclasses.dataclass(frozen=True)
class BudgetStop:
    """A ``train`` stop check (``loop.StopCheck``): the budget file read at each permanent checkpoint
    step; ``budget_cut``'s reason ends the phase there. A file that cannot be read fails the step:
    a budget nobody can check is not silently ignored."""

    path: str

    def __call__(self, phase: str, step: int, tokens_trained: int, tokens_at_end: int) -> str | None:
        budget = load_budget(self.path)
        return budget_cut(budget.budget_tokens, tokens_trained, phase, tokens_at_end - tokens_trained, step)
