"""MoE train-step throughput: ours vs Levanter's Mixtral on the same shape, plus our MFU.

Both steps are jitted on the same shape and batch, warmed up, then timed in interleaved
iterations (ours, reference, ours, reference, ...) so machine-load drift hits both
sides alike; the reported time is each side's median. Levanter keeps its own defaults
(its grouped matmul is ``jax.lax.ragged_dot``); ours uses ``--grouped-matmul``
(default "auto", see kernels/grouped_matmul.py).

Prints JSON lines: {"name": "moe_train_step", "unit": "tokens/s", "ours", "reference",
"ratio" (= ours / reference), ...} and {"name": "moe_mfu", ...} against the matmul peak
measured in this same run (a big float32 jnp.dot).

``moe_train_step_ep``: the same model trained on the ("data", "expert") mesh of
marin_assets/train/distributed/mesh.py with the EP layer, as P processes x D/P devices (jax.distributed,
gloo on CPU) vs 1 process x D devices, same mesh shape, same global batch; ours = the
multi-process tokens/s, reference = the single-process one. Each side runs in its own
child processes (device counts are fixed when JAX starts). On one CPU host this measures
what the cross-process collectives cost; there is no target.

  .venv/bin/python benchmarks/moe_step.py [--d-model 256 --layers 4 --experts 8 ...]
  .venv/bin/python benchmarks/moe_step.py --figures moe_train_step_ep --ep-devices 4 --ep-processes 2
"""

from __future__ import annotations

import argparse
import json
import time


def _time(fn, *args, warmup=2, iters=5):
    return _interleaved([(fn, args)], warmup, iters)[0]


def _interleaved(cases, warmup: int, iters: int) -> list[float]:
    """Median seconds per call of each (fn, args), timed round-robin across the cases."""
    import statistics

    import jax

    for fn, args in cases:
        for _ in range(warmup):
            jax.block_until_ready(fn(*args))
    times = [[] for _ in cases]
    for _ in range(iters):
        for i, (fn, args) in enumerate(cases):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def matmul_peak(n: int, dtype) -> float:
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), dtype)
    dot = jax.jit(jnp.dot)
    return 2 * n**3 / _time(dot, a, b, iters=5)


def ours_step(args, dtype):
    import jax

    from marin_assets.model import init_params, init_router_bias, loss_fn, next_router_bias

    c = model_config(args)
    params = jax.tree.map(lambda x: x.astype(dtype), init_params(c, jax.random.PRNGKey(0)))
    bias = init_router_bias(c)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (args.batch, args.seq), 0, args.vocab)

    @jax.jit
    def step(params, bias, tokens):  # plain SGD: the same update on both sides
        (loss, aux), g = jax.value_and_grad(loss_fn, has_aux=True)(params, tokens, c, bias)
        params = jax.tree.map(lambda p, g: p - 1e-3 * g, params, g)
        return params, next_router_bias(bias, aux, c), loss

    return c, (step, (params, bias, tokens))


def levanter_step(args, dtype):
    import equinox as eqx
    import haliax as hax
    import jax
    import levanter.tracker

    levanter.tracker.jit_log = lambda *a, **k: None  # breaks under jax 0.7.2 tracing
    import levanter.models.mixtral as mixtral

    mixtral.levanter.tracker.jit_log = levanter.tracker.jit_log
    from levanter.models.lm_model import LmExample, compute_next_token_loss

    cfg = mixtral.MixtralConfig(
        seq_len=args.seq,
        hidden_dim=args.d_model,
        intermediate_dim=args.expert_d_ff,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        n_routed_experts=args.experts,
        num_experts_per_tok=args.top_k,
        gradient_checkpointing=False,
        use_flash_attention=False,
        use_qk_norm=True,
        scan_layers=True,
        lbl_coef=None,
        rzl_coef=None,
    )
    Vocab = hax.Axis("vocab", args.vocab)
    model = mixtral.MixtralLMHeadModel.init(Vocab, cfg, key=jax.random.PRNGKey(0))
    model = jax.tree.map(lambda x: x.astype(dtype) if eqx.is_inexact_array(x) else x, model)
    Batch, Pos = hax.Axis("batch", args.batch), cfg.Pos
    tokens = hax.named(jax.random.randint(jax.random.PRNGKey(1), (args.batch, args.seq), 0, args.vocab), (Batch, Pos))
    example = hax.vmap(LmExample.causal, Batch)(tokens)

    @eqx.filter_jit
    def step(model, example):
        loss, g = eqx.filter_value_and_grad(lambda m: compute_next_token_loss(m, example).scalar())(model)
        model = eqx.apply_updates(model, jax.tree.map(lambda g: -1e-3 * g, g))
        return model, loss

    return step, (model, example)


