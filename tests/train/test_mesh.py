"""The ("data", "expert") training mesh: 1 x 1, 1 x 4 and 2 processes x 2 devices agree;
a killed peer fails the survivor in bounded time; env parsing and shardings."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from marin_assets.train import mesh as meshlib

ROOT = Path(__file__).resolve().parents[2]
CHECK = "tests.train.mesh_check"  # run as a module from ROOT (launch_argv: cwd and PYTHONPATH)
STEPS = 20
PROC_TIMEOUT_S = 900  # a few compiles; generous for a loaded 2-core CI machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JAX_COORDINATOR", "JAX_NUM_PROCESSES", "JOB_COMPLETION", "MARIN_"))}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", **extra)
    return env


def launch_argv(n_processes: int, devices: int, argv: list[str], **env_extra) -> list[subprocess.Popen]:
    """``n_processes`` copies of ``argv`` with the manifests' environment, on this host."""
    port = free_port()
    procs = []
    for pid in range(n_processes):
        env = base_env(**env_extra)
        if n_processes > 1:
            env.update(meshlib.local_env(pid, n_processes, port, devices))
        else:
            env["MARIN_DEVICES_PER_PROCESS"] = str(devices)
        procs.append(subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    return procs


def launch(n_processes: int, devices: int, args: list[str], **env_extra) -> list[subprocess.Popen]:
    """The step-level harness (mesh_check.py) on ``n_processes`` x ``devices``."""
    return launch_argv(n_processes, devices, [sys.executable, "-m", CHECK, *args], **env_extra)


def finish(procs: list[subprocess.Popen], timeout: float) -> None:
    """Wait for all; on a timeout or a failure, kill the rest and fail with their stderr."""
    deadline = time.monotonic() + timeout
    try:
        outs = [p.communicate(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{name: per-transport results, final params} for the three layouts, 20 steps each."""
    root = tmp_path_factory.mktemp("mesh")
    layouts = {"1x1": (1, 1, 1, []), "1x4": (1, 4, 4, []), "2x2": (2, 2, 2, ["--bad-rows"])}
    out = {}
    for name, (n_proc, devices, expert, extra) in layouts.items():
        path = root / f"{name}.json"
        finish(launch(n_proc, devices, ["--steps", str(STEPS), "--expert", str(expert), "--out", str(path),
                                        *extra]), PROC_TIMEOUT_S)
        result = json.loads(path.read_text())
        for transport in ("ragged", "pooled"):
            with np.load(f"{path}.{transport}.npz") as z:
                result[transport]["params"] = {k: z[k] for k in z.files}
        out[name] = result
    return out


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["ragged", "pooled"])
def test_meshes_give_the_same_losses_and_params(runs, transport):
    ref = runs["1x1"][transport]
    assert ref["mesh"] == {"data": 1, "expert": 1}
    assert runs["1x4"][transport]["mesh"] == {"data": 1, "expert": 4}
    two = runs["2x2"][transport]
    assert two["mesh"] == {"data": 2, "expert": 2} and two["processes"] == 2 and two["devices"] == 4
    assert two["rows"] == [0, 4]  # process 0 read only its half of each batch
    ref_losses = np.array(ref["losses"])
    assert len(ref_losses) == STEPS and np.all(np.isfinite(ref_losses))
    assert ref_losses[-1] < ref_losses[0]  # it trains
    report = {}
    for name in ("1x4", "2x2"):
        r = runs[name][transport]
        assert r["dropped"] == [0] * STEPS  # capacity large enough that nothing drops
        diff = np.abs(np.array(r["losses"]) - ref_losses)
        report[name] = diff.tolist()
        assert diff[0] <= 1e-6, (name, diff[0])
        assert np.max(diff[1:]) <= 1e-4, (name, diff.tolist())
        param_diff = max(float(np.max(np.abs(r["params"][k] - ref["params"][k]))) for k in ref["params"])
        assert param_diff < 1e-4, (name, param_diff)
    print(json.dumps({"transport": transport, "max_loss_diff_per_step": report}))


@pytest.mark.slow
def test_processes_agree_on_host_values(runs):
    assert runs["2x2"]["agree"] == {"process0_value": 7, "all_true": True, "one_false": False}
    assert runs["1x1"]["agree"] == {"process0_value": 7, "all_true": True, "one_false": True}


@pytest.mark.slow
def test_a_wrong_batch_slice_is_caught(runs):
    """Negative control: both processes reading rows [0, 4) changes the loss by far more
    than the tolerance above."""
    for transport in ("ragged", "pooled"):
        good = runs["2x2"][transport]["losses"][0]
        assert abs(runs["2x2"][transport]["bad_rows_loss0"] - good) > 1e-3


@pytest.mark.slow
def test_killing_one_worker_fails_the_other_within_60s():
    procs = launch(2, 2, ["--forever", "--expert", "2"], MARIN_HEARTBEAT_TIMEOUT_S="10")
    try:
        deadline = time.monotonic() + PROC_TIMEOUT_S
        lines = 0
        while lines < 3:  # both are stepping (each step is a collective across them)
            assert time.monotonic() < deadline and procs[0].poll() is None, "workers never started stepping"
            if '"step"' in procs[1].stdout.readline():
                lines += 1
        procs[1].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        while procs[0].poll() is None and time.monotonic() - killed_at < 90:
            procs[0].stdout.readline() or time.sleep(0.2)
        elapsed = time.monotonic() - killed_at
        rc = procs[0].poll()
        print(json.dumps({"survivor_rc": rc, "seconds_to_fail": elapsed}))
        assert rc is not None and rc != 0, f"survivor still running {elapsed:.0f} s after the kill"
        assert elapsed < 60
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


# -- in-process (one CPU device) -------------------------------------------------------------

def test_env_single_process_and_errors():
    assert meshlib.distributed_from_env({}) == meshlib.Distributed()
    env = meshlib.local_env(1, 2, 1234, 2)
    assert env["MARIN_DEVICES_PER_PROCESS"] == "2"
    assert meshlib.distributed_from_env(env) == meshlib.Distributed(1, 2, "127.0.0.1:1234")
    with pytest.raises(ValueError, match="process id 2 is outside"):
        meshlib.local_env(2, 2, 1234)
    with pytest.raises(ValueError, match="MARIN_DEVICES_PER_PROCESS must be a positive integer"):
        meshlib.init_distributed({"MARIN_DEVICES_PER_PROCESS": "two"})
    with pytest.raises(ValueError, match="lacks 'JOB_COMPLETION_INDEX'"):
        meshlib.distributed_from_env({"JAX_NUM_PROCESSES": "2", "JAX_COORDINATOR_ADDRESS": "h:1"})


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from(["JAX_NUM_PROCESSES", "JOB_COMPLETION_INDEX", "MARIN_PROCESS_OFFSET",
                                        "JAX_COORDINATOR_ADDRESS"]),
                       st.text(alphabet="0123456789-x: ", max_size=4)))
def test_env_parser_accepts_or_names_the_problem(env):
    try:
        d = meshlib.distributed_from_env(env)
    except ValueError as e:
        assert any(k in str(e) for k in ("JAX_", "JOB_", "process id", "coordinator", "environment")), str(e)
    else:
        assert 0 <= d.process_id < d.num_processes


def test_default_expert_axis():
    from marin_assets.model import ModelConfig

    moe = ModelConfig(n_routed_experts=6, top_k=2)
    assert meshlib.default_expert_size(moe, n_devices=8, per_process=8) == 2  # divides 8 and 6
    assert meshlib.default_expert_size(moe, n_devices=12, per_process=4) == 3  # within a process
    assert meshlib.default_expert_size(ModelConfig(n_routed_experts=0), 8, 8) == 1


def test_one_device_mesh_shardings_and_batch():
    import jax
    from jax.sharding import PartitionSpec as P

    from marin_assets.model import ModelConfig, init_params

    cfg = ModelConfig(n_routed_experts=4, top_k=2)
    mesh = meshlib.make_mesh(cfg, expert=1)
    assert dict(mesh.shape) == {"data": 1, "expert": 1}
    shapes = jax.eval_shape(lambda: {"params": init_params(cfg, jax.random.PRNGKey(0)),
                                     "opt": {"mu": init_params(cfg, jax.random.PRNGKey(0))}})
    sh = meshlib.state_shardings(mesh, shapes)
    assert sh["params"]["layers"]["e_up"].spec == P(None, "expert")
    assert sh["opt"]["mu"]["layers"]["e_down"].spec == P(None, "expert")
    assert sh["params"]["layers"]["wq"].spec == P() and sh["params"]["embed"].spec == P()
    assert meshlib.process_rows(mesh, 8) == slice(0, 8)
    tokens = np.arange(24, dtype=np.int32).reshape(8, 3)
    arr = meshlib.shard_batch(mesh, tokens, 8)
    assert arr.shape == (8, 3) and np.array_equal(np.asarray(arr), tokens)
    with pytest.raises(ValueError, match="got 4 rows, this process holds rows \\[0, 8\\)"):
        meshlib.shard_batch(mesh, tokens[:4], 8)
    host = meshlib.host_state({"a": arr})
    assert isinstance(host["a"], np.ndarray) and np.array_equal(host["a"], tokens)
    assert meshlib.agree(np.bool_(True)) and meshlib.is_writer()
    assert meshlib.all_processes(True) is True and meshlib.all_processes(False) is False


def test_mesh_rejects_shapes_that_do_not_divide():
    import jax

    from marin_assets.model import ModelConfig

    cfg = ModelConfig(n_routed_experts=3, top_k=2)
    with pytest.raises(ValueError, match="expert axis size 2 does not divide the 1 devices"):
        meshlib.make_mesh(cfg, expert=2)
    mesh = meshlib.make_mesh(cfg, expert=1)
    meshlib.check_fits(mesh, cfg, batch_size=5, seq_len=8)  # 1 shard: anything fits
    with pytest.raises(ValueError, match="MARIN_EXPERT_PARALLEL must be a positive integer"):
        meshlib.make_mesh(cfg, env={"MARIN_EXPERT_PARALLEL": "0"})
    from kernels.expert_parallel import ExpertParallel

    with pytest.raises(ValueError, match="token_axes .* include 'expert'"):
        ExpertParallel(mesh, token_axes=("data",))

