"""FSDP (train/distributed/mesh.py ``fsdp``): params and optimizer state split over every device, experts
kept on the expert axis; the same training on 1 x 1, 1 x 4 and 2 processes x 2 devices (the
session's shared runs, tests/train/conftest.py ``mesh_runs``), and per-device state bytes of
1/N of the replicated layout plus what stays replicated by design."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from marin_assets.train.distributed import mesh as meshlib
from tests.support.configs import TINY_TRAIN
from tests.train.test_mesh import assert_same_training


def abstract_mesh(data: int, expert: int):
    from jax.sharding import AbstractMesh

    return AbstractMesh((data, 1, expert), meshlib.AXES)


def tiny_state_shapes():
    """The TrainState of tests/support's tiny MoE, as ShapeDtypeStructs."""
    import jax

    from marin_assets.train.config import config_from_dict
    from marin_assets.train.restore import optimizer_for
    from marin_assets.train.state import init_state, moe_model

    config, model = config_from_dict(TINY_TRAIN), moe_model()
    opt = optimizer_for(config, model)
    return jax.eval_shape(lambda: init_state(config, opt, model))


def leaf_bytes(leaf) -> int:
    return math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize


def by_design_replicated(path, leaf) -> bool:
    """What the FSDP layout keeps whole (module docstring of train/distributed/mesh.py): the run's small
    fields and scalars."""
    return meshlib._key_names(path)[0] in meshlib.REPLICATED_FIELDS or leaf.ndim == 0


def test_fsdp_layout_splits_every_param_and_moment_over_all_devices():
    import jax
    from jax.sharding import PartitionSpec as P

    mesh, shapes = abstract_mesh(2, 2), tiny_state_shapes()
    fsdp = meshlib.state_shardings(mesh, shapes, fsdp=True)
    for (path, leaf), sharding in zip(jax.tree_util.tree_leaves_with_path(shapes), jax.tree.leaves(fsdp), strict=True):
        names, spec = meshlib._key_names(path), sharding.spec
        if by_design_replicated(path, leaf):
            assert spec == P(), (names, spec)
            continue
        assert math.prod(sharding.shard_shape(leaf.shape)) * 4 == math.prod(leaf.shape), (names, spec)
        if names[-1] in meshlib.EXPERT_WEIGHTS:
            assert spec[1] == "expert" and "data" in spec[2:], (names, spec)  # E stays on the expert axis
        if "layers" in names:
            assert spec[0] is None, (names, spec)  # a scan step reads one whole layer
    default = meshlib.state_shardings(mesh, shapes, fsdp=False)
    assert default.params["layers"]["e_up"].spec == P(None, "expert") and default.params["embed"].spec == P()