def model_config(args):
    from marin_assets.model import ModelConfig

    return ModelConfig(
        vocab_size=args.vocab,
        d_model=args.d_model,
        n_layers=args.layers,
        n_heads=args.heads,
        n_kv_heads=args.kv_heads,
        d_ff=args.expert_d_ff,
        n_routed_experts=args.experts,
        n_shared_experts=0,
        top_k=args.top_k,
        expert_d_ff=args.expert_d_ff,
        max_seq_len=args.seq,
        lm_z_loss=0.0,
        grouped_matmul=args.grouped_matmul,
        ep_transport=args.ep_transport,
    )


def ep_child(args) -> int:
    """One process of an EP run (started by ``ep_side``); process 0 prints the median step time."""
    from marin_assets.train.distributed import hosts as distributed
    from marin_assets.train.distributed import mesh as meshlib

    setup = distributed.init_distributed()
    import jax
    import jax.numpy as jnp
    import numpy as np

    from marin_assets.model import init_params, init_router_bias, loss_fn, next_router_bias

    c = model_config(args)
    mesh = meshlib.make_mesh(c, expert=args.ep_expert)
    meshlib.check_fits(mesh, c, args.batch, args.seq)
    ep = meshlib.expert_parallel(mesh, c)
    dtype = jnp.dtype(args.dtype)
    state = meshlib.init_sharded(
        lambda: {
            "params": jax.tree.map(lambda x: x.astype(dtype), init_params(c, jax.random.PRNGKey(0))),
            "bias": init_router_bias(c),
        },
        mesh,
    )

    def step(state, tokens):  # plain SGD, as in ours_step
        (loss, aux), g = jax.value_and_grad(loss_fn, has_aux=True)(state["params"], tokens, c, state["bias"], None, ep)
        params = jax.tree.map(lambda p, g: p - 1e-3 * g, state["params"], g)
        return {"params": params, "bias": next_router_bias(state["bias"], aux, c)}, loss

    step_fn = meshlib.jit_step(step, mesh, meshlib.state_shardings(mesh, state), n_scalars=0)
    batch = np.random.default_rng(1).integers(0, args.vocab, (args.batch, args.seq), dtype=np.int32)
    tokens = meshlib.shard_batch(mesh, batch[meshlib.process_rows(mesh, args.batch)], args.batch)
    times = []
    for i in range(2 + args.iters):  # two warm-up steps (compile, first run)
        t0 = time.perf_counter()
        state, loss = step_fn(state, tokens)
        jax.block_until_ready(loss)
        times.append(time.perf_counter() - t0)
    distributed.barrier("moe_step_ep_done")
    if setup.process_id == 0:
        import statistics

        print(
            json.dumps(
                {
                    "seconds": statistics.median(times[2:]),
                    "loss": float(loss),
                    "mesh": dict(mesh.shape),
                    "processes": setup.num_processes,
                }
            ),
            flush=True,
        )
    return 0


