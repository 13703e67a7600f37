"""Training backends inside real Dagster materialisations.

The processes backend starts real worker processes. Until helper H9's
``marin_assets.train.distributed.worker`` lands, they run ``standin_worker.py`` (same contract: spec
file, manifest environment, Pipes from process 0) instead of training. The Kubernetes
backend runs against a recording fake API (see test_kubernetes_backend.py).
"""

import json
import os
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from marin_assets.orchestration.training_backends import (
    LocalTrainingBackend,
    ProcessesTrainingBackend,
    TrainOutcome,
    TrainSpec,
    outcome_from_report,
)
from marin_assets.train.config import config_from_dict
from tests.orchestration.training_backend_helpers import materialize_with, step_error_text, tiny_spec
from tests.support.caches import stdlib_paragraphs, write_cache
from tests.support.configs import BACKEND_TRAIN

STANDIN = [sys.executable, str(Path(__file__).with_name("standin_worker.py"))]


def _log_messages(instance, result) -> list[str]:
    return [e.user_message for e in instance.all_logs(result.run_id)]


def _metadata(result) -> dict:
    [mat] = result.asset_materializations_for_node("phase")
    return {k: getattr(v, "value", v) for k, v in mat.metadata.items()}


def test_processes_backend_runs_two_workers_and_reports_through_pipes(tmp_path):
    backend = ProcessesTrainingBackend(processes=2, devices_per_process=2, worker_command=STANDIN, timeout_s=120)
    instance = dg.DagsterInstance.ephemeral()
    result = materialize_with(backend, tiny_spec(tmp_path / "out"), instance=instance)
    assert result.success
    meta = _metadata(result)
    assert meta["backend"] == "processes(2)"
    assert (meta["final_step"], meta["tokens_trained"], meta["phase_start_step"]) == (5, 5 * 512, 0)
    assert meta["last_loss"] == pytest.approx(4.6)
    assert meta["guard_events"] == {"skipped_spike": 0, "grad_clipped": 2}
    assert meta["steps_reported"] == 5
    seen = [json.loads((tmp_path / "out" / f"process-{i}.json").read_text()) for i in range(2)]
    coordinators = {s["args"]["coordinator_address"] for s in seen}
    assert len(coordinators) == 1 and coordinators.pop().startswith("127.0.0.1:")
    assert [s["args"]["process_id"] for s in seen] == [0, 1]
    assert all(s["args"]["num_processes"] == 2 and s["devices_per_process"] == "2" for s in seen)
    assert seen[0]["spec_keys"] == [
        "allow_tokenizer_change",
        "budget_file",
        "caches",
        "config",
        "out_dir",
        "resume",
        "telemetry_root",
        "telemetry_run",
        "warm_start",
    ]
    assert seen[0]["num_steps"] == 5
    # Process 0's Pipes log line reached the step's log.
    assert "standin: 2 processes, 5 steps" in _log_messages(instance, result)


@pytest.mark.slow
def test_processes_backend_forms_a_real_jax_distributed_job(tmp_path, monkeypatch):
    """2 processes x 2 CPU devices join over gloo: every process sees 4 devices and 2 peers."""
    monkeypatch.setenv("STANDIN_JAX", "1")
    backend = ProcessesTrainingBackend(processes=2, devices_per_process=2, worker_command=STANDIN, timeout_s=240)
    assert materialize_with(backend, tiny_spec(tmp_path / "out")).success
    for i in range(2):
        seen = json.loads((tmp_path / "out" / f"process-{i}.json").read_text())
        assert seen["jax"] == 2 * 1000 + 4  # allgather over 2 processes, 4 global devices


def test_a_failed_process_fails_the_step_with_its_last_lines(tmp_path, monkeypatch):
    monkeypatch.setenv("STANDIN_FAIL_PROCESS", "1")
    backend = ProcessesTrainingBackend(processes=2, worker_command=STANDIN, timeout_s=120, log_tail_lines=5)
    result = materialize_with(backend, tiny_spec(tmp_path / "out"), raise_on_error=False)
    assert not result.success
    text = step_error_text(result)
    assert "worker process 1 exited with code 3" in text
    assert "standin process 1: simulated crash" in text
    assert "line 59" in text and "line 55" not in text  # the last 5 lines, not the whole log


