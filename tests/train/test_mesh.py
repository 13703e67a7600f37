"""The ("data", "expert") training mesh: 1 x 1, 1 x 4 and 2 processes x 2 devices agree (the
session's one set of ``loop.train`` runs, tests/train/conftest.py ``mesh_runs``); env parsing
and shardings. That a killed peer fails the survivor in bounded time is test_train_mesh.py's, on
the training worker itself (the same heartbeat, with a resume after it)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marin_assets.train.distributed import hosts as distributed
from marin_assets.train.distributed import mesh as meshlib
from tests.train.train_check import STEPS

ROOT = Path(__file__).resolve().parents[2]
PROC_TIMEOUT_S = 900  # a few compiles; generous for a loaded 2-core CI machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env(**extra) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("JAX_COORDINATOR", "JAX_NUM_PROCESSES", "JOB_COMPLETION", "MARIN_"))
    }
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", **extra)
    return env


def launch_argv(n_processes: int, devices: int, argv: list[str], **env_extra) -> list[subprocess.Popen]:
    """``n_processes`` copies of ``argv`` with the manifests' environment, on this host."""
    port = free_port()
    procs = []
    for pid in range(n_processes):
        env = base_env(**env_extra)
        if n_processes > 1:
            env.update(distributed.local_env(pid, n_processes, port, devices))
        else:
            env["MARIN_DEVICES_PER_PROCESS"] = str(devices)
        procs.append(subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


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


def losses(run: dict) -> np.ndarray:
    return np.array([r["loss"] for r in run["rows"]])


def assert_same_training(ref: dict, other: dict, name: str) -> list[float]:
    """``other`` trained as ``ref`` did: step-0 loss within 1e-6, every step within 1e-4 and the
    final params within 1e-4, with nothing dropped; returns the per-step loss differences."""
    assert [r["step"] for r in other["rows"]] == list(range(1, STEPS + 1))  # one writer: no duplicate rows
    assert [r["dropped"] for r in other["rows"]] == [0] * STEPS  # capacity large enough that nothing drops
    diff = np.abs(losses(other) - losses(ref))
    assert diff[0] <= 1e-6, (name, diff[0])
    assert np.max(diff[1:]) <= 1e-4, (name, diff.tolist())
    assert other["params"].keys() == ref["params"].keys()
    param_diff = max(float(np.max(np.abs(other["params"][k] - ref["params"][k]))) for k in ref["params"])
    assert param_diff < 1e-4, (name, param_diff)
    return [float(f"{d:.2e}") for d in diff]


@pytest.fixture(scope="module")
def layouts(mesh_runs):
    """{layout: train_check.load_layout(...)} for 1x1, 1x4, 2x2 and env (tests/train/conftest.py)."""
    from tests.train.train_check import load_layout

    return {name: load_layout(mesh_runs, name) for name in ("1x1", "1x4", "2x2", "env")}


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["ragged", "pooled"])
def test_meshes_give_the_same_losses_and_params(layouts, transport):
    """``loop.train`` on 1 x 1, 1 x 4 and 2 processes x 2 devices: the same losses and final params."""
    assert layouts["1x1"]["mesh"] == {"data": 1, "sequence": 1, "expert": 1}
    assert layouts["1x4"]["mesh"] == {"data": 1, "sequence": 1, "expert": 4}
    two = layouts["2x2"]
    assert two["mesh"] == {"data": 2, "sequence": 1, "expert": 2} and two["processes"] == 2 and two["devices"] == 4
    assert two["rows"] == [0, 4]  # process 0 read only its half of each batch
    ref = layouts["1x1"]["runs"][transport]
    assert len(ref["rows"]) == STEPS and np.all(np.isfinite(losses(ref)))
    assert [r["dropped"] for r in ref["rows"]] == [0] * STEPS
    assert losses(ref)[-1] < losses(ref)[0]  # it trains
    report = {name: assert_same_training(ref, layouts[name]["runs"][transport], name) for name in ("1x4", "2x2")}
    print(json.dumps({"transport": transport, "abs_loss_diff_vs_1x1_per_step": report}))


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["ragged", "pooled"])
def test_an_ep_domain_of_two_processes_gives_the_same_losses(layouts, transport):
    """2 processes x 2 devices whose environment says MARIN_EP_DOMAIN_CHIPS=4 (a fleet pool's
    ep_domain_chips, as the manifests set it): the worker's own mesh has an expert axis of 4 that
    spans both processes, and trains as 1 x 1 does."""
    ep = layouts["env"]
    assert ep["mesh"] == {"data": 1, "sequence": 1, "expert": 4} and ep["processes"] == 2 and ep["devices"] == 4
    assert ep["expert_group_processes"] == [[0, 0, 1, 1]]  # one expert group: process 0's devices, then 1's
    assert ep["rows"] == [0, 4]
    control = ep["wrong_slice"][transport]
    assert abs(control["bad"] - control["good"]) > 1e-3  # a wrong slice would show in the losses
    diff = assert_same_training(layouts["1x1"]["runs"][transport], ep["runs"][transport], "env")
    print(json.dumps({"transport": transport, "abs_loss_diff_env_ep4_vs_1x1_per_step": diff}))


@pytest.mark.slow
def test_processes_agree_on_host_values(layouts):
    assert layouts["2x2"]["agree"] == {"process0_value": 7, "all_true": True, "one_false": False}
    assert layouts["1x1"]["agree"] == {"process0_value": 7, "all_true": True, "one_false": True}


@pytest.mark.slow
def test_a_wrong_batch_slice_is_caught(layouts):
    """Negative control: both processes reading rows [0, 4) changes the loss by far more
    than the tolerance above."""
    controls = layouts["2x2"]["wrong_slice"]
    assert set(controls) == {"ragged", "pooled"}
    for control in controls.values():
        assert abs(control["bad"] - control["good"]) > 1e-3