def ep_side(argv: list[str], processes: int, devices: int, timeout: float) -> dict:
    """Run ``processes`` children with devices/processes devices each; process 0's result."""
    import os
    import socket
    import subprocess
    import sys

    from marin_assets.train.distributed.hosts import local_env

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for pid in range(processes):
        env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
        env.update(
            local_env(pid, processes, port, devices // processes)
            if processes > 1
            else {"MARIN_DEVICES_PER_PROCESS": str(devices)}
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, *argv, "--ep-child"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, outs):
        if p.returncode != 0:
            raise RuntimeError(f"EP benchmark child failed (rc {p.returncode}): {err[-2000:]}")
    return json.loads(outs[0][0].strip().splitlines()[-1])


def ep_figure(args, argv: list[str]) -> None:
    if args.ep_devices % args.ep_processes:
        raise SystemExit(f"--ep-devices {args.ep_devices} is not divisible by --ep-processes {args.ep_processes}")
    single = ep_side(argv, 1, args.ep_devices, args.ep_timeout)
    multi = ep_side(argv, args.ep_processes, args.ep_devices, args.ep_timeout)
    tokens = args.batch * args.seq
    ours, ref = tokens / multi["seconds"], tokens / single["seconds"]
    shape = {
        k: getattr(args, k)
        for k in ("d_model", "layers", "heads", "kv_heads", "experts", "top_k", "expert_d_ff", "seq", "batch", "vocab", "dtype")
    }
    print(
        json.dumps(
            {
                "name": "moe_train_step_ep",
                "unit": "tokens/s",
                "ours": ours,
                "reference": ref,
                "ratio": ours / ref,
                "ours_layout": f"{args.ep_processes} processes x {args.ep_devices // args.ep_processes} devices",
                "reference_layout": f"1 process x {args.ep_devices} devices",
                "mesh": multi["mesh"],
                "transport": args.ep_transport,
                "loss_diff": abs(multi["loss"] - single["loss"]),
                "timing": f"median of {args.iters} after 2 warm-up steps, each side alone",
                "shape": shape,
            }
        ),
        flush=True,
    )


def main() -> int:
    import sys

    ap = argparse.ArgumentParser(description=__doc__)
    for name, default in [
        ("d-model", 256),
        ("layers", 4),
        ("heads", 4),
        ("kv-heads", 2),
        ("experts", 8),
        ("top-k", 2),
        ("expert-d-ff", 512),
        ("seq", 256),
        ("batch", 8),
        ("vocab", 1024),
        ("peak-n", 2048),
    ]:
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--grouped-matmul", default="auto", choices=["auto", "ragged_dot", "blocked"])
    ap.add_argument("--iters", type=int, default=5, help="timed iterations per side (interleaved)")
    ap.add_argument(
        "--figures",
        default="moe_train_step,moe_train_step_ep",
        help="comma-separated: moe_train_step (with moe_mfu), moe_train_step_ep",
    )
    ap.add_argument("--ep-devices", type=int, default=4, help="devices in both EP layouts")
    ap.add_argument("--ep-processes", type=int, default=2, help="processes of the multi-process layout")
    ap.add_argument("--ep-expert", type=int, default=2, help="expert axis size (same for both layouts)")
    ap.add_argument("--ep-transport", default="ragged", choices=["ragged", "pooled"])
    ap.add_argument("--ep-timeout", type=float, default=900.0, help="seconds per layout")
    ap.add_argument("--ep-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.ep_child:
        return ep_child(args)
    figures = set(args.figures.split(","))
    unknown = figures - {"moe_train_step", "moe_train_step_ep"}
    if unknown:
        raise SystemExit(f"unknown --figures {sorted(unknown)}")
    if "moe_train_step_ep" in figures:
        ep_figure(args, [a for a in sys.argv[1:]])
    if "moe_train_step" not in figures:
        return 0
    import jax
    import jax.numpy as jnp

    from marin_assets.model import flops_per_token

    dtype = jnp.dtype(args.dtype)
    tokens = args.batch * args.seq
    config, ours = ours_step(args, dtype)
    ours_s, ref_s = _interleaved([ours, levanter_step(args, dtype)], warmup=2, iters=args.iters)
    peak = matmul_peak(args.peak_n, dtype)
    shape = {
        k: v
        for k, v in vars(args).items()
        if k not in ("peak_n", "iters", "grouped_matmul", "figures", "ep_child") and not k.startswith("ep_")
    }
    ours_tps, ref_tps = tokens / ours_s, tokens / ref_s
    print(
        json.dumps(
            {
                "name": "moe_train_step",
                "unit": "tokens/s",
                "ours": ours_tps,
                "reference": ref_tps,
                "ratio": ours_tps / ref_tps,
                "reference_impl": "levanter.models.mixtral",
                "backend": jax.default_backend(),
                "grouped_matmul": args.grouped_matmul,
                "timing": f"median of {args.iters}, interleaved",
                "shape": shape,
            }
        )
    )
    flops = flops_per_token(config, args.seq)
    print(
        json.dumps(
            {
                "name": "moe_mfu",
                "unit": "fraction of measured matmul peak",
                "ours": ours_tps * flops / peak,
                "reference": ref_tps * flops / peak,
                "ratio": ours_tps / ref_tps,
                "peak_flops_per_s": peak,
                "flops_per_token": flops,
                "backend": jax.default_backend(),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
