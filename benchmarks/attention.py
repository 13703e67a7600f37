"""attention: train-step memory and time of the blockwise attention kernel vs the naive reference.

The model is the demo's main-run model (_common.DEMO_MODEL with assets/run_plan.py's DEMO_BASE.model:
no shared expert, softmax router, no balancing bias; byte tokens) with
max_seq_len raised to each S, batch 1, fp32, no remat. The step is the jitted
``jax.value_and_grad(model.loss_fn, has_aux=True)`` (forward, loss and every gradient; no optimizer,
which is the same for both sides). The two sides differ only in ``ModelConfig.attention_impl``:
  ours       "blockwise"  (kernels/attention.py: blocks of 512 queries and keys, each query block visiting only the key blocks it may see; custom VJP; memory linear in S)
  reference  "reference"  (the full [B, KV, G, S, S] fp32 score tensor)

Memory is compile-only: the step is lowered on jax.ShapeDtypeStruct inputs (nothing is allocated)
and XLA's ``compiled.memory_analysis()`` is read; the figure is argument + output + temp bytes
(``memory`` below; the parts are in ``details``), which is what one step holds at its peak by XLA's
buffer assignment. Step time runs real arrays on this host's backend (CPU here): one warm-up call,
then the median of --repeats, the sides alternating.

JSON lines (ratio > 1: ours is better; target: memory ratio >= 8 at S=8192):
  attention_train_step_memory_S{S}   bytes, ratio = reference / ours, for each S in --mem-seqs
  attention_train_step_memory_growth memory(S_max) / memory(S_prev) of each side (linear ~ x, quadratic ~ x^2),
                                     ratio = reference growth / ours growth
  attention_train_step_time_S{S}     seconds per step at --time-seq, ratio = reference / ours
  attention_context_parallel_S{S}    bytes a device holds for the blockwise step at --time-seq on a 1 x --cp-devices
                                     sequence split (ours: kernels/attention.SequenceParallel, each device its chunk of
                                     queries over the all-gathered keys) vs the same step on one device (reference),
                                     both compiled on --cp-devices host CPU devices in a child process; ratio =
                                     reference / ours. Extra: each side's seconds per step there (the devices share
                                     this machine's cores: not a speed-up) and the largest |difference| of loss and
                                     gradients between them. --cp-devices 0 skips it (the GPU check: one device).

    .venv/bin/python benchmarks/attention.py [--quick]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from _common import DEMO_MODEL, compiled_bytes, emit  # noqa: E402

# assets/run_plan.py DEMO_BASE.model differs from _common.DEMO_MODEL in these (the demo's current model)
DEMO_OVERRIDES = {"n_shared_experts": 0, "router_gating": "softmax", "balancing": "none"}
# --quick: a one-layer dense model, so the smoke test's compiles take seconds
TINY_OVERRIDES = {"n_layers": 1, "n_routed_experts": 0}
SIDES = {"ours": "blockwise", "reference": "reference"}
MODEL = {**DEMO_MODEL, **DEMO_OVERRIDES}


def model_config(seq_len: int, impl: str):
    from marin_assets.model import ModelConfig

    return ModelConfig(**MODEL, max_seq_len=seq_len, attention_impl=impl)


def train_step(config):
    """The jitted value_and_grad of the model's loss, the config closed over (static)."""
    import jax

    from marin_assets.model import loss_fn

    return jax.jit(jax.value_and_grad(functools.partial(loss_fn, config=config), has_aux=True))


def step_inputs(config, seq_len: int, abstract: bool):
    """(params, tokens [1, S], router_bias): shapes only when ``abstract``, else real arrays."""
    import jax
    import jax.numpy as jnp

    from marin_assets.model import init_params, init_router_bias

    make_params = functools.partial(init_params, config, jax.random.PRNGKey(0))
    if abstract:
        return (
            jax.eval_shape(make_params),
            jax.ShapeDtypeStruct((1, seq_len), jnp.int32),
            jax.eval_shape(lambda: init_router_bias(config)),
        )
    tokens = jax.random.randint(jax.random.PRNGKey(1), (1, seq_len), 0, config.vocab_size, jnp.int32)
    return make_params(), tokens, init_router_bias(config)


@functools.cache
def compiled_step(impl: str, seq_len: int):
    """(the step compiled for batch 1 x seq_len on shapes alone, compile seconds); reused by the timing."""
    config = model_config(seq_len, impl)
    params, tokens, bias = step_inputs(config, seq_len, abstract=True)
    start = time.perf_counter()
    compiled = train_step(config).lower(params, tokens, router_bias=bias).compile()
    return compiled, time.perf_counter() - start


def compiled_memory(impl: str, seq_len: int) -> dict:
    """XLA's memory analysis of the compiled step (compile only, nothing allocated)."""
    compiled, compile_s = compiled_step(impl, seq_len)
    stats = compiled.memory_analysis()
    parts = {k: int(getattr(stats, f"{k}_size_in_bytes")) for k in ("argument", "output", "temp", "alias")}
    return {
        "memory": compiled_bytes(stats),
        **parts,
        "compile_s": round(compile_s, 2),
    }


