"""Started experiments are immutable: edits to frozen fields are refused, new arms are not."""

from __future__ import annotations

import copy

import pytest

from marin_assets.experiments.lock import RecordChangedError, check_lock, lock_arm, lock_path, read_lock
from marin_assets.experiments.record import record_from_dict
from marin_assets.experiments.screen import run_screen
from marin_assets.store import ArtifactStore

from test_record import RECORD


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


@pytest.mark.parametrize("field,value,named", [
    ("hypothesis", "a change helps", "hypothesis"),
    ("criterion__statement", "wider_lr wins", "criterion"),
    ("criterion__checks", [{"arm": "wider_lr", "ci_low_above": 1.0}], "criterion"),
    ("budgets", [1e7, 2e7, 8e7], "budgets"),
    ("seeds", [0, 1, 2], "seeds"),
    ("baseline__config__batch_size", 8, "baseline"),
])
def test_edits_to_frozen_fields_are_refused(store, field, value, named):
    lock_arm(store, record(), "baseline")
    with pytest.raises(RecordChangedError, match=rf"tiny.yaml: experiment 'tiny' has started runs .*its {named}"):
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
    assert not (tmp_path / "store" / "experiments" / "stdlib_bytes").exists()  # nothing ran
