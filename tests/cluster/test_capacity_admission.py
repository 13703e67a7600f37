"""Issue 25 item 7: capacity in the real launcher, on a fake Kubernetes API.

The production path runs here except Kubernetes itself: runs are submitted through
MarinQueuedRunCoordinator, Dagster's run queue daemon offers them to RoutingRunLauncher,
whose capacity admission (the fleet simulation's Router and reservation ledger, fed from run
storage) places them on two pools, sends a run that does not fit back to the queue, and
preempts a batch run for a production one; Dagster's run-retry daemon re-executes the
preempted run. The fake cluster plays API server and kubelet: a created Job's container
(``dagster api execute_run ...``) really runs as a process, deleting the Job kills it. Each
run trains a stand-in model from its newest checkpoint (admission_defs.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import kubernetes
import numpy as np
import pytest
from dagster._core.storage.dagster_run import DagsterRunStatus, RunsFilter
from dagster._core.storage.tags import PRIORITY_TAG as DAGSTER_PRIORITY_TAG
from dagster._core.test_utils import instance_for_test
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import PythonFileTarget
from dagster._daemon.auto_run_reexecution.auto_run_reexecution import consume_new_runs_for_automatic_reexecution
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon

from marin_assets.cluster.fleet import load_fleet
from marin_assets.cluster.tags import PLACEMENT_TAG
from marin_assets.orchestration.admission import parse_placement
from tests.cluster import admission_defs
from tests.cluster.k8s_fakes import KUBECONFIG, fake_dagster_k8s_client

DEFS_FILE = str(Path(admission_defs.__file__))
FLEET = """\
pools:
  - {name: racks, accelerator: gb200-nvl72, region: us-west4, domains: 1}
  - {name: slices, accelerator: tpu-v5e, region: us-west4, domains: 1, topology: 2x2}
