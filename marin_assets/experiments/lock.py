"""Immutability of started experiments: a lock file next to the runs, and a stamp in every run.

When the first run of an experiment starts, ``LOCK.json`` is written under
``<prefix>/experiments/<name>/`` with the content hash of the record's frozen fields
(hypothesis, criterion, baseline, budgets, seeds, schedule, evaluation), and when an arm's
first run starts, ``locks/<arm>.json`` with the hash of that arm (its change, seeds and
expectations). Each file is written whole and never rewritten, so runs starting in
parallel cannot lose each other's entries. From then on a record whose frozen fields or started arms hash differently is
refused, naming the fields that changed: the expectation was written down before the
results, and stays so. New arms may be added; they are locked when they start.

A file a user can delete cannot be the only record of the freeze, so every run also keeps
its own copy: ``run_stamp`` (the record's and the arm's frozen fields and hashes) is in the
run's ``run.json`` under ``"lock"``, inside the committed, content-versioned artifact.
``check_lock`` compares the record with the lock files *and* with the stamp of every
committed run, so deleting ``LOCK.json`` (or the arm locks) unfreezes nothing: the next run
start writes it again from the record the runs were checked against. ``analyze`` refuses
rows whose stamp differs as well. Runs committed before stamps existed carry none; for
them ``LOCK.json`` stays the record, and without it the freeze cannot be rebuilt (refused).

A lock file or stamp that is present but not what marin wrote (``null``, ``{}``, bad JSON,
a hash that does not match its own fields) is refused with ``LockFileError`` naming the
file, not read as "no lock" or guessed at: it means the store was edited by hand.

Amendments (``record.py``) are not frozen and explain edits; they do not permit an edit
to a frozen field or a started arm, which is refused here whether or not one is written.

The lock files themselves (paths, hashing, validated reads) are ``marin_assets/store/lock_files.py``,
shared with the scaling package's frozen predictions; their names are imported here too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from marin_assets.experiments.record import ExperimentRecord
from marin_assets.store import ArtifactStore, canonical_json
from marin_assets.store.fsutil import join, write_json_atomic
from marin_assets.store.lock_files import (
    SHA256_HEX,
    LockFileError,
    RecordChangedError,
    arm_lock_path,
    content_hash,
    experiment_dir,
    lock_path,
    locked_arms,
    read_lock,
    short_json,
)

STAMP_KEY = "lock"  # where run.json keeps run_stamp()


def run_stamp(record: ExperimentRecord, arm: str) -> dict:
    """What a run of ``arm`` keeps of the record it ran under (stored in its run.json under STAMP_KEY)."""
    frozen, arm_frozen = record.frozen(), record.frozen_arm(arm)
    return {
        "experiment": record.name,
        "frozen": frozen,
        "frozen_hash": content_hash(frozen),
        "arm": arm,
        "arm_frozen": arm_frozen,
        "arm_hash": content_hash(arm_frozen),
    }


def _changed(old: dict, new: dict) -> list[str]:
    return sorted(k for k in set(old) | set(new) if canonical_json(old.get(k)) != canonical_json(new.get(k)))


class _Frozen:
    """A record's frozen fields and hashes, computed once per check: hashing dominates a scan of many runs."""

    def __init__(self, record: ExperimentRecord) -> None:
        self.record = record
        self.fields = record.frozen()
        self.digest = content_hash(self.fields)
        self.arm_names = {a.name for a in record.all_arms()}
        self._arms: dict[str, tuple[dict, str]] = {}

    def arm(self, name: str) -> tuple[dict, str]:
        if name not in self._arms:
            fields = self.record.frozen_arm(name)
            self._arms[name] = (fields, content_hash(fields))
        return self._arms[name]


def _check_frozen(where: str, frozen: dict, digest: str, current: _Frozen) -> None:
    if current.digest != digest:
        raise RecordChangedError(
            f"{where}; its {', '.join(_changed(frozen, current.fields))} may no longer change. Revert the edit, or "
            f"write a new experiment record (a new name) for the new expectation"
        )


def _check_arm(where: str, arm: str, frozen: dict, digest: str, current: _Frozen) -> None:
    if arm not in current.arm_names:
        raise RecordChangedError(f"{where}; arm {arm!r} has started and may not be removed")
    fields, current_digest = current.arm(arm)
    if current_digest != digest:
        raise RecordChangedError(
            f"{where}; arm {arm!r} has started, so its {', '.join(_changed(frozen, fields))} "
            f"may no longer change. Add a new arm instead"
        )


