"""Two choices of the real train step (loop.make_train_step: the EP layer, the guards, AdamW), each side
against the other on the same model, batch and mesh, for the device check (benchmarks/device_check.sh):

  offload_train_step_memory  bytes a step holds on the accelerator, by XLA's buffer assignment
      (compiled.memory_analysis(): argument + output + temp - alias), with TrainConfig.offload_optimizer
      (ours: the Adam moments live in pinned host memory, train/distributed/offload.py) vs without
      (reference); ratio = reference / ours; the host-memory bytes of each side in ``details``.
      Compile-only (nothing is allocated). Where the backend cannot compile a host-offloaded step
      (XLA:CPU: offload.host_offload_problem says why) this figure is not printed: its reason goes to
      stderr and the script exits 2 once the other figures are out.
  ep_transport_step_time  seconds per step (median of --iters, the two sides interleaved) of the MoE with
      ModelConfig.ep_transport "pooled" (ours: the fixed pooled-wave all-to-all) vs "ragged" (reference),
      on a mesh whose expert axis holds every device. On one device the exchange stays local, so the
      figure is what each transport's packing, capacity and combine cost; a real split needs several
      devices (on CPU: --host-devices N). ratio = reference / ours.

    .venv/bin/python benchmarks/train_step_variants.py [--quick] [--figures offload,ep_transport]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import compiled_bytes, emit  # noqa: E402

FIGURES = ("offload", "ep_transport")
QUICK = {"d_model": 64, "layers": 2, "heads": 4, "kv_heads": 2, "experts": 4, "top_k": 2, "expert_d_ff": 64,
         "seq": 64, "batch": 4, "vocab": 256}  # fmt: skip


def train_config(args, **changes):
    """The TrainConfig both sides share (``changes``: the one field a figure varies)."""
    from marin_assets.train.config import config_from_dict

    model = {
        "vocab_size": args.vocab,
        "d_model": args.d_model,
        "n_layers": args.layers,
        "n_heads": args.heads,
        "n_kv_heads": args.kv_heads,
        "d_ff": 4 * args.d_model,
        "n_routed_experts": args.experts,
        "top_k": args.top_k,
        "expert_d_ff": args.expert_d_ff,
        "max_seq_len": args.seq,
        **changes.pop("model", {}),
    }
    schedule = {"warmup_steps": 1, "decay_steps": 1}
    base = {"seq_len": args.seq, "batch_size": args.batch, "num_steps": 10, "compute_dtype": args.dtype, "schedule": schedule}
    return config_from_dict({"model": model, **base, **changes})


def built_step(config, mesh):
    """(jitted step, state shardings, state shapes) of ``config`` on ``mesh``, laid out as train() lays it out."""
    from marin_assets.train.loop import default_model, make_train_step, state_layout

    model = default_model()
    opt, shapes, state_sh = state_layout(config, model, mesh, offloaded=config.offload_optimizer)
    return make_train_step(config, opt, model, mesh, state_sh), state_sh, (config, opt, model, shapes)


def step_memory(config, mesh) -> dict:
    """memory_analysis of one compiled step: device and host bytes."""
    import jax
    import numpy as np

    from marin_assets.train.distributed import mesh as meshlib

    step, state_sh, (_, _, _, shapes) = built_step(config, mesh)
    state_in = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, state_sh)
    tokens = jax.ShapeDtypeStruct((config.batch_size, config.seq_len), np.int32, sharding=meshlib.batch_sharding(mesh))
    stats = step.lower(state_in, tokens, np.bool_(True), np.float32(1e-3)).compile().memory_analysis()
    return {"device": compiled_bytes(stats), "host": compiled_bytes(stats, "host_"), "temp": int(stats.temp_size_in_bytes)}


def offload_figure(args, mesh) -> str | None:
    """Print offload_train_step_memory; return why it cannot run here, or None."""
    from marin_assets.train.distributed import offload

    problem = offload.host_offload_problem(mesh)
    if problem is not None:
        return f"offload_train_step_memory: the {mesh.devices.flat[0].platform} backend cannot compile it ({problem})"
    ours, reference = (step_memory(train_config(args, offload_optimizer=side), mesh) for side in (True, False))
    emit("offload_train_step_memory", "bytes", ours["device"], reference["device"], higher_is_better=False,
         details={"ours": ours, "reference": reference}, dtype=args.dtype, seq_len=args.seq, batch=args.batch)  # fmt: skip
    return None


def live_step(config, mesh):
    """A callable running one real step from a real state (the state is carried between calls)."""
    import jax
    import numpy as np

    from marin_assets.train.distributed import mesh as meshlib
    from marin_assets.train.loop import init_state

    step, _, (_, opt, model, _) = built_step(config, mesh)
    state = [meshlib.init_sharded(lambda: init_state(config, opt, model), mesh, config.fsdp)]
    rows = np.random.default_rng(0).integers(0, config.model.vocab_size, (config.batch_size, config.seq_len)).astype(np.int32)
    tokens = meshlib.shard_batch(mesh, rows, config.batch_size)

    def run():
        state[0], metrics = step(state[0], tokens, np.bool_(True), np.float32(1e-3))
        jax.block_until_ready(metrics)

    return run


def ep_transport_figure(args, mesh) -> None:
    sides = {t: live_step(train_config(args, model={"ep_transport": t}), mesh) for t in ("pooled", "ragged")}
    times = {t: [] for t in sides}
    for run in sides.values():
        run()  # compile
    for _ in range(args.iters):
        for t, run in sides.items():
            start = time.perf_counter()
            run()
            times[t].append(time.perf_counter() - start)
    ours, reference = (statistics.median(times[t]) for t in ("pooled", "ragged"))
    emit("ep_transport_step_time", "s", ours, reference, higher_is_better=False, mesh=dict(mesh.shape), iters=args.iters,
         tokens_per_step=args.batch * args.seq, dtype=args.dtype)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sizes = {"d_model": 512, "layers": 4, "heads": 8, "kv_heads": 4, "experts": 8, "top_k": 2, "expert_d_ff": 512,
             "seq": 1024, "batch": 8, "vocab": 32768, "iters": 10}  # fmt: skip
    for name, default in sizes.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--figures", default=",".join(FIGURES), help=f"comma-separated, of {FIGURES}")
    parser.add_argument("--host-devices", type=int, default=0, help="on CPU: this many host devices (the expert axis)")
    parser.add_argument("--quick", action="store_true", help="a tiny MoE: checks every path, its numbers are noise")
    args = parser.parse_args(argv)
    if args.quick:
        vars(args).update(QUICK)
    figures = [f for f in args.figures.split(",") if f]
    if unknown := set(figures) - set(FIGURES):
        parser.error(f"unknown figures {sorted(unknown)}; choose from {FIGURES}")
    if args.host_devices:
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={args.host_devices}"
    import jax

    from marin_assets.train.distributed import mesh as meshlib

    mesh = meshlib.make_mesh(train_config(args).model, expert=jax.device_count())
    refused = offload_figure(args, mesh) if "offload" in figures else None
    if "ep_transport" in figures:
        ep_transport_figure(args, mesh)
    if refused:
        print(refused, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
