"""Which checkpoints of a run dir may go, and deleting them so that none is ever half-valid.

A run dir ``R`` (``marin train --out R``, a phase's work dir) holds ``R/checkpoints/step-NNNNNNNNN/``
folders (``checkpoint.py``). ``plan_retention`` sorts every one of them into *keep*, each with one
reason, or *delete*:

- ``not committed``: the folder is not a valid committed checkpoint (in flight, crashed, damaged):
  never touched, whatever else is asked;
- ``newest valid``: the checkpoint ``--resume`` continues from;
- ``pinned``: a step the caller names (one another asset read);
- ``phase final``: the last valid checkpoint of each phase its meta.json records (``phase`` and
  ``phase_start_step``, written by ``restore.Run.meta``);
- ``last N``: the newest ``keep_last`` valid checkpoints.

A folder that earns several reasons is listed once, with the first of that list. Every other valid
checkpoint is deleted by ``apply_retention``: its COMMITTED marker first (durably), then the rest, so a
crash mid-delete leaves a folder ``checkpoint.is_valid`` rejects, never one that still looks whole.

Deleting races a trainer writing the same run dir: callers hold ``work_dir.work_dir_lease`` on it while
they plan and delete (``marin train prune`` does). Knows nothing of Dagster.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterable

from marin_assets.knobs import knob
from marin_assets.store.fsutil import child, filesystem, fsync_dir, is_local, join, list_files, read_json

log = logging.getLogger(__name__)
REASONS = ("not committed", "newest valid", "pinned", "phase final", "last N")  # first one wins


@dataclasses.dataclass(frozen=True)
class RetentionSettings:
    """How many checkpoints a phase keeps when it ends (``train/demo``'s ``keep_last_checkpoints``)."""

    keep_last: int = knob(
        0,
        help="keep the newest N checkpoints of a phase and its final one, delete the other "
        "committed ones when the phase ends (0 keeps every one)",
        versioned=False,
    )

    def __post_init__(self) -> None:
        if isinstance(self.keep_last, bool) or not isinstance(self.keep_last, int) or self.keep_last < 0:
            raise ValueError(f"RetentionSettings.keep_last must be an integer >= 0 (0 keeps all), got {self.keep_last!r}")


@dataclasses.dataclass(frozen=True)
class RetentionPlan:
    """Every checkpoint folder of a run dir, once: ``keep`` as (step, reason), ``delete`` as steps
    (both ascending); ``problems``: why each ``not committed`` folder is not a valid checkpoint."""

    keep: list[tuple[int, str]]
    delete: list[int]
    problems: dict[int, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        kept = {step for step, _ in self.keep}
        if kept & set(self.delete):
            raise ValueError(f"a retention plan both keeps and deletes step(s) {sorted(kept & set(self.delete))}")
        if any(reason not in REASONS for _, reason in self.keep):
            raise ValueError(f"a retention plan's reasons are {list(REASONS)}")


def check_run_dir(run_dir: str | os.PathLike) -> None:
    """FileNotFoundError naming ``run_dir`` when it is not an existing folder."""
    fs, path = filesystem(os.fspath(run_dir))
    if not fs.isdir(path):
        raise FileNotFoundError(f"{os.fspath(run_dir)}: no such run dir (give the --out of a training run)")


def step_folders(run_dir: str | os.PathLike) -> dict[int, os.PathLike | str]:
    """{step: folder} of every ``step-*`` folder under ``run_dir/checkpoints``, ascending."""
    # deferred (import cost): jax (the code location imports this module)
    from marin_assets.train.checkpoints import checkpoint as ckpt

    folders: dict[int, os.PathLike | str] = {}
    for folder in ckpt.list_checkpoints(child(run_dir, "checkpoints")):
        step = int(os.fspath(folder).rstrip("/").rsplit("-", 1)[1])
        if step in folders:
            raise ValueError(f"{folders[step]} and {folder} both hold step {step}: resolve that by hand first")
        folders[step] = folder
    return folders


def plan_retention(
    run_dir: str | os.PathLike, keep_last: int, keep_steps: Iterable[int] = (), keep_phase_finals: bool = True
) -> RetentionPlan:
    """What to keep (and why) and what to delete among ``run_dir``'s checkpoints; reads, never writes.
    ValueError for a bad ``keep_last``, a pinned step with no folder, or a run dir with no checkpoints."""
    # deferred (import cost): jax (the code location imports this module)
    from marin_assets.train.checkpoints import checkpoint as ckpt

    _check_keep_last(keep_last)
    check_run_dir(run_dir)
    folders = step_folders(run_dir)
    if not folders:
        raise ValueError(f"{os.fspath(run_dir)} has no checkpoints (no step-* folder in its checkpoints/)")
    pinned = _pinned(keep_steps, folders, run_dir)
    problems = {step: p for step, folder in folders.items() if (p := ckpt.marker_problem(folder)) is not None}
    valid = [step for step in folders if step not in problems]
    finals = _phase_finals({s: folders[s] for s in valid}) if keep_phase_finals else []
    reasons = dict.fromkeys(problems, "not committed")
    for steps, reason in (
        (valid[-1:], "newest valid"),
        (pinned, "pinned"),
        (finals, "phase final"),
        (valid[-keep_last:], "last N"),
    ):
        for step in steps:
            reasons.setdefault(step, reason)
    return RetentionPlan(keep=sorted(reasons.items()), delete=[s for s in valid if s not in reasons], problems=problems)


def _check_keep_last(keep_last) -> None:
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
        raise ValueError(f"keep_last must be an integer >= 1 (the newest valid checkpoints kept), got {keep_last!r}")


def _pinned(keep_steps: Iterable[int], folders: dict, run_dir) -> list[int]:
    """The pinned steps; ValueError naming those that have no checkpoint folder."""
    pinned = sorted(set(keep_steps))
    unknown = [step for step in pinned if step not in folders]
    if unknown:
        raise ValueError(f"keep step(s) {unknown}: no such checkpoint in {os.fspath(run_dir)} (its steps: {list(folders)})")
    return pinned


def _phase_finals(valid: dict[int, os.PathLike | str]) -> list[int]:
    """The last of ``valid``'s steps of each phase (its meta's ``phase`` and ``phase_start_step``)."""
    last: dict[tuple, int] = {}
    for step, folder in valid.items():  # ascending: a later step of a phase replaces an earlier one
        fs, path = filesystem(os.fspath(folder))
        meta = read_json(fs, join(path, "meta.json")) or {}
        last[(meta.get("phase"), meta.get("phase_start_step"))] = step
    return sorted(last.values())


def sizes(run_dir: str | os.PathLike, steps: Iterable[int]) -> list[dict]:
    """{"step", "folder", "bytes"} of each of ``steps``' checkpoint folders (what deleting them frees)."""
    folders = step_folders(run_dir)
    return [{"step": step, "folder": str(folders[step]), "bytes": _bytes(folders[step])} for step in steps]


def _bytes(folder: os.PathLike | str) -> int:
    fs, path = filesystem(os.fspath(folder))
    return sum(size for _, size in list_files(fs, path))


def apply_retention(run_dir: str | os.PathLike, plan: RetentionPlan) -> list[dict]:
    """Delete ``plan.delete``'s folders (uncommitted first, see ``delete_checkpoint``); returns
    {"step", "folder", "bytes"} of each deleted. A planned folder already gone is skipped with a warning."""
    folders = step_folders(run_dir)
    deleted = []
    for step in plan.delete:
        if step not in folders:
            log.warning("retention: step %d of %s is already gone", step, os.fspath(run_dir))
            continue
        freed = _bytes(folders[step])
        delete_checkpoint(folders[step])
        deleted.append({"step": step, "folder": str(folders[step]), "bytes": freed})
    return deleted


def delete_checkpoint(folder: os.PathLike | str) -> None:
    """Remove ``folder``'s COMMITTED marker durably, then everything else: interrupted anywhere, what
    is left is not a valid checkpoint."""
    fs, path = filesystem(os.fspath(folder))
    uncommit(fs, path)
    fs.rm(path, recursive=True)


def uncommit(fs, path: str) -> None:
    """Delete the marker of the checkpoint at ``path``; locally the folder is fsynced, so the removal
    survives a power loss before the rest goes (an object store's DELETE is durable when it returns)."""
    # deferred (import cost): jax (the code location imports this module)
    from marin_assets.train.checkpoints import checkpoint as ckpt

    fs.rm_file(join(path, ckpt.MARKER))
    if is_local(fs):
        fsync_dir(path)
