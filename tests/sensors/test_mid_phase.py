"""The controller's live view of a running phase, and the local terminate that reaches it."""

import socket
import subprocess
import sys

import dagster as dg
import pytest
from dagster._core.storage.dagster_run import DagsterRun, DagsterRunStatus

from assets.training import DEMO_PLAN
from marin_assets.orchestration.launcher import HOST_TAG, PID_TAG, RoutingRunLauncher, terminate_in_process_run
from marin_assets.phases.controller import ControllerState, PhaseEntry
from marin_assets.phases.decide import end_phase_now
from marin_assets.phases.observe import live_view
from marin_assets.telemetry import TelemetryStore, TelemetryWriter
from marin_assets.train.budget import Budget
from sensors.run_view import read_live


def test_the_live_view_reads_the_running_phase_and_skips_an_earlier_attempt(tmp_path):
    root = str(tmp_path / "telemetry")
    with TelemetryWriter(root, "demo-kestrel") as old:  # attempt 0, rolled back
        for step in range(1, 9):
            old.log(step, {"tokens": 512 * step, "loss": 9.0}, time=1000.0 + step)
    with TelemetryWriter(root, "demo-kestrel") as new:  # attempt 1, running now
        for step in range(1, 6):
            new.log(step, {"tokens": 512 * step, "loss": 3.0 - 0.1 * step}, time=2000.0 + step)
    live = read_live(TelemetryStore(root), "demo-kestrel", since=2000.0, window=32)
    assert live is not None and (live.step, live.tokens_trained) == (5, 5 * 512)
    assert live.losses == pytest.approx([2.9, 2.8, 2.7, 2.6, 2.5])  # attempt 0's steps 6-8 are gone
    kestrel = ControllerState(phases=(PhaseEntry(DEMO_PLAN.first, "demo-0-kestrel-0"),))
    state, signals = live_view(kestrel, live, Budget(budget_tokens=4 * 512, hardware_available=("cpu",)))
    assert (state.step, state.tokens_trained, state.phase_tokens) == (5, 5 * 512, 5 * 512)
    assert signals.budget_tokens == 4 * 512
    # the budget is already below what kestrel (48 steps) needs: end it
    assert end_phase_now(DEMO_PLAN, state, signals).startswith("budget cut at step 5 to 2,048 tokens")
    assert read_live(TelemetryStore(root), "demo-jellyfish", since=None, window=32) is None


def _started_run(instance, tags):
    run = DagsterRun(job_name="train_phase", run_id=f"r{len(instance.get_runs())}", tags=tags, status=DagsterRunStatus.STARTED)
    instance.add_run(run)
    return run


SLEEPER = """
import signal, time
# A child inherits its parent thread's blocked signals and ignored ones across exec; this test
# is about who gets the SIGTERM, so the stand-in run process takes it the default way.
signal.pthread_sigmask(signal.SIG_SETMASK, [])
signal.signal(signal.SIGTERM, signal.SIG_DFL)
print("ready", flush=True)
time.sleep(60)
"""


def _signal_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as f:
            return " ".join(line.strip() for line in f if line.startswith(("State", "SigBlk", "SigIgn", "SigPnd", "ShdPnd")))
    except OSError as err:
        return str(err)


def test_local_terminate_sends_sigterm_to_the_tagged_process_on_this_host_only():
    child = subprocess.Popen([sys.executable, "-c", SLEEPER], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    try:
        with dg.instance_for_test(
            overrides={
                "run_launcher": {
                    "module": "marin_assets.orchestration.launcher",
                    "class": "RoutingRunLauncher",
                    "config": {"local": {"accelerators": ["cpu"]}, "unmatched": "local"},
                }
            }
        ) as instance:
            launcher = instance.run_launcher
            assert isinstance(launcher, RoutingRunLauncher)
            elsewhere = _started_run(instance, {PID_TAG: str(child.pid), HOST_TAG: "another-host"})
            assert launcher.terminate(elsewhere.run_id) is False
            assert (
                terminate_in_process_run(instance, _started_run(instance, {PID_TAG: "x", HOST_TAG: socket.gethostname()}))
                is False
            )
            assert child.poll() is None
            here = _started_run(instance, {PID_TAG: str(child.pid), HOST_TAG: socket.gethostname()})
            assert instance.run_coordinator.cancel_run(here.run_id) is True
            try:
                assert child.wait(timeout=10) == -15  # SIGTERM
            except subprocess.TimeoutExpired:
                pytest.fail(f"the run process outlived SIGTERM: {_signal_state(child.pid)}")
            assert instance.get_run_by_id(here.run_id).status == DagsterRunStatus.CANCELING
            assert instance.get_run_by_id(elsewhere.run_id).status == DagsterRunStatus.STARTED
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
