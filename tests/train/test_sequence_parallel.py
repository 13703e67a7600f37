"""Context parallelism in training: ``TrainConfig.sequence_parallel`` is the mesh's ``sequence`` axis, over which
each row's positions are split. The equivalence runs on 4 host devices are ``sequence_check.py``'s (a
subprocess); the rest checks the config, the plan and the mesh without devices."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import types

import pytest

from marin_assets.phases.plan import PhaseSpec, phase_train_config, spec_record
from marin_assets.train.config import config_from_dict, replace
from marin_assets.train.distributed import mesh as meshlib
from tests.support.configs import TINY_TRAIN
from tests.train.test_mesh import PROC_TIMEOUT_S, ROOT, base_env


def test_sequence_parallel_must_split_seq_len_and_run_a_kernel_that_can():
    config_from_dict(dict(TINY_TRAIN, sequence_parallel=4))  # 32 positions, 8 a device
    with pytest.raises(ValueError, match=r"sequence_parallel \(3\) must divide seq_len \(32\)"):
        config_from_dict(dict(TINY_TRAIN, sequence_parallel=3))
    with pytest.raises(ValueError, match="must be a positive int"):
        config_from_dict(dict(TINY_TRAIN, sequence_parallel=0))
    cudnn = dict(TINY_TRAIN["model"], attention_impl="cudnn")
    with pytest.raises(ValueError, match="reference or blockwise kernel; model.attention_impl is 'cudnn'"):
        config_from_dict(dict(TINY_TRAIN, model=cudnn, sequence_parallel=2))
    config_from_dict(dict(TINY_TRAIN, model=cudnn))  # without a split, any kernel


def test_a_context_phase_raises_the_sequence_axis_without_a_new_version(tiny_config):
    base = replace(tiny_config, model={"max_seq_len": 128})
    spec = dict(warm_start_from="kestrel", schedule="wsd", mixture={"license": 1.0}, batch_size=4, hardware="cpu")
    plain = PhaseSpec(name="ocelot", token_budget=4 * 128, peak_lr=3e-3, seq_len=128, **spec)
    split = dataclasses.replace(plain, sequence_parallel=4)
    assert phase_train_config(base, plain).sequence_parallel == 1  # the base's
    long = phase_train_config(base, split)
    assert (long.seq_len, long.batch_size, long.sequence_parallel) == (128, 1, 4)
    # a layout, not what the phase computes: the phase's record (its content version) is unchanged
    assert spec_record(dataclasses.asdict(split)) == spec_record(dataclasses.asdict(plain))
    with pytest.raises(ValueError, match="sequence_parallel must be >= 1"):
        dataclasses.replace(plain, sequence_parallel=0)


def test_check_fits_wants_the_configs_sequence_axis():
    mesh = types.SimpleNamespace(shape={"data": 1, "sequence": 2, "expert": 1})  # check_fits reads only the shape
    model = config_from_dict(TINY_TRAIN).model
    meshlib.check_fits(mesh, model, 4, 32, sequence=2)
    with pytest.raises(ValueError, match="sequence_parallel is 1 but mesh .* has a sequence axis of 2"):
        meshlib.check_fits(mesh, model, 4, 32)
    with pytest.raises(ValueError, match="seq_len 33 does not split into the 2 chunks"):
        meshlib.check_fits(mesh, model, 4, 33, sequence=2)


@pytest.fixture(scope="module")
def sequence_runs(caches, tmp_path_factory):
    out = tmp_path_factory.mktemp("sequence_runs")
    caches_json = out / "caches.json"
    caches_json.write_text(json.dumps({k: str(v) for k, v in caches.items()}))
    argv = [sys.executable, "-m", "tests.train.sequence_check", "--caches", str(caches_json), "--out", str(out / "runs")]
    done = subprocess.run(argv, env=base_env(), cwd=ROOT, capture_output=True, text=True, timeout=PROC_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.slow  # shares the sequence_runs subprocess
def test_the_held_out_loss_splits_the_positions_as_the_run_trains(sequence_runs):
    """A context too long for one device's attention in training is too long for it in the held-out loss:
    on 1x4x1 the held-out step gathers each layer's keys and values along the sequence axis, and gives one
    device's loss (document-masked)."""
    held = sequence_runs["held_out"]
    print(json.dumps(held))
    assert held["1x1x1"]["loss"] > 0 and abs(held["1x4x1"]["loss"] - held["1x1x1"]["loss"]) <= 1e-5, held
    assert held["1x4x1"]["all_gathers"] >= held["1x1x1"]["all_gathers"] + 2 * 2, held


