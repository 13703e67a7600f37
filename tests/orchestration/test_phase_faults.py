"""A phase run killed mid-training is retried by Dagster and ends bit-identical.

The retry is what the run-retry daemon does, minus its code server: Dagster's own
``should_retry`` (instance ``run_retries`` from our dagster.yaml + the job's
``dagster/max_retries`` tag) decides, and the re-execution uses the daemon's default strategy
(``ReexecutionOptions.from_failure``) with its ``dagster/retry_number`` tag, executed
in-process with ``execute_job``. The retried version keeps its ``.work`` scratch dir, so
training resumes from its newest committed checkpoint.
"""

import dataclasses
from pathlib import Path

import dagster as dg
import numpy as np
import pytest
import yaml
from dagster._core.events import RunFailureReason
from dagster._core.execution.retries import auto_reexecution_should_retry_run
from dagster._core.storage.tags import MAX_RETRIES_TAG, RETRY_NUMBER_TAG, WILL_RETRY_TAG
from dagster._daemon.auto_run_reexecution.auto_run_reexecution import should_retry

from assets.partitions import demo_phases
from assets.training import train_phase
from marin_assets.orchestration.compat import DATA_VERSION_TAG
from marin_assets.orchestration.training_backends import LocalTrainingBackend
from marin_assets.train.checkpoints import checkpoint as ckpt
from tests.orchestration.phase_job import MIXTURE_CONFIG, byte_caches, mixture, phase_job, phase_run_config, phase_spec, resources

ROOT = Path(__file__).resolve().parents[2]


def _materialize_upstream(instance, backend):
    assert dg.materialize(
        [*byte_caches, mixture], instance=instance, resources=resources(backend), run_config=MIXTURE_CONFIG
    ).success
    instance.add_dynamic_partitions(demo_phases.name, ["kestrel"])


def _metadata(instance, run_id) -> dict:
    [event] = [
        e
        for e in instance.all_logs(run_id)
        if e.dagster_event and e.dagster_event.is_step_materialization and e.dagster_event.asset_key.path[0] == "train"
    ]  # not its checkpoints
    return {k: v.value for k, v in event.dagster_event.step_materialization_data.materialization.metadata.items()}


def _reported_checkpoints(instance) -> list[tuple[str, str]]:
    """(partition, data version) of every checkpoints/demo report, in the order they were made."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(["checkpoints", "demo"])), limit=20, ascending=True
    ).records
    return [(r.partition_key, r.asset_materialization.tags[DATA_VERSION_TAG]) for r in records]


def _final_checkpoint(artifact_path: str) -> tuple[dict, dict]:
    return ckpt.load(ckpt.latest_valid(Path(artifact_path, "data", "checkpoints")))


def _step_error(instance, run_id) -> str:
    failures = [e for e in instance.all_logs(run_id) if e.dagster_event and e.dagster_event.is_step_failure]
    err = failures[0].dagster_event.step_failure_data.error
    parts = []
    while err is not None:
        parts.append(err.message)
        err = err.cause
    return "\n".join(parts)


@pytest.mark.slow
def test_a_killed_phase_is_retried_and_ends_bit_identical(tmp_path, monkeypatch):
    config = phase_run_config(dataclasses.asdict(phase_spec("kestrel", 8)))
    recon = dg.reconstructable(phase_job)

    # The uninterrupted reference, in a store of its own.
    monkeypatch.setenv("MARIN_PREFIX", str(tmp_path / "reference"))
    reference_instance = dg.DagsterInstance.ephemeral()
    _materialize_upstream(reference_instance, LocalTrainingBackend())
    reference = dg.materialize(
        [*byte_caches, mixture, train_phase],
        selection=[train_phase],
        partition_key="kestrel",
        instance=reference_instance,
        resources=resources(LocalTrainingBackend()),
        run_config=config,
    )
    assert reference.success
    reference_meta = _metadata(reference_instance, reference.run_id)
    reference_checkpoints = _reported_checkpoints(reference_instance)  # live, as each committed

    monkeypatch.setenv("MARIN_PREFIX", str(tmp_path / "faulty"))
    run_retries = yaml.safe_load((ROOT / "dagster.yaml").read_text())["run_retries"]
    with dg.instance_for_test(overrides={"run_retries": run_retries}) as instance:
        _materialize_upstream(instance, LocalTrainingBackend())
        first = dg.execute_job(recon, instance, run_config=config, tags={"dagster/partition": "kestrel"}, raise_on_error=False)
        assert not first.success
        failed = instance.get_run_by_id(first.run_id)
        assert "simulated worker death at step 6" in _step_error(instance, first.run_id)
        # Dagster's retry policy: our instance config + the train_phase job's tag say retry ...
        assert failed.tags[MAX_RETRIES_TAG] == "2" and failed.tags[WILL_RETRY_TAG] == "true"
        assert should_retry(failed, instance)
        # ... and without the job's tag the instance default (max_retries 0) would not.
        untagged = failed.with_tags({k: v for k, v in failed.tags.items() if k != MAX_RETRIES_TAG})
        assert not auto_reexecution_should_retry_run(instance, untagged, RunFailureReason.STEP_FAILURE)
        # The killed attempt left its committed step-4 checkpoint in the version's scratch dir.
        [work] = list((tmp_path / "faulty" / "train" / "demo").glob("*/*/.work"))
        assert ckpt.load(ckpt.latest_valid(work / "checkpoints"))[1]["step"] == 4

        retry = dg.execute_job(
            recon,
            instance,
            run_config=failed.run_config,
            tags={"dagster/partition": "kestrel", RETRY_NUMBER_TAG: "1"},
            reexecution_options=dg.ReexecutionOptions.from_failure(first.run_id, instance),
        )
        assert retry.success
        assert instance.get_run_by_id(retry.run_id).parent_run_id == first.run_id
        meta = _metadata(instance, retry.run_id)
        # The killed attempt reported nothing; the retry reported its step-4 checkpoint before its own, once each,
        # and with the versions the uninterrupted run gave them.
        assert _reported_checkpoints(instance) == reference_checkpoints
    assert [key for key, _ in reference_checkpoints] == ["kestrel.000000004", "kestrel.000000008"]

    assert meta["version"] == reference_meta["version"]  # same phase, same version: a retry is not a new artifact
    assert (meta["count/final_step"], reference_meta["count/final_step"]) == (8, 8)
    assert (meta["count/steps_reported"], reference_meta["count/steps_reported"]) == (4, 8)  # resumed at step 4
    assert meta["count/recent_losses"] == reference_meta["count/recent_losses"]  # metrics.jsonl reads as one run
    arrays, ckpt_meta = _final_checkpoint(meta["path"])
    expected, expected_meta = _final_checkpoint(reference_meta["path"])
    assert ckpt_meta["step"] == expected_meta["step"] == 8
    assert sorted(arrays) == sorted(expected)
    for key in expected:
        assert arrays[key].dtype == expected[key].dtype and np.array_equal(arrays[key], expected[key]), key
    # The comparison can fail: training moved the parameters after the step-4 checkpoint.
    [step4] = [
        f for f in ckpt.list_checkpoints(Path(reference_meta["path"], "data", "checkpoints")) if ckpt.load(f)[1]["step"] == 4
    ]
    step4, _ = ckpt.load(step4)
    params = [k for k in expected if k.startswith("['params']")]
    assert params and all(not np.array_equal(step4[k], expected[k]) for k in params)