# -- in-process (one CPU device) -------------------------------------------------------------


def test_env_single_process_and_errors():
    assert distributed.distributed_from_env({}) == distributed.Distributed()
    env = distributed.local_env(1, 2, 1234, 2)
    assert env["MARIN_DEVICES_PER_PROCESS"] == "2"
    assert distributed.distributed_from_env(env) == distributed.Distributed(1, 2, "127.0.0.1:1234")
    with pytest.raises(ValueError, match="process id 2 is outside"):
        distributed.local_env(2, 2, 1234)
    with pytest.raises(ValueError, match="MARIN_DEVICES_PER_PROCESS must be a positive integer"):
        distributed.init_distributed({"MARIN_DEVICES_PER_PROCESS": "two"})
    with pytest.raises(ValueError, match="lacks 'JOB_COMPLETION_INDEX'"):
        distributed.distributed_from_env({"JAX_NUM_PROCESSES": "2", "JAX_COORDINATOR_ADDRESS": "h:1"})


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["JAX_NUM_PROCESSES", "JOB_COMPLETION_INDEX", "MARIN_PROCESS_OFFSET", "JAX_COORDINATOR_ADDRESS"]),
        st.text(alphabet="0123456789-x: ", max_size=4),
    )
)
def test_env_parser_accepts_or_names_the_problem(env):
    try:
        d = distributed.distributed_from_env(env)
    except ValueError as e:
        assert any(k in str(e) for k in ("JAX_", "JOB_", "process id", "coordinator", "environment")), str(e)
    else:
        assert 0 <= d.process_id < d.num_processes


def test_default_expert_axis():
    from marin_assets.model import ModelConfig

    moe = ModelConfig(n_routed_experts=6, top_k=2)
    assert meshlib.default_expert_size(moe, n_devices=8, ep_domain=8) == 2  # divides 8 and 6
    assert meshlib.default_expert_size(moe, n_devices=12, ep_domain=4) == 3  # within an EP domain
    assert meshlib.default_expert_size(moe, n_devices=12, ep_domain=12, domain_devices=4) == 2  # in one domain
    assert meshlib.default_expert_size(ModelConfig(n_routed_experts=0), 8, 8) == 1


def test_ep_domain_env_sets_the_expert_axis():
    """MARIN_EP_DOMAIN_CHIPS (the fleet's ep_domain_chips in a pod's env) lets the expert axis span
    processes; without it the axis stays inside one process; MARIN_EXPERT_PARALLEL is exact."""
    from marin_assets.model import ModelConfig

    moe = ModelConfig(n_routed_experts=4, top_k=2)
    assert meshlib.expert_axis_size(moe, n_devices=4, per_process=2, env={}) == 2
    assert meshlib.expert_axis_size(moe, 4, 2, {"MARIN_EP_DOMAIN_CHIPS": "4"}) == 4
    assert meshlib.expert_axis_size(moe, 8, 2, {"MARIN_EP_DOMAIN_CHIPS": "8"}) == 4  # and divides the experts
    assert meshlib.expert_axis_size(moe, 4, 2, {"MARIN_EXPERT_PARALLEL": "1", "MARIN_EP_DOMAIN_CHIPS": "4"}) == 1
    # Two interconnect domains of 2 processes x 1 device: no expert group straddles them.
    assert meshlib.expert_axis_size(moe, 4, 1, {"MARIN_EP_DOMAIN_CHIPS": "4", "MARIN_HOSTS_PER_DOMAIN": "2"}) == 2
    with pytest.raises(ValueError, match="MARIN_EXPERT_PARALLEL=4 is larger than the EP domain .MARIN_EP_DOMAIN_CHIPS=2"):
        meshlib.expert_axis_size(moe, 4, 2, {"MARIN_EXPERT_PARALLEL": "4", "MARIN_EP_DOMAIN_CHIPS": "2"})
    with pytest.raises(ValueError, match="MARIN_EP_DOMAIN_CHIPS must be a positive integer"):
        meshlib.expert_axis_size(moe, 4, 2, {"MARIN_EP_DOMAIN_CHIPS": "four"})


def test_expert_groups_are_consecutive_processes():
    from types import SimpleNamespace

    devices = [SimpleNamespace(process_index=p, id=i) for p, i in ((1, 9), (0, 1), (1, 8), (0, 0))]
    ordered = meshlib.ep_device_order(devices)
    assert [(d.process_index, d.id) for d in ordered] == [(0, 0), (0, 1), (1, 8), (1, 9)]


def test_one_device_mesh_shardings_and_batch():
    import jax
    from jax.sharding import PartitionSpec as P

    from marin_assets.model import ModelConfig, init_params

    cfg = ModelConfig(n_routed_experts=4, top_k=2)
    mesh = meshlib.make_mesh(cfg, expert=1)
    assert dict(mesh.shape) == {"data": 1, "sequence": 1, "expert": 1}
    shapes = jax.eval_shape(
        lambda: {"params": init_params(cfg, jax.random.PRNGKey(0)), "opt": {"mu": init_params(cfg, jax.random.PRNGKey(0))}}
    )
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
    assert distributed.agree(np.bool_(True)) and distributed.is_writer()
    assert distributed.all_processes(True) is True and distributed.all_processes(False) is False


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
    with pytest.raises(ValueError, match="expert axis size 2 does not divide n_routed_experts=3"):
        meshlib.make_mesh(cfg, expert=2, devices=jax.devices() * 2)
    from kernels.expert_parallel import ExpertParallel

    with pytest.raises(ValueError, match="token_axes .* include 'expert'"):
        ExpertParallel(mesh, token_axes=("data",))