def test_fsdp_state_bytes_are_one_nth_plus_the_replicated_fields():
    """Per-device bytes from the shardings at 2 x 2: <= 1/4 of the replicated layout's plus the
    fields replicated by design; the non-expert part shrinks 4x (the benchmark's figure)."""
    import jax

    mesh, shapes = abstract_mesh(2, 2), tiny_state_shapes()
    fsdp = meshlib.per_device_bytes(shapes, meshlib.state_shardings(mesh, shapes, fsdp=True))
    kept = sum(leaf_bytes(leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(shapes) if by_design_replicated(path, leaf))
    total = sum(leaf_bytes(leaf) for leaf in jax.tree.leaves(shapes))
    assert fsdp <= (total - kept) / 4 + kept
    assert kept < 0.05 * total  # the replicated remainder is small, or the bound above says little
    non_expert = {"params": shapes.params, "opt": shapes.opt_state}
    non_expert = jax.tree_util.tree_map_with_path(
        lambda p, x: x if meshlib._key_names(p)[-1] not in meshlib.EXPERT_WEIGHTS and x.ndim else None, non_expert
    )
    ratio = meshlib.per_device_bytes(
        non_expert, meshlib.state_shardings(mesh, non_expert, fsdp=False)
    ) / meshlib.per_device_bytes(non_expert, meshlib.state_shardings(mesh, non_expert, fsdp=True))
    assert ratio == 4.0


def test_fsdp_falls_back_to_the_data_axis_then_replicates():
    import jax
    from jax.sharding import PartitionSpec as P

    mesh = abstract_mesh(2, 2)
    shapes = {
        "params": {
            "a": jax.ShapeDtypeStruct((6, 10), np.float32),  # 10 splits 2 ways, not 4
            "b": jax.ShapeDtypeStruct((3, 5), np.float32),  # nothing divides
            "c": jax.ShapeDtypeStruct((4, 8), np.float32),  # the larger axis is split
            "layers": {"w": jax.ShapeDtypeStruct((4, 3, 3), np.float32)},
        },  # L is never split
        "router_bias": jax.ShapeDtypeStruct((4, 8), np.float32),
    }
    sh = meshlib.state_shardings(mesh, shapes, fsdp=True)
    assert sh["params"]["a"].spec == P(None, "data")
    assert sh["params"]["b"].spec == P() and sh["params"]["layers"]["w"].spec == P()
    assert sh["params"]["c"].spec == P(None, ("data", "expert"))
    assert sh["router_bias"].spec == P()


def test_the_fsdp_knob_is_a_train_config_field_that_reaches_the_layout():
    """``fsdp: true`` in a run's YAML lays the run's state out split; the default stays replicated."""
    from jax.sharding import PartitionSpec as P

    from marin_assets.train.config import config_from_dict

    mesh, shapes = abstract_mesh(2, 2), tiny_state_shapes()
    assert config_from_dict(TINY_TRAIN).fsdp is False and config_from_dict({**TINY_TRAIN, "fsdp": True}).fsdp is True
    for fsdp, spec in ((False, P()), (True, P(None, ("data", "expert")))):
        assert meshlib.state_shardings(mesh, shapes, fsdp=fsdp).params["embed"].spec == spec
    with pytest.raises(ValueError, match="TrainConfig.fsdp must be bool"):
        config_from_dict({**TINY_TRAIN, "fsdp": "yes"})


# -- the shared multi-process runs ------------------------------------------------------------


@pytest.fixture(scope="module")
def layouts(mesh_runs):
    from tests.train.train_check import load_layout

    return {name: load_layout(mesh_runs, name) for name in ("1x1", "1x4", "2x2")}


@pytest.mark.slow
def test_fsdp_trains_as_one_device_does_on_every_mesh(layouts):
    """FSDP (ragged transport) on 1 x 4 and 2 processes x 2 devices vs. the one-device run:
    step-0 loss within 1e-6, every step within 1e-4 over 20 steps, final params within 1e-4."""
    ref = layouts["1x1"]["runs"]["ragged"]
    assert "fsdp_ragged" not in layouts["1x1"]["runs"]  # one device: the same layout as ref
    report = {name: assert_same_training(ref, layouts[name]["runs"]["fsdp_ragged"], name) for name in ("1x4", "2x2")}
    print(json.dumps({"fsdp_abs_loss_diff_vs_1x1_per_step": report}))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["1x4", "2x2"])
def test_trained_fsdp_state_holds_one_nth_per_device(layouts, name):
    """From the trained state's own arrays (their shardings, read in the run's last-step hook):
    params and optimizer state split 4 ways, the rest replicated by design, and fewer bytes per
    device than the replicated layout's run on the same mesh."""
    layout = layouts[name]["runs"]["fsdp_ragged"]["state"]
    total = kept = 0
    for key, leaf in layout["layout"].items():
        nbytes = math.prod(leaf["shape"]) * leaf["itemsize"]
        total += nbytes
        field = key.split("'")[1]
        if field in meshlib.REPLICATED_FIELDS or not leaf["shape"]:
            kept += nbytes
            assert leaf["shard"] == leaf["shape"], key
        else:
            assert math.prod(leaf["shard"]) * 4 == math.prod(leaf["shape"]), (key, leaf)
    assert layout["per_device_bytes"] <= (total - kept) / 4 + kept
    replicated = layouts[name]["runs"]["ragged"]["state"]["per_device_bytes"]
    print(json.dumps({"mesh": name, "per_device_state_bytes": {"replicated": replicated, "fsdp": layout["per_device_bytes"]}}))
    assert replicated / layout["per_device_bytes"] > 2.5