def _well_formed_stamp(stamp: Any, experiment: str) -> bool:
    # The hashes are what is compared; the field copies only name what changed, so they are not re-hashed here.
    return (
        isinstance(stamp, dict)
        and stamp.get("experiment") == experiment
        and isinstance(stamp.get("arm"), str)
        and isinstance(stamp.get("frozen"), dict)
        and isinstance(stamp.get("arm_frozen"), dict)
        and all(isinstance(stamp.get(k), str) and SHA256_HEX.fullmatch(stamp[k]) for k in ("frozen_hash", "arm_hash"))
    )


def check_run_stamp(record: ExperimentRecord, stamp: Any, run: str, current: _Frozen | None = None) -> None:
    """Refuse ``record`` if the run called ``run`` was stamped with other frozen fields (or a bad stamp)."""
    if not _well_formed_stamp(stamp, record.name):
        raise LockFileError(
            f"run {run}: its '{STAMP_KEY}' stamp is not one marin wrote for experiment "
            f"{record.name!r}, got {short_json(stamp)}; the run cannot be reported"
        )
    current = current or _Frozen(record)
    where = f"{record.source}: experiment {record.name!r} has started runs (run {run})"
    _check_frozen(where, stamp["frozen"], stamp["frozen_hash"], current)
    _check_arm(where, stamp["arm"], stamp["arm_frozen"], stamp["arm_hash"], current)


def check_run_rows(record: ExperimentRecord, rows: Iterable[Mapping]) -> None:
    """Refuse ``record`` if any stamped run row was made under other frozen fields.

    Rows without a stamp (runs committed before stamps, rows built by hand) are left to
    ``check_lock``, which holds them to ``LOCK.json``.
    """
    current = _Frozen(record)
    for row in rows:
        if STAMP_KEY in row:
            check_run_stamp(record, row[STAMP_KEY], _row_label(row), current)


def _row_label(row: Mapping) -> str:
    budget = row.get("budget")
    shown = f"{budget:.3g}" if isinstance(budget, (int, float)) else repr(budget)
    return f"{row.get('arm')} at budget {shown}, seed {row.get('seed')}"


def check_lock(store: ArtifactStore, record: ExperimentRecord, *, scan_runs: bool = True) -> None:
    """Raise RecordChangedError if ``record`` differs from what its started runs were locked to.

    Checks the lock files and (``scan_runs``) the stamp of every committed run; LockFileError
    if a lock file or stamp is malformed, or if there is no LOCK.json but runs without
    stamps (the freeze of those runs was only in the deleted file). ``scan_runs=False`` is
    for a caller that checks the stamps of the rows it hands on itself (``materialize_run``).
    """
    # deferred (import cost): polars, pyarrow (runs.py imports this module)
    from marin_assets.experiments.runs import committed_runs

    current = _Frozen(record)
    lock = read_lock(store, record.name)
    where = f"{record.source}: experiment {record.name!r} has started runs (lock {lock_path(store, record.name)})"
    if lock is not None:
        _check_frozen(where, lock["frozen"], lock["frozen_hash"], current)
    for arm, locked in locked_arms(store, record.name).items():
        _check_arm(where, arm, locked["frozen"], locked["hash"], current)
    if not scan_runs:
        return
    unstamped = []
    for run, row in committed_runs(store, record.name):
        if STAMP_KEY in row:
            check_run_stamp(record, row[STAMP_KEY], run, current)
        else:
            unstamped.append(run)
    if unstamped and lock is None:
        raise LockFileError(
            f"{lock_path(store, record.name)} is missing and {len(unstamped)} committed run(s) of experiment "
            f"{record.name!r} (e.g. {unstamped[0]}) predate run stamps, so what they were locked to is unknown: "
            f"restore LOCK.json, or move those runs away to start the experiment over"
        )


def lock_arm(store: ArtifactStore, record: ExperimentRecord, arm: str) -> None:
    """Before a run of ``arm`` starts: check the record, then lock the record and the arm.

    A deleted LOCK.json is written again here, from the record ``check_lock`` has just held
    to every committed run's stamp.
    """
    check_lock(store, record)
    if read_lock(store, record.name) is None:
        store.fs.makedirs(experiment_dir(store, record.name), exist_ok=True)
        write_json_atomic(
            store.fs,
            lock_path(store, record.name),
            {"experiment": record.name, "frozen": record.frozen(), "frozen_hash": content_hash(record.frozen())},
        )
    path = arm_lock_path(store, record.name, arm)
    if not store.fs.exists(path):
        frozen = record.frozen_arm(arm)
        store.fs.makedirs(join(experiment_dir(store, record.name), "locks"), exist_ok=True)
        write_json_atomic(store.fs, path, {"arm": arm, "frozen": frozen, "hash": content_hash(frozen)})
