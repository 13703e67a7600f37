"""Immutability of started experiments: a lock file next to the runs.

When the first run of an experiment starts, ``LOCK.json`` is written under
``<prefix>/experiments/<name>/`` with the content hash of the record's frozen fields
(hypothesis, criterion, baseline, budgets, seeds, schedule, evaluation), and when an arm's
first run starts, ``locks/<arm>.json`` with the hash of that arm (its change, seeds and
expectations). Each file is written whole and never rewritten, so runs starting in
parallel cannot lose each other's entries. From then on a record whose frozen fields or started arms hash differently is
refused, naming the fields that changed: the expectation was written down before the
results, and stays so. New arms may be added; they are locked when they start.
"""

from __future__ import annotations

import hashlib
from typing import Any

from marin_assets.experiments.record import ExperimentRecord
from marin_assets.store import ArtifactStore, canonical_json
from marin_assets.store.fsutil import join, read_json, write_json_atomic

LOCK_FILE = "LOCK.json"


class RecordChangedError(ValueError):
    """A started experiment's record was edited in a frozen field."""


def content_hash(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


def experiment_dir(store: ArtifactStore, name: str) -> str:
    return join(store.root, "experiments", name)


def lock_path(store: ArtifactStore, name: str) -> str:
    return join(experiment_dir(store, name), LOCK_FILE)


def arm_lock_path(store: ArtifactStore, name: str, arm: str) -> str:
    return join(experiment_dir(store, name), "locks", f"{arm}.json")


def read_lock(store: ArtifactStore, name: str) -> dict | None:
    return read_json(store.fs, lock_path(store, name))


def locked_arms(store: ArtifactStore, name: str) -> dict[str, dict]:
    root = join(experiment_dir(store, name), "locks")
    if not store.fs.exists(root):
        return {}
    out = {}
    for path in sorted(store.fs.ls(root, detail=False)):
        if path.endswith(".json"):
            arm = read_json(store.fs, path)
            out[arm["arm"]] = arm
    return out


def _changed(old: dict, new: dict) -> list[str]:
    return sorted(k for k in set(old) | set(new) if canonical_json(old.get(k)) != canonical_json(new.get(k)))


def check_lock(store: ArtifactStore, record: ExperimentRecord) -> None:
    """Raise RecordChangedError if ``record`` differs from what its started runs were locked to."""
    lock = read_lock(store, record.name)
    if lock is None:
        return
    where = f"{record.source}: experiment {record.name!r} has started runs (lock {lock_path(store, record.name)})"
    frozen = record.frozen()
    if content_hash(frozen) != lock["frozen_hash"]:
        fields = _changed(lock["frozen"], frozen)
        raise RecordChangedError(
            f"{where}; its {', '.join(fields)} may no longer change. Revert the edit, or write a new "
            f"experiment record (a new name) for the new expectation")
    arm_names = {a.name for a in record.all_arms()}
    for arm, locked in locked_arms(store, record.name).items():
        if arm not in arm_names:
            raise RecordChangedError(f"{where}; arm {arm!r} has started and may not be removed")
        current = record.frozen_arm(arm)
        if content_hash(current) != locked["hash"]:
            raise RecordChangedError(
                f"{where}; arm {arm!r} has started, so its {', '.join(_changed(locked['frozen'], current))} "
                f"may no longer change. Add a new arm instead")


def lock_arm(store: ArtifactStore, record: ExperimentRecord, arm: str) -> None:
    """Before a run of ``arm`` starts: check the record, then lock the record and the arm."""
    check_lock(store, record)
    if read_lock(store, record.name) is None:
        store.fs.makedirs(experiment_dir(store, record.name), exist_ok=True)
        write_json_atomic(store.fs, lock_path(store, record.name), {
            "experiment": record.name, "frozen": record.frozen(), "frozen_hash": content_hash(record.frozen())})
    path = arm_lock_path(store, record.name, arm)
    if not store.fs.exists(path):
        frozen = record.frozen_arm(arm)
        store.fs.makedirs(join(experiment_dir(store, record.name), "locks"), exist_ok=True)
        write_json_atomic(store.fs, path, {"arm": arm, "frozen": frozen, "hash": content_hash(frozen)})
