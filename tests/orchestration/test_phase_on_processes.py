"""The train/demo phase on the processes backend (the real worker, chosen through
MARIN_TRAINING_BACKEND) ends where the in-process backend does, to the bit."""

import dataclasses

import dagster as dg
import numpy as np
import pytest

from assets.partitions import demo_phases
from assets.training import train_phase
from marin_assets.orchestration.resources import training_backend_from_env
from tests.orchestration.phase_job import MIXTURE_CONFIG, byte_caches, mixture, phase_run_config, phase_spec, resources
from tests.orchestration.test_phase_faults import _final_checkpoint


def _train(tmp_path, monkeypatch, name: str, backend) -> dict:
    monkeypatch.setenv("MARIN_PREFIX", str(tmp_path / name))
    instance = dg.DagsterInstance.ephemeral()
    assert dg.materialize(
        [*byte_caches, mixture], instance=instance, resources=resources(backend), run_config=MIXTURE_CONFIG
    ).success
    instance.add_dynamic_partitions(demo_phases.name, ["kestrel"])
    result = dg.materialize(
        [*byte_caches, mixture, train_phase],
        selection=[train_phase],
        partition_key="kestrel",
        instance=instance,
        resources=resources(backend),
        run_config=phase_run_config(dataclasses.asdict(phase_spec("kestrel", 8))),
    )
    assert result.success
    [event] = [e for e in result.get_asset_materialization_events() if e.asset_key.path[0] == "train"]  # not its checkpoints
    return {k: v.value for k, v in event.materialization.metadata.items()}


@pytest.mark.slow
def test_processes_backend_matches_local_to_the_bit(tmp_path, monkeypatch):
    local = _train(tmp_path, monkeypatch, "local", training_backend_from_env({}))
    backend = training_backend_from_env({"MARIN_TRAINING_BACKEND": "processes", "MARIN_TRAIN_PROCESSES": "1"})
    worker = _train(tmp_path, monkeypatch, "processes", backend)
    assert (local["count/backend"], worker["count/backend"]) == ("local", "processes(1)")
    assert worker["version"] == local["version"]  # where it ran is not part of what it is
    for key in (
        "final_step",
        "tokens_trained",
        "phase_tokens",
        "tokens_consumed",
        "tokens_available",
        "guard_events",
        "steps_reported",
        "recent_losses",
        "last_loss",
    ):
        assert worker[f"count/{key}"] == local[f"count/{key}"], key
    arrays, meta = _final_checkpoint(worker["path"])
    expected, _ = _final_checkpoint(local["path"])
    assert meta["step"] == 8 and sorted(arrays) == sorted(expected)
    assert all(np.array_equal(arrays[k], expected[k]) for k in expected)
