"""Per-device training-state bytes with and without FSDP (issue 25 item 1), on a 2 x 2 mesh.

The state is the trainer's own (``train.state.init_state``: params, optimizer state, guards,
router bias, step, RNG) for ``--config``; its layout is ``train.distributed.mesh.state_shardings`` with
``fsdp=True`` (ours) or ``False`` (reference: non-expert state replicated). Bytes per device are
summed from each leaf's shard shape under its sharding, and cross-checked against XLA: the
compiled state init's ``memory_analysis().output_size_in_bytes`` (what one device's outputs
hold), printed beside each figure.

``fsdp_memory``: the non-expert params and optimizer moments (target >= 3.5 at 2 x 2);
``fsdp_memory_state``: the whole state (routed experts, which are already split over the
expert axis, and the fields FSDP keeps replicated by design, included). ratio = replicated
bytes / FSDP bytes (> 1: FSDP holds less per device).

    .venv/bin/python benchmarks/fsdp_memory.py [--config examples/tiny_moe.yaml] [--data 2 --expert 2]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
from _common import emit  # noqa: E402


def state_and_mesh(config_path: str, data: int, expert: int):
    """(TrainState shapes, its init function, the data x expert mesh) for the config."""
    import jax

    from marin_assets.train.config import load_config
    from marin_assets.train.distributed import mesh as meshlib
    from marin_assets.train.restore import optimizer_for
    from marin_assets.train.state import init_state, moe_model

    config, model = load_config(config_path), moe_model()
    opt = optimizer_for(config, model)
    init = lambda: init_state(config, opt, model)  # noqa: E731
    mesh = meshlib.make_mesh(config.model, expert=expert, devices=jax.devices()[: data * expert])
    return jax.eval_shape(init), init, mesh


def non_expert_part(shapes):
    """The params and optimizer moments other than the routed experts' (None elsewhere)."""
    import jax

    from marin_assets.train.distributed import mesh as meshlib

    def keep(path, leaf):
        names = meshlib._key_names(path)
        return leaf if names[-1] not in meshlib.EXPERT_WEIGHTS and leaf.ndim else None

    return jax.tree_util.tree_map_with_path(keep, {"params": shapes.params, "opt_state": shapes.opt_state})


def xla_output_bytes(init, mesh, fsdp: bool) -> int:
    """Per-device output bytes of the compiled, sharded state init, as XLA reports them."""
    import jax

    from marin_assets.train.distributed import mesh as meshlib

    shardings = meshlib.state_shardings(mesh, jax.eval_shape(init), fsdp)
    return int(jax.jit(init, out_shardings=shardings).lower().compile().memory_analysis().output_size_in_bytes)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "examples" / "tiny_moe.yaml"))
    ap.add_argument("--data", type=int, default=2)
    ap.add_argument("--expert", type=int, default=2)
    args = ap.parse_args()
    devices = args.data * args.expert  # host devices, set before JAX starts its backend
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    from marin_assets.train.distributed import mesh as meshlib

    shapes, init, mesh = state_and_mesh(args.config, args.data, args.expert)
    mesh_name = f"{args.data}x{args.expert}"
    for name, part in (("fsdp_memory", non_expert_part(shapes)), ("fsdp_memory_state", shapes)):
        fsdp, replicated = (meshlib.per_device_bytes(part, meshlib.state_shardings(mesh, part, flag)) for flag in (True, False))
        extra = {"mesh": mesh_name, "config": Path(args.config).name}
        if name == "fsdp_memory_state":
            extra |= {
                "xla_output_bytes_fsdp": xla_output_bytes(init, mesh, True),
                "xla_output_bytes_replicated": xla_output_bytes(init, mesh, False),
            }
        emit(name, "bytes/device", float(fsdp), float(replicated), higher_is_better=False, **extra)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