def test_a_sigkilled_process_stops_its_hung_peers_in_bounded_time(tmp_path, monkeypatch):
    """kill -9 of one worker: the step fails at once and the peer stuck in a collective is stopped."""
    monkeypatch.setenv("STANDIN_SIGKILL_PROCESS", "1")
    backend = ProcessesTrainingBackend(processes=2, worker_command=STANDIN, timeout_s=300, kill_grace_s=2)
    started = time.monotonic()
    result = materialize_with(backend, tiny_spec(tmp_path / "out"), raise_on_error=False)
    elapsed = time.monotonic() - started
    assert "worker process 1 exited with code -9" in step_error_text(result)
    assert elapsed < 60, elapsed  # far below timeout_s: the dead process was noticed, not waited out
    peer = json.loads((tmp_path / "out" / "process-0.json").read_text())  # process 0 had started and hung
    assert peer["args"]["process_id"] == 0
    with pytest.raises(ProcessLookupError):  # the hung peer was stopped and reaped, not left behind
        os.kill(peer["pid"], 0)


def test_workers_that_report_nothing_fail_the_step(tmp_path, monkeypatch):
    monkeypatch.setenv("STANDIN_NO_REPORT", "1")
    backend = ProcessesTrainingBackend(processes=1, worker_command=STANDIN, timeout_s=120)
    result = materialize_with(backend, tiny_spec(tmp_path / "out"), raise_on_error=False)
    assert not result.success
    assert "sent 0 final reports (expected 1)" in step_error_text(result)


def test_a_hung_worker_is_stopped_at_the_timeout(tmp_path):
    hang = [sys.executable, "-c", "import time; time.sleep(600)"]
    backend = ProcessesTrainingBackend(processes=2, worker_command=hang, timeout_s=1.0, kill_grace_s=1.0)
    result = materialize_with(backend, tiny_spec(tmp_path / "out"), raise_on_error=False)
    assert "still running after 1s" in step_error_text(result)


@pytest.mark.slow
def test_local_backend_trains_in_process(tmp_path):
    """Today's path through the same interface: a real 3-step run, outcome from the loop."""
    write_cache(tmp_path / "license", stdlib_paragraphs(limit=200))
    spec = TrainSpec(
        config_from_dict(dict(BACKEND_TRAIN, num_steps=3), "tiny"), {"license": str(tmp_path / "license")}, str(tmp_path / "out")
    )
    result = materialize_with(LocalTrainingBackend(log_every_steps=1), spec)
    meta = {k: getattr(v, "value", v) for k, v in result.asset_materializations_for_node("phase")[0].metadata.items()}
    assert meta["backend"] == "local" and meta["final_step"] == 3 and meta["steps_reported"] == 3
    assert meta["tokens_trained"] == 3 * 4 * 16 and 0 < meta["last_loss"] < 10
    assert (tmp_path / "out" / "metrics.jsonl").exists()


def test_backend_settings_are_checked():
    with pytest.raises(ValueError, match="processes: 0"):
        ProcessesTrainingBackend(processes=0)._check()
    with pytest.raises(ValueError, match="never a shell string"):
        ProcessesTrainingBackend(worker_command=[])._check()
    with pytest.raises(ValueError, match="spec.caches is empty: it names no cache"):
        tiny_spec("/tmp/x", caches={})


def test_outcome_report_is_validated():
    good = {
        "final_step": 5,
        "tokens": 10,
        "phase_start_step": 0,
        "last_loss": 1.5,
        "tokens_left": {"a": 1},
        "counts": {"grad_clipped": 0},
    }
    out = outcome_from_report("b", good, [{"metrics": {"step": 1, "loss": 2.0}}, {"metrics": {"step": 0, "loss": 3.0}}])
    assert [r["step"] for r in out.metrics] == [0, 1]
    with pytest.raises(ValueError, match=r"lacks \['counts'\]"):
        outcome_from_report("b", {k: v for k, v in good.items() if k != "counts"}, [])
    with pytest.raises(ValueError, match="last_loss"):
        outcome_from_report("b", {**good, "last_loss": float("nan")}, [])
    with pytest.raises(ValueError, match="final_step"):
        outcome_from_report("b", {**good, "final_step": -1}, [])
    with pytest.raises(ValueError, match="phase_start_step 6 > final_step 5"):
        outcome_from_report("b", {**good, "phase_start_step": 6}, [])
    with pytest.raises(ValueError, match="metrics message 0"):
        outcome_from_report("b", good, [{"metrics": {"step": "1", "loss": 2.0}}])
    with pytest.raises(ValueError, match="tokens_left"):
        TrainOutcome("b", 1, 1, 0, None, {"a": 1.5}, {})
