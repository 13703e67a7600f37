"""Started experiments are immutable: edits to frozen fields are refused, new arms are not."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from marin_assets.experiments.lock import (
    STAMP_KEY,
    RecordChangedError,
    check_lock,
    experiment_dir,
    lock_arm,
    lock_path,
    read_lock,
    run_stamp,
)
from marin_assets.experiments.record_files import record_from_dict
from marin_assets.experiments.runs import partition_key, runs_key
from marin_assets.experiments.screen import run_screen
from marin_assets.store import ArtifactStore, compute_version
from tests.experiments.test_record import RECORD


def record(**changes):
    data = copy.deepcopy(RECORD)
    for path, value in changes.items():
        node = data
        keys = path.split("__")
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    return record_from_dict(data, source="tiny.yaml")


@pytest.fixture
def store(tmp_path):
    return ArtifactStore(str(tmp_path / "store"))


def test_unstarted_records_may_change(store):
    check_lock(store, record())
    check_lock(store, record(hypothesis="something else"))
    assert read_lock(store, "tiny") is None


def test_lock_is_written_when_the_first_run_starts(store, tmp_path):
    lock_arm(store, record(), "baseline")
    lock = read_lock(store, "tiny")
    assert lock["frozen"]["hypothesis"] == "a change does nothing" and len(lock["frozen_hash"]) == 64
    assert lock_path(store, "tiny") == str(tmp_path / "store" / "experiments" / "tiny" / "LOCK.json")
    assert (tmp_path / "store" / "experiments" / "tiny" / "locks" / "baseline.json").exists()
    check_lock(store, record())  # the same record passes


def unlock(store, name="tiny"):
    """Delete the lock files, as a user could: what is left of the freeze is in the runs."""
    root = Path(experiment_dir(store, name))
    (root / "LOCK.json").unlink()
    shutil.rmtree(root / "locks")


def commit_run(store, rec, arm, budget, seed, *, loss=2.0, stamped=True, pointer=True, version=None):
    """A committed run artifact as ``materialize_run`` leaves it (run.json stamped with ``rec``), without training."""
    key = partition_key(arm, budget, seed)
    row = {"arm": arm, "budget": budget, "seed": seed, "flops": budget, "steps": 10, "seconds": 0.0, "validation_loss": loss}
    if stamped:
        row[STAMP_KEY] = run_stamp(rec, arm)
    version = version or compute_version(runs_key(rec.name), "test", {"row": row}, key, {})

    def write(out):
        Path(out, "run.json").write_text(json.dumps(row))
        return {"validation_loss": loss}

    ref = store.materialize(runs_key(rec.name), key, version, write, {"config": {}}).ref
    if pointer:
        store.write_pointer(ref)
    return row


# One edit per frozen field: (field path for record(), new value, the field the refusal names).
FROZEN_EDITS = [
    ("hypothesis", "a change helps", "hypothesis"),
    ("criterion__statement", "wider_lr wins", "criterion"),
    ("criterion__checks", [{"arm": "wider_lr", "ci_low_above": 1.0}], "criterion"),
    ("baseline__config__batch_size", 8, "baseline"),
    ("budgets", [1e7, 2e7, 8e7], "budgets"),
    ("seeds", [0, 1, 2], "seeds"),
    ("schedule", {"warmup_fraction": 0.2}, "schedule"),
    ("schedule", {"decay_fraction": 0.5}, "schedule"),
    ("validation_windows", 32, "validation_windows"),
    ("data_files", 40, "data_files"),
]
ARM_EDITS = [
    ("arms__wider_lr__change", {"schedule": {"peak_lr": 0.01}}, "change"),
    ("arms__wider_lr__seeds", [0, 1, 2], "seeds"),
    ("arms__wider_lr__expect", {"ci_high_below": 2.0}, "expect"),
]
# Not frozen: each may change after the first run (the amendments say why an edit was made).
FREE_EDITS = [
    ("links", {"issue": 15}),
    ("amendments", [{"date": "2026-11-30", "reason": "link the follow-up issue"}]),
    ("arms__new_idea", {"change": {"model": {"qk_norm": False}}}),
]


def test_the_edit_lists_cover_every_frozen_field():
    """A field added to ``frozen()`` without an edit here would be pinned by nothing."""
    assert {named for _, _, named in FROZEN_EDITS} == set(record().frozen())
    assert {named for _, _, named in ARM_EDITS} == set(record().frozen_arm("wider_lr"))


def _start(store, mode):
    """The started experiment: baseline and wider_lr locked and one run of each, lock files kept or deleted."""
    lock_arm(store, record(), "baseline")
    lock_arm(store, record(), "wider_lr")
    commit_run(store, record(), "baseline", 1e7, 0)
    commit_run(store, record(), "wider_lr", 1e7, 0)
    if mode == "runs only":
        unlock(store)


@pytest.mark.parametrize("mode", ["lock files", "runs only"])
@pytest.mark.parametrize("field,value,named", FROZEN_EDITS)
def test_each_frozen_field_edit_is_refused(store, mode, field, value, named):
    _start(store, mode)
    where = "lock .*LOCK.json" if mode == "lock files" else f"run {partition_key('baseline', 1e7, 0)}"
    with pytest.raises(
        RecordChangedError, match=rf"^tiny.yaml: experiment 'tiny' has started runs \({where}\); its {named} may no longer"
    ):
        check_lock(store, record(**{field: value}))


@pytest.mark.parametrize("mode", ["lock files", "runs only"])
@pytest.mark.parametrize("field,value,named", ARM_EDITS)
def test_each_frozen_field_of_a_started_arm_is_refused(store, mode, field, value, named):
    _start(store, mode)
    with pytest.raises(RecordChangedError, match=rf"arm 'wider_lr' has started, so its {named} may no longer change"):
        check_lock(store, record(**{field: value}))


@pytest.mark.parametrize("mode", ["lock files", "runs only"])
@pytest.mark.parametrize("field,value", FREE_EDITS)
def test_edits_to_fields_that_are_not_frozen_are_accepted(store, mode, field, value):
    _start(store, mode)
    check_lock(store, record(**{field: value}))


def test_started_arms_are_frozen_new_arms_are_not(store):
    lock_arm(store, record(), "baseline")
    lock_arm(store, record(), "wider_lr")
    with pytest.raises(RecordChangedError, match="arm 'wider_lr' has started, so its change may no longer change"):
        check_lock(store, record(arms__wider_lr__change={"schedule": {"peak_lr": 0.01}}))
    more = copy.deepcopy(RECORD)
    more["arms"]["new_idea"] = {"change": {"model": {"qk_norm": False}}}
    check_lock(store, record_from_dict(more, source="tiny.yaml"))  # adding an arm is fine


def test_amendments_are_not_frozen_but_the_edits_they_explain_still_are(store):
    lock_arm(store, record(), "baseline")
    lock_arm(store, record(), "wider_lr")
    note = [{"date": "2026-11-30", "reason": "wider_lr was inconclusive with 2 seeds"}]
    check_lock(store, record(amendments=note))  # writing the history down never breaks a lock
    assert "amendments" not in read_lock(store, "tiny")["frozen"]
    with pytest.raises(RecordChangedError, match="arm 'wider_lr' has started, so its seeds may no longer change"):
        check_lock(store, record(amendments=note, arms__wider_lr__seeds=[0, 1, 2]))


def test_started_arms_may_not_be_removed(store):
    free = copy.deepcopy(RECORD)
    free["criterion"]["checks"] = []  # so that the criterion does not change with the arms
    lock_arm(store, record_from_dict(free, source="tiny.yaml"), "wider_lr")
    fewer = copy.deepcopy(free)
    fewer["arms"] = {"other": {"change": {}}}
    with pytest.raises(RecordChangedError, match="arm 'wider_lr' has started and may not be removed"):
        check_lock(store, record_from_dict(fewer, source="tiny.yaml"))


def test_an_unstarted_arm_may_change_until_it_starts(store):
    lock_arm(store, record(), "baseline")
    changed = record(arms__wider_lr__change={"schedule": {"peak_lr": 0.01}})
    check_lock(store, changed)
    lock_arm(store, changed, "wider_lr")
    with pytest.raises(RecordChangedError, match="arm 'wider_lr'"):
        check_lock(store, record())


def test_the_screen_refuses_an_edited_record_before_running_anything(store, tmp_path):
    lock_arm(store, record(), "baseline")
    with pytest.raises(RecordChangedError, match="hypothesis may no longer change"):
        run_screen(record(hypothesis="edited after the fact"), store, log=lambda m: None)
    assert not (tmp_path / "store" / "experiments" / "corpus").exists()  # nothing ran, not even the DataKit
