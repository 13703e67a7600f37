"""Memory of the pooled-wave expert-parallel exchange (issue 24 item 2), compiled only, on host devices.

The routed-expert layer (``kernels.expert_parallel.ExpertParallel``) is compiled for one training
step's forward + backward at equal shapes, and XLA's ``memory_analysis().temp_size_in_bytes``
(what is live beyond the inputs and outputs, per device) is compared:

``pooled_wave_memory``: ``transport="pooled"`` with 3 waves (ours) vs ``"ragged"`` (reference).
    XLA:CPU has no ragged all_to_all, so ragged's exchange here is a dense one of blocks padded
    to the largest possible block (see the module's docstring): part of its bytes is that padding.
``pooled_wave_memory_all_waves``: 3 waves (ours) vs ``waves=1`` (reference: the same pool sent and
    run through the experts all at once). The shape is picked so both pools hold the same rows.

ratio = reference / ours (> 1: the waves hold less). The forward-only temp bytes are printed
beside each figure. Nothing is trained or run.

The grouped matmul is ``ragged_dot`` by default: the op the layer runs on TPU, whose temporaries
grow with the rows like the activations do (XLA:CPU lowers it densely, [local experts, rows, F],
so the activations weigh more here than on TPU). ``--grouped-matmul blocked`` (what "auto" picks
on CPU) gathers one [D, F] weight copy per block of rows, and for fewer rows ``default_block``
picks smaller blocks: at the default shape a wave's 376 rows make 27 blocks of 16, the whole
pool's 1128 rows 21 blocks of 64, and these copies outweigh the activations. We measured train
step temp bytes 1.05x vs ragged and 1.29x vs all waves at once with it, and the forward alone
0.87x and 0.83x (the waves hold more).

    .venv/bin/python benchmarks/pooled_wave_memory.py [--devices 8] [--tokens 510] [--top-k 2] [--d-model 256]
        [--expert-d-ff 512] [--experts 32] [--grouped-matmul ragged_dot]
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=8, help="host devices on the expert axis")
    ap.add_argument("--tokens", type=int, default=510, help="tokens per device")
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--expert-d-ff", type=int, default=512)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--grouped-matmul", default="ragged_dot", help="kernels.grouped_matmul.IMPLS (see the docstring)")
    args = ap.parse_args()
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={args.devices}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    import jax

    from kernels.expert_parallel import ExpertParallel, compiled_temp_bytes
    from kernels.grouped_matmul import resolve_impl

    mesh = jax.make_mesh((args.devices,), ("expert",))
    impl = args.grouped_matmul
    waves3, waves1 = (ExpertParallel(mesh, transport="pooled", waves=w, grouped_matmul=impl) for w in (3, 1))
    ragged = ExpertParallel(mesh, transport="ragged", grouped_matmul=impl)
    A = args.tokens * args.top_k
    if waves3.pool_rows(A) != waves1.pool_rows(A):
        raise SystemExit(
            f"pooled_wave_memory: at {args.tokens} tokens x top-{args.top_k} per device the pools differ "
            f"(3 waves: {waves3.pool_rows(A)} rows, 1 wave: {waves1.pool_rows(A)}); pick --tokens so "
            "ceil(1.10 * tokens * top_k / devices) is a multiple of 3"
        )
    shape = (args.devices * args.tokens, args.d_model, args.experts, args.expert_d_ff, args.top_k)
    layers = {"waves3": waves3, "waves1": waves1, "ragged": ragged}
    train = {name: compiled_temp_bytes(layer, *shape) for name, layer in layers.items()}
    fwd = {name: compiled_temp_bytes(layer, *shape, train=False) for name, layer in layers.items()}
    extra = {
        "devices": args.devices,
        "tokens_per_device": args.tokens,
        "top_k": args.top_k,
        "d_model": args.d_model,
        "expert_d_ff": args.expert_d_ff,
        "experts": args.experts,
        "grouped_matmul": resolve_impl(impl),
        "pool_rows": waves3.pool_rows(A),
        "expert_capacity": waves3.expert_capacity(A, args.experts // args.devices),
        "measure": "train step temp bytes",
    }
    for name, reference in (("pooled_wave_memory", "ragged"), ("pooled_wave_memory_all_waves", "waves1")):
        emit(
            name,
            "bytes/device",
            float(train["waves3"]),
            float(train[reference]),
            higher_is_better=False,
            reference_is=reference,
            forward_ours=fwd["waves3"],
            forward_reference=fwd[reference],
            **extra,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