def step_time(seq_len: int, repeats: int) -> dict[str, float]:
    """Median wall seconds of one step per side (after a warm-up call that compiles it)."""
    import jax

    runs = {}
    for side, impl in SIDES.items():
        config = model_config(seq_len, impl)
        params, tokens, bias = step_inputs(config, seq_len, abstract=False)
        runs[side] = functools.partial(compiled_step(impl, seq_len)[0], params, tokens, router_bias=bias)
        jax.block_until_ready(runs[side]())
    times: dict[str, list[float]] = {side: [] for side in runs}
    for _ in range(repeats):
        for side, run in runs.items():
            start = time.perf_counter()
            jax.block_until_ready(run())
            times[side].append(time.perf_counter() - start)
    return {side: statistics.median(t) for side, t in times.items()}


def memory_figures(seqs: list[int]) -> None:
    measured = {}
    for seq in seqs:
        measured[seq] = {side: compiled_memory(impl, seq) for side, impl in SIDES.items()}
        ours, ref = measured[seq]["ours"], measured[seq]["reference"]
        emit(
            f"attention_train_step_memory_S{seq}",
            "bytes",
            ours["memory"],
            ref["memory"],
            higher_is_better=False,
            seq_len=seq,
            batch=1,
            measure="argument + output + temp - alias bytes of the compiled value_and_grad",
            details=measured[seq],
        )
    lo, hi = seqs[-2], seqs[-1]
    growth = {side: measured[hi][side]["memory"] / measured[lo][side]["memory"] for side in SIDES}
    emit(
        "attention_train_step_memory_growth",
        "x",
        growth["ours"],
        growth["reference"],
        higher_is_better=False,
        seq_lens=[lo, hi],
        linear=hi / lo,
        quadratic=(hi / lo) ** 2,
        temp_growth={side: round(measured[hi][side]["temp"] / measured[lo][side]["temp"], 3) for side in SIDES},
    )


def context_parallel_child(seq_len: int, devices: int, repeats: int) -> None:
    """(In a child whose XLA_FLAGS gave it ``devices`` host devices.) The blockwise step on one device and on a
    1 x devices sequence split: per-device memory, time, and how far apart their results are."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from kernels.attention import SequenceParallel
    from marin_assets.model import loss_fn

    config = model_config(seq_len, "blockwise")
    mesh = jax.make_mesh((1, devices), ("data", "sequence"))
    sides = {"ours": SequenceParallel(mesh, "sequence", ("data",)), "reference": None}
    row_split = NamedSharding(mesh, P("data", "sequence"))
    params, tokens, bias = step_inputs(config, seq_len, abstract=False)
    measured, results = {}, {}
    for side, sp in sides.items():
        step = jax.jit(jax.value_and_grad(functools.partial(loss_fn, config=config, sp=sp), has_aux=True))
        side_tokens = jax.device_put(tokens, row_split) if sp is not None else tokens
        compiled = step.lower(params, side_tokens, router_bias=bias).compile()
        memory = compiled_bytes(compiled.memory_analysis())
        run = functools.partial(compiled, params, side_tokens, router_bias=bias)
        results[side] = jax.block_until_ready(run())
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(run())
            times.append(time.perf_counter() - start)
        measured[side] = {"memory": memory, "step_s": round(statistics.median(times), 4)}
    (loss, _), grads = results["ours"]
    (ref_loss, _), ref_grads = results["reference"]
    grad_diff = max(
        float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads))
    )
    emit(
        f"attention_context_parallel_S{seq_len}",
        "bytes",
        measured["ours"]["memory"],
        measured["reference"]["memory"],
        higher_is_better=False,
        seq_len=seq_len,
        devices=devices,
        measure="argument + output + temp - alias bytes a device holds (compiled value_and_grad)",
        details=measured,
        loss_diff=abs(float(loss) - float(ref_loss)),
        grad_max_diff=grad_diff,
    )


def context_parallel_figure(seq_len: int, devices: int, repeats: int) -> None:
    """Run context_parallel_child in a child process with ``devices`` host CPU devices (fixed when JAX starts)."""
    import subprocess

    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
    env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    argv = [sys.executable, os.path.abspath(__file__), "--cp-child", "--time-seq", str(seq_len), "--cp-devices", str(devices)]
    argv += ["--repeats", str(repeats)] + (["--quick"] if MODEL.get("n_layers") == TINY_OVERRIDES["n_layers"] else [])
    subprocess.run(argv, env=env, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mem-seqs", type=int, nargs="+", default=[2048, 8192, 32768])
    parser.add_argument("--time-seq", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cp-devices", type=int, default=4, help="the context-parallel figure's host devices (0: skip it)")
    parser.add_argument("--cp-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="1-layer dense model, S 512/1024, time at 1024")
    args = parser.parse_args()
    if args.quick:
        args.mem_seqs, args.repeats = [512, 1024], 1
        args.time_seq = 1024 if not args.cp_child else args.time_seq
        MODEL.update(TINY_OVERRIDES)
    if args.cp_child:
        context_parallel_child(args.time_seq, args.cp_devices, args.repeats)
        return
    if len(args.mem_seqs) < 2:
        parser.error("--mem-seqs needs at least two lengths (the growth figure)")
    import jax  # on whatever backend this machine has (the device check runs it on a GPU)

    memory_figures(args.mem_seqs)
    times = step_time(args.time_seq, args.repeats)
    emit(
        f"attention_train_step_time_S{args.time_seq}",
        "s",
        times["ours"],
        times["reference"],
        higher_is_better=False,
        seq_len=args.time_seq,
        batch=1,
        dtype="float32",
        repeats=args.repeats,
        backend=jax.default_backend(),
    )
    if args.cp_devices:
        context_parallel_figure(args.time_seq, args.cp_devices, args.repeats)


if __name__ == "__main__":
    main()