"""
GB200 = {"marin/accelerator": "gb200-nvl72"}
RUNS = {  # name: (tags, seed)
    "b1": ({**GB200, "marin/chips": "64", "marin/priority": "batch"}, 1),
    "i1": ({"marin/accelerator": "tpu-v5e", "marin/chips": "4", "marin/priority": "interactive"}, 2),
    "p1": ({**GB200, "marin/chips": "16", "marin/priority": "production"}, 3),
}


class FakeKubelet:
    """BatchV1Api and CoreV1Api in one: a created Job's container runs as a local process (its
    args, its env), deleting the Job kills it (a pod's end), its status reads the process."""

    def __init__(self, logs: Path, audit):
        self.logs, self.audit = logs, audit
        self.procs: dict[str, subprocess.Popen] = {}
        self.calls: list[tuple[str, str]] = []  # (verb, job name), in order

    def create_namespaced_job(self, body, namespace, **_):
        name = body.metadata.name
        self.audit(body)  # before it starts: with it, no domain may be over-allocated
        self.calls.append(("create", name))
        [container] = body.spec.template.spec.containers
        assert container.args[:3] == ["dagster", "api", "execute_run"]
        env = {**os.environ, **{e.name: e.value for e in container.env if e.value is not None}}
        env.pop("DAGSTER_HOME", None)  # the pod's path; the instance comes in the args
        with open(self.logs / f"{name}.log", "wb") as log:
            # A session of its own, like a container: deleting the pod ends every process in it.
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", *container.args], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        return body

    def delete_namespaced_job(self, name, namespace, **_):
        self.calls.append(("delete", name))
        self._kill(self.procs[name])

    def read_namespaced_job_status(self, name, namespace, **_):
        code = self.procs[name].poll()
        status = (
            kubernetes.client.V1JobStatus(active=1)
            if code is None
            else (kubernetes.client.V1JobStatus(succeeded=1) if code == 0 else kubernetes.client.V1JobStatus(failed=1))
        )
        return kubernetes.client.V1Job(status=status)

    def list_namespaced_pod(self, namespace, label_selector=None, **_):
        return kubernetes.client.V1PodList(items=[])

    def live(self) -> list[str]:
        return [name for name, proc in self.procs.items() if proc.poll() is None]

    def log_tail(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text()[-3000:]

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        """The pod is gone: every process in it is killed (SIGKILL: past any grace period). Only a
        group whose leader has not been reaped: its id cannot belong to anyone else yet."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def close(self) -> None:
        for proc in self.procs.values():
            self._kill(proc)


class Cluster:
    """The instance, the code server, the fake cluster and the audits, for one test."""

    def __init__(self, instance, process_context, fleet, tmp: Path):
        self.instance, self.process_context, self.fleet, self.tmp = instance, process_context, fleet, tmp
        self.launcher = instance.run_launcher
        self.audits: list[dict] = []
        self.kubelet = FakeKubelet(tmp, self.audit)
        self.launcher.clusters["west"].k8s_client = fake_dagster_k8s_client(self.kubelet, self.kubelet)
        self.ids: dict[str, str] = {}

    def audit(self, new_job) -> None:
        """Chips per domain held by the live Jobs plus ``new_job``, from the placements on their runs.

        A Job holds its chips while its process lives, unless its run has succeeded: then the
        training is over (the op wrote its final arrays) and the process is only exiting."""
        used = defaultdict(int)
        for name in {*self.kubelet.live(), new_job.metadata.name}:
            run = self.instance.get_run_by_id(name.removeprefix("dagster-run-"))
            if run.status == DagsterRunStatus.SUCCESS:
                continue
            placement = parse_placement(run.tags[PLACEMENT_TAG], self.fleet, run_id=run.run_id)
            for d, c in zip(placement.domains, placement.chips, strict=True):
                used[(placement.pool, d)] += c
        self.audits.append(dict(used))

    def over_allocated(self) -> list:
        return [
            (i, key, u)
            for i, used in enumerate(self.audits)
            for key, u in used.items()
            if u > self.fleet.pool(key[0]).domain_chips
        ]

    def submit(self, name: str) -> str:
        tags, seed = RUNS[name]
        root = self.tmp / name
        root.mkdir()
        run_config = {"ops": {"train_model": {"config": {"root": str(root), "seed": seed}}}}
        workspace = self.process_context.create_request_context()
        location = workspace.get_code_location("admission")
        remote_job = location.get_repository("__repository__").get_full_job("train")
        plan = location.get_execution_plan(
            remote_job, run_config, step_keys_to_execute=None, known_state=None, instance=self.instance
        )
        run = self.instance.create_run(
            job_name="train",
            run_id=None,
            run_config=run_config,
            status=DagsterRunStatus.NOT_STARTED,
            tags=tags,
            root_run_id=None,
            parent_run_id=None,
            step_keys_to_execute=None,
            execution_plan_snapshot=plan.execution_plan_snapshot,
            job_snapshot=remote_job.job_snapshot,
            parent_job_snapshot=remote_job.parent_job_snapshot,
            asset_selection=None,
            asset_check_selection=None,
            resolved_op_selection=None,
            op_selection=None,
            remote_job_origin=remote_job.get_remote_origin(),
            job_code_origin=remote_job.get_python_origin(),
            asset_graph=workspace.asset_graph,
        )
        self.instance.submit_run(run.run_id, workspace)
        self.ids[name] = run.run_id
        return run.run_id

    def dequeue(self) -> None:
        """One pass of Dagster's run queue daemon; then the router's view must fit every domain."""
        list(QueuedRunCoordinatorDaemon(interval_seconds=1).run_iteration(self.process_context))
        for pool in self.fleet.pools:
            assert all(u <= pool.domain_chips for u in self.launcher.admission.view(pool.name)), pool.name

    def retry_failed(self) -> None:
        """One pass of Dagster's run-retry daemon over the failed runs."""
        records = self.instance.get_run_records(RunsFilter(statuses=[DagsterRunStatus.FAILURE]))
        list(consume_new_runs_for_automatic_reexecution(self.process_context, records, logging.getLogger("retry")))

    def placement(self, run_id: str) -> tuple:
        p = parse_placement(self.run(run_id).tags[PLACEMENT_TAG], self.fleet, run_id=run_id)
        return p.pool, p.domains, p.chips

    def run(self, run_id: str):
        return self.instance.get_run_by_id(run_id)

    def wait_for(self, what: str, done, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {n}\n{self.kubelet.log_tail(n)}" for n in self.kubelet.procs)
                raise AssertionError(f"timed out waiting for {what}\n{tails}")
            time.sleep(0.1)

    def held(self, name: str, run_id: str) -> bool:
        return (self.tmp / name / f"held-{run_id}").exists()

    def start_step(self, name: str, run_id: str) -> int:
        return json.loads((self.tmp / name / f"start-{run_id}.json").read_text())["start_step"]

    def release(self, name: str) -> None:
        (self.tmp / name / "release").touch()

    def messages(self, run_id: str) -> list[str]:
        return [e.message or "" for e in self.instance.all_logs(run_id)]


@pytest.fixture
def cluster(tmp_path):
    with contextlib.ExitStack() as stack:
        home = stack.enter_context(tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
        (tmp_path / "kubeconfig.yaml").write_text(KUBECONFIG)
        (tmp_path / "fleet.yaml").write_text(FLEET)
        west = {
            "name": "west",
            "kubeconfig_file": str(tmp_path / "kubeconfig.yaml"),
            "namespace": "marin",
            "job_image": "marin:test",
            "instance_config_map": "dagster-instance",
            "accelerators": ["tpu-v5e", "gb200-nvl72"],
            "regions": ["us-west4"],
        }
        overrides = {
            "run_launcher": {
                "module": "marin_assets.orchestration.launcher",
                "class": "RoutingRunLauncher",
                "config": {"clusters": [west], "unmatched": "fail", "fleet_file": str(tmp_path / "fleet.yaml")},
            },
            "run_coordinator": {"module": "marin_assets.orchestration.run_queue", "class": "MarinQueuedRunCoordinator"},
            "run_retries": {"enabled": True, "max_retries": 2},
            "event_log_storage": {
                "module": "dagster._core.storage.event_log",
                "class": "ConsolidatedSqliteEventLogStorage",
                "config": {"base_dir": str(Path(home) / "event_log")},
            },
        }
        instance = stack.enter_context(instance_for_test(overrides=overrides, temp_dir=home))
        target = PythonFileTarget(python_file=DEFS_FILE, attribute=None, working_directory=None, location_name="admission")
        process_context = stack.enter_context(WorkspaceProcessContext(instance, target))
        state = Cluster(instance, process_context, load_fleet(tmp_path / "fleet.yaml"), tmp_path)
        stack.callback(state.kubelet.close)
        yield state


@pytest.mark.slow
def test_admission_preemption_and_resume_on_two_pools(cluster):
    c = cluster
    b1, i1 = c.submit("b1"), c.submit("i1")
    assert c.run(b1).tags[DAGSTER_PRIORITY_TAG] == "0" and c.run(i1).tags[DAGSTER_PRIORITY_TAG] == "1"
    c.dequeue()  # both fit: 64 of the rack's 72 GPUs, the one slice
    assert c.placement(b1) == ("racks", (0,), (64,)) and c.placement(i1) == ("slices", (0,), (4,))
    c.wait_for("both runs mid-training", lambda: c.held("b1", b1) and c.held("i1", i1))

    # Production needs 16 GPUs where 8 are free: the batch run is terminated through Dagster
    # (its Job deleted) before the production run's Job exists, and marked failed.
    p1 = c.submit("p1")
    assert c.run(p1).tags[DAGSTER_PRIORITY_TAG] == "2"
    c.dequeue()
    assert c.run(b1).status == DagsterRunStatus.FAILURE
    assert any(f"preempted by production run {p1}" in m for m in c.messages(b1))
    assert c.kubelet.calls[-2:] == [("delete", f"dagster-run-{b1}"), ("create", f"dagster-run-{p1}")]
    assert c.placement(p1) == ("racks", (0,), (16,))
    assert c.run(i1).status == DagsterRunStatus.STARTED  # another pool: untouched

    # Dagster's run retries re-execute it; the retry waits in the queue (56 GPUs free, it
    # needs 64, and batch evicts nothing), holding no Job.
    c.retry_failed()
    [retry] = c.instance.get_runs(RunsFilter(tags={"dagster/parent_run_id": b1}))
    assert retry.status == DagsterRunStatus.QUEUED and retry.tags[PLACEMENT_TAG] == ""
    calls = len(c.kubelet.calls)
    c.dequeue()
    c.dequeue()
    assert c.run(retry.run_id).status == DagsterRunStatus.QUEUED and len(c.kubelet.calls) == calls
    waits = [m for m in c.messages(retry.run_id) if "waits in the queue: 64 x gb200-nvl72 does not fit in pool racks" in m]
    assert len(waits) == 1  # said once, not on every pass

    # The production run ends: the retry takes the rack and resumes from the victim's checkpoint.
    c.release("p1")
    c.wait_for("p1 to succeed", lambda: c.run(p1).status == DagsterRunStatus.SUCCESS)
    c.dequeue()
    assert c.placement(retry.run_id) == ("racks", (0,), (64,))
    c.release("b1")
    c.release("i1")
    for run_id in (retry.run_id, i1):
        c.wait_for(f"run {run_id} to succeed", lambda r=run_id: c.run(r).status == DagsterRunStatus.SUCCESS)

    assert c.over_allocated() == [] and len(c.audits) == 4  # checked at each of the 4 Job creations
    assert c.start_step("b1", b1) == 0 and c.start_step("b1", retry.run_id) == 8  # resumed from its checkpoint
    for name, (_, seed) in RUNS.items():
        with np.load(c.tmp / name / "final.npz") as final:
            expected = admission_defs.reference(seed, 24)
            assert int(final["step"]) == 24
            assert all(np.array_equal(final[k], expected[k]) for k in ("w", "m")), name
