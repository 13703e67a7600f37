"""Mixed precision and activation rematerialisation of the real train step (issue 25 items 2, 3).

``bf16_step``: seconds per train step (``marin_assets.train.step.make_train_step``, guards and
optimizer included) with ``compute_dtype="bfloat16"`` (ours) vs ``"float32"`` (reference), same
config, batch and state; ratio = fp32 / bf16 time (> 1: bf16 is faster). Both steps are compiled
and warmed up first, then timed round-robin (fp32, bf16, fp32, ...) so machine-load drift hits
both alike; each side's median is reported. On a CPU without native bf16 matmuls XLA converts
operands, so the ratio may well be < 1 there; it is reported as measured.

``remat_peak_memory``: temporary bytes of the compiled fp32 train step
(``memory_analysis().temp_size_in_bytes``) with ``remat="full"`` (ours) vs ``"none"``
(reference); ratio = none / full. ``save_matmuls`` is printed beside them.

    .venv/bin/python benchmarks/precision.py [--config examples/tiny_moe.yaml] [--layers 4] [--iters 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
from _common import emit  # noqa: E402


def build(config, concrete: bool = True):
    """(jitted step, state, batch) for ``config`` on the one-process mesh ``train`` builds; with
    ``concrete=False`` the state and batch are shapes only (enough to lower and compile)."""
    import jax
    import numpy as np

    from marin_assets.train.distributed import mesh as meshlib
    from marin_assets.train.loop import default_model, init_state, make_train_step, state_layout

    model = default_model()
    mesh = meshlib.make_mesh(config.model)
    opt, shapes, state_sh = state_layout(config, model, mesh)
    init = lambda: init_state(config, opt, model)  # noqa: E731
    step = make_train_step(config, opt, model, mesh, state_sh)
    if not concrete:
        return step, shapes, jax.ShapeDtypeStruct((config.batch_size, config.seq_len), np.int32)
    rows = np.random.default_rng(0).integers(0, config.model.vocab_size, (config.batch_size, config.seq_len))
    return (
        step,
        meshlib.init_sharded(init, mesh, config.fsdp),
        meshlib.shard_batch(mesh, rows.astype(np.int32), config.batch_size),
    )


def temp_bytes(config) -> int:
    """Temporary bytes XLA allocates for one compiled train step of ``config``."""
    import numpy as np

    step, state, tokens = build(config, concrete=False)
    compiled = step.lower(state, tokens, np.bool_(True), np.float32(1e-3)).compile()
    return int(compiled.memory_analysis().temp_size_in_bytes)


def step_seconds(configs: dict, warmup: int, iters: int) -> dict[str, float]:
    """Median seconds per step of each config, timed round-robin (the step donates its state)."""
    import jax
    import numpy as np

    ok, lr = np.bool_(True), np.float32(1e-3)
    cases = {name: build(config) for name, config in configs.items()}
    states = {name: state for name, (_, state, _) in cases.items()}
    times: dict[str, list[float]] = {name: [] for name in cases}
    for i in range(warmup + iters):
        for name, (step, _, tokens) in cases.items():
            t0 = time.perf_counter()
            states[name], metrics = step(states[name], tokens, ok, lr)
            jax.block_until_ready(metrics)
            if i >= warmup:
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "examples" / "tiny_moe.yaml"))
    ap.add_argument("--layers", type=int, default=None, help="override model.n_layers (default: the config's)")
    ap.add_argument("--iters", type=int, default=10, help="timed steps per side (after 2 warm-up steps)")
    args = ap.parse_args()

    import jax

    from marin_assets.train.config import load_config, replace

    config = load_config(args.config)
    if args.layers is not None:
        config = replace(config, model={"n_layers": args.layers})
    shape = {
        "layers": config.model.n_layers,
        "d_model": config.model.d_model,
        "batch": config.batch_size,
        "seq_len": config.seq_len,
        "device": jax.devices()[0].platform,
    }

    seconds = step_seconds({"float32": config, "bfloat16": replace(config, compute_dtype="bfloat16")}, 2, args.iters)
    emit("bf16_step", "s/step", seconds["bfloat16"], seconds["float32"], higher_is_better=False, iters=args.iters, **shape)

    temp = {policy: temp_bytes(replace(config, remat=policy)) for policy in ("none", "full", "save_matmuls")}
    emit(
        "remat_peak_memory",
        "temp bytes",
        temp["full"],
        temp["none"],
        higher_is_better=False,
        save_matmuls=temp["save_matmuls"],
        **shape,
    )


if __name__ == "__main__":
    main()