@pytest.mark.slow  # one subprocess: 5 meshes' steps and 5 short runs on 4 host devices, ~80 s
def test_a_split_sequence_steps_as_one_device_does(sequence_runs):
    """One step of a 2-layer MoE with document masking, per-document RoPE and a window on one layer: the loss
    and the gradient on 1x4x1, 1x2x2 and 2x2x1 (DATAxSEQUENCExEXPERT) are one device's within 1e-6; the params
    after the AdamW step as close as a split of the rows alone (4x1x1) puts them."""
    steps = sequence_runs["steps"]
    print(json.dumps(steps))
    control = steps["4x1x1"]["params"]
    for name in ("1x4x1", "1x2x2", "2x2x1"):
        assert steps[name]["loss"] <= 1e-6 and steps[name]["gradient"] <= 1e-6, (name, steps[name])
        assert steps[name]["params"] <= max(2 * control, 1e-6), (name, steps[name], control)
        assert steps[name]["dropped"] == 0
    # the split is real: each layer gathers its keys and values (and their documents) along the sequence axis
    assert steps["1x4x1"]["all_gathers"] >= steps["1x1x1"]["all_gathers"] + 2 * 2
    # FSDP splits the state over the sequence axis too (its devices hold the same weights): the same step, and
    # each device holds well under half the replicated state (the small replicated fields stay whole)
    fsdp = steps["1x4x1 fsdp"]
    assert fsdp["loss"] <= 1e-6 and fsdp["gradient"] <= 1e-6 and fsdp["params"] <= max(2 * control, 1e-6), fsdp
    assert fsdp["state_bytes_per_device"] < 0.4 * fsdp["state_bytes_per_device_without_fsdp"], fsdp


@pytest.mark.slow
def test_a_checkpoint_resumes_onto_another_split(sequence_runs):
    """Killed after step 3 on 1x4x1 (its checkpoint at step 2 kept): resumed on the same split it continues
    bit for bit as the run that was never killed; resumed on 4x1x1 (no sequence split), within rounding."""
    resume = sequence_runs["resume"]
    print(json.dumps(resume))
    for name in ("same", "moved"):
        assert resume[name]["checkpoints_before"] == ["step-000000002"] and resume[name]["final_step"] == 4
    assert resume["same"]["params"] == 0.0 and resume["same"]["losses"] == 0.0
    assert resume["moved"]["params"] <= 1e-6 and resume["moved"]["losses"] <= 1e-6


@pytest.mark.slow
def test_a_context_phase_raises_the_sequence_axis_and_trains(sequence_runs):
    """A phase of twice the length with ``PhaseSpec.sequence_parallel=4``, warm-started from a 4-step run: its
    config asks for the split, ``train`` builds the 1x4x1 mesh from it, and the phase trains on from step 4."""
    import math

    long = sequence_runs["resume"]["context"]
    assert (long["seq_len"], long["sequence_parallel"]) == (128, 4)
    assert long["mesh"] == {"data": 1, "sequence": 4, "expert": 1}
    assert (long["phase_start_step"], long["final_step"]) == (4, 6)
    assert long["last_loss"] is not None and math.isfinite(long["last_loss"])


def test_fsdp_names_the_sequence_axis_only_when_it_splits():
    """With a sequence split FSDP spreads the weights over it too; without one the specs are the ones FSDP always
    had (a checkpoint's layout, and a compiled step's, unchanged)."""
    from jax.sharding import AbstractMesh
    from jax.sharding import PartitionSpec as P

    def spec(shape, expert_weight, mesh_shape):
        return meshlib._fsdp_spec(["layers", "w"], shape, AbstractMesh(mesh_shape, meshlib.AXES), expert_weight)

    assert spec((2, 64, 32), False, (2, 1, 2)) == P(None, ("data", "expert"), None)
    assert spec((2, 64, 32), False, (1, 2, 2)) == P(None, ("data", "sequence", "expert"), None)
    assert spec((2, 4, 64, 32), True, (2, 1, 2)) == P(None, "expert", "data", None)
    assert spec((2, 4, 64, 32), True, (1, 2, 2)) == P(None, "expert", ("data", "sequence"), None)
