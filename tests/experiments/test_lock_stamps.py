"""The freeze lives in the runs too: deleting or blanking LOCK.json unfreezes nothing.

Run artifacts are built directly (``commit_run``): no training here.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from marin_assets.cli import main
from marin_assets.experiments.analysis import analyze
from marin_assets.experiments.data import Corpus
from marin_assets.experiments.lock import (
    STAMP_KEY,
    LockFileError,
    RecordChangedError,
    arm_lock_path,
    check_lock,
    lock_arm,
    lock_path,
    read_lock,
    run_stamp,
)
from marin_assets.experiments.runs import materialize_run, partition_key, run_spec, run_version, runs_key
from marin_assets.store import ArtifactStore
from tests.experiments.test_lock import commit_run, record, unlock
from tests.experiments.test_record import RECORD
from tests.support.byte_tokens import VOCAB_SIZE


@pytest.fixture
def store(tmp_path):
    return ArtifactStore(str(tmp_path / "store"))


def _started(store):
    """Every run of the tiny record committed under it (losses on one power law), lock files written."""
    rec = record()
    lock_arm(store, rec, "baseline")
    lock_arm(store, rec, "wider_lr")
    return [
        commit_run(store, rec, arm.name, b, s, loss=2.0 + 40.0 * b**-0.2 + 0.002 * s)
        for arm in rec.all_arms()
        for b in rec.budgets
        for s in arm.seeds
    ]


def test_deleting_the_lock_files_does_not_unfreeze_the_record(store):
    rows = _started(store)
    unlock(store)
    edited = record(hypothesis="wider_lr helps")
    with pytest.raises(RecordChangedError, match=r"has started runs \(run baseline-C1e07-s0\); its hypothesis may"):
        check_lock(store, edited)
    # The rows themselves refuse to be reported under the edited record (the probe: old results, new text).
    with pytest.raises(RecordChangedError, match="its hypothesis may no longer change"):
        analyze(edited, rows)
    assert analyze(record(), rows)["experiment"] == "tiny"  # the record they ran under is reported


def test_orphaned_runs_still_hold_the_freeze_when_the_budgets_move(store):
    """Changing the budgets leaves no run of the new plan cached; the old runs still refuse the edit."""
    _started(store)
    unlock(store)
    with pytest.raises(RecordChangedError, match="its budgets, criterion may no longer change"):
        check_lock(store, record(budgets=[1e7, 2e7, 8e7], criterion__statement="moved after the results"))


def test_a_forged_lock_file_does_not_override_the_run_stamps(store):
    _started(store)
    edited = record(criterion__checks=[{"arm": "wider_lr", "ci_low_above": 1.0}])
    frozen = edited.frozen()
    forged = {"experiment": "tiny", "frozen": frozen, "frozen_hash": run_stamp(edited, "baseline")["frozen_hash"]}
    Path(lock_path(store, "tiny")).write_text(json.dumps(forged))
    with pytest.raises(RecordChangedError, match=r"\(run baseline-C1e07-s0\); its criterion may no longer change"):
        check_lock(store, edited)


def test_started_arm_edits_are_refused_by_the_runs_when_its_lock_is_gone(store):
    _started(store)
    Path(arm_lock_path(store, "tiny", "wider_lr")).unlink()
    with pytest.raises(RecordChangedError, match="arm 'wider_lr' has started, so its expect may no longer change"):
        check_lock(store, record(arms__wider_lr__expect={"ci_high_below": 2.0}))


def test_a_started_arm_removed_is_refused_by_its_runs(store):
    free = record(criterion__checks=[])  # so that the criterion does not change with the arms
    lock_arm(store, free, "wider_lr")
    commit_run(store, free, "wider_lr", 1e7, 0)
    unlock(store)
    with pytest.raises(RecordChangedError, match=r"\(run wider_lr-C1e07-s0\); arm 'wider_lr' has started and may not"):
        check_lock(store, record(arms={"other": {"change": {}}}, criterion__checks=[]))


@pytest.mark.parametrize(
    "text, needle",
    [
        ("null", "holds null, not a lock"),
        ("{}", "not the lock of experiment 'tiny'"),
        ("[]", "not the lock of experiment 'tiny'"),
        ('{"experiment": "tiny", "frozen": {}, "frozen_hash": "0"}', "not the lock of experiment 'tiny'"),
        ("{not json", "not JSON"),
        ("", "not JSON"),
    ],
)
def test_a_corrupt_lock_file_is_one_clear_line(store, text, needle):
    _started(store)
    path = lock_path(store, "tiny")
    Path(path).write_text(text)
    for check in (lambda: check_lock(store, record()), lambda: read_lock(store, "tiny")):
        with pytest.raises(LockFileError) as err:
            check()
        message = str(err.value)
        assert message.startswith(f"{path}: ") and needle in message and "\n" not in message


@pytest.mark.parametrize("text", ["null", "{}", '{"arm": "other", "frozen": {}, "hash": "x"}'])
def test_a_corrupt_arm_lock_is_one_clear_line(store, text):
    _started(store)
    path = arm_lock_path(store, "tiny", "wider_lr")
    Path(path).write_text(text)
    with pytest.raises(LockFileError, match=rf"^{path}: (holds null|not the lock of arm 'wider_lr')"):
        check_lock(store, record())


@pytest.mark.parametrize(
    "damage",
    [
        lambda stamp: stamp.pop("arm_hash"),
        lambda stamp: stamp.update(frozen_hash="not a hash"),
        lambda stamp: stamp.update(experiment="other"),
        lambda stamp: stamp.update(frozen=None),
    ],
)
def test_a_damaged_run_stamp_is_refused(store, damage):
    rows = _started(store)
    damage(rows[0][STAMP_KEY])
    with pytest.raises(LockFileError, match=r"^run baseline at budget 1e\+07, seed 0: its 'lock' stamp is not one marin"):
        analyze(record(), rows)


def test_runs_from_before_stamps_keep_their_lock_file_and_refuse_without_it(store):
    rec = record()
    lock_arm(store, rec, "baseline")
    commit_run(store, rec, "baseline", 1e7, 0, stamped=False)
    check_lock(store, rec)  # LOCK.json still holds their freeze
    with pytest.raises(RecordChangedError, match="its hypothesis may no longer change"):
        check_lock(store, record(hypothesis="edited"))
    unlock(store)
    with pytest.raises(LockFileError, match=r"LOCK.json is missing and 1 committed run\(s\) .* predate run stamps"):
        check_lock(store, rec)


def test_the_next_run_start_rebuilds_a_deleted_lock_from_the_checked_record(store):
    _started(store)
    before = read_lock(store, "tiny")
    unlock(store)
    lock_arm(store, record(links={"issue": 99}), "wider_lr")  # a free edit; the runs agree with the rest
    assert read_lock(store, "tiny") == before
    assert Path(arm_lock_path(store, "tiny", "wider_lr")).exists()


def test_unstarted_experiments_and_arms_are_still_free(store):
    check_lock(store, record(hypothesis="anything"))  # no runs, no lock
    lock_arm(store, record(), "baseline")
    commit_run(store, record(), "baseline", 1e7, 0)
    unlock(store)
    check_lock(store, record(arms__wider_lr__change={"schedule": {"peak_lr": 0.01}}))  # wider_lr has no run


def _fake_corpus(tmp_path) -> Corpus:
    """A corpus that is never read (no training here): its version is what the runs hash."""
    return Corpus(str(tmp_path / "corpus" / "dataset.json"), "c" * 64, 0, 0, VOCAB_SIZE, str(tmp_path / "corpus"))


def test_a_cached_run_the_pointer_does_not_name_is_still_checked(store, tmp_path):
    """materialize_run checks the row it returns: a cache hit made under other frozen fields is refused, unpointed."""
    rec, corpus = record(), _fake_corpus(tmp_path)
    spec = run_spec(rec, "baseline", 4e7, 0, VOCAB_SIZE)  # 13 steps: the smallest budget of the record with >= 10
    lock_arm(store, rec, "baseline")
    commit_run(store, rec, "baseline", 4e7, 0, pointer=False, version=run_version(spec, rec, corpus.version))
    unlock(store)
    edited = record(hypothesis="edited after the results")
    with pytest.raises(RecordChangedError, match="its hypothesis may no longer change"):
        materialize_run(store, edited, run_spec(edited, "baseline", 4e7, 0, VOCAB_SIZE), corpus, log=lambda m: None)
    assert store.read_pointer(runs_key("tiny"), partition_key("baseline", 4e7, 0)) is None


def test_a_computed_run_keeps_the_stamp_of_its_record(store, tmp_path, monkeypatch):
    """The real execute_run path, with training and scoring replaced by fakes (no jax work)."""
    import marin_assets.experiments.runs as runs
    import marin_assets.train.loop as loop

    def fake_train(config, caches, out_dir, resume):
        Path(out_dir, "metrics.jsonl").write_text('{"step": 1}\n')
        return SimpleNamespace(final_step=config.num_steps, checkpoint_dir=Path(out_dir), tokens=640, last_loss=3.0, counts={})

    monkeypatch.setattr(loop, "train", fake_train)
    monkeypatch.setattr(runs, "validation_loss", lambda *args: 2.5)
    rec, corpus = record(), _fake_corpus(tmp_path)
    row, hit = materialize_run(store, rec, run_spec(rec, "wider_lr", 4e7, 0, VOCAB_SIZE), corpus, log=lambda m: None)
    assert not hit and row[STAMP_KEY] == run_stamp(rec, "wider_lr") and row["validation_loss"] == 2.5
    assert row["corpus"] == {"index": corpus.index, "version": corpus.version}
    unlock(store)
    with pytest.raises(RecordChangedError, match=r"\(run wider_lr-C4e07-s0\); arm 'wider_lr' has started, so its seeds"):
        check_lock(store, record(arms__wider_lr__seeds=[0, 1, 2]))


def test_the_cli_reports_an_empty_lock_file_in_one_line(store, tmp_path, capsys):
    """The probe: `{}` in LOCK.json was a KeyError traceback."""
    _started(store)
    Path(lock_path(store, "tiny")).write_text("{}")
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(RECORD))
    assert main(["experiment", "screen", str(path), "--store", store.prefix]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"marin experiment screen: {lock_path(store, 'tiny')}: not the lock of experiment 'tiny'")
