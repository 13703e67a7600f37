"""MoE train-step throughput: ours vs Levanter's Mixtral on the same shape, plus our MFU.

Both steps are jitted on the same shape and batch, warmed up, then timed in interleaved
iterations (ours, reference, ours, reference, ...) so machine-load drift hits both
sides alike; the reported time is each side's median. Levanter keeps its own defaults
(its grouped matmul is ``jax.lax.ragged_dot``); ours uses ``--grouped-matmul``
(default "auto", see kernels/grouped_matmul.py).

Prints JSON lines: {"name": "moe_train_step", "unit": "tokens/s", "ours", "reference",
"ratio" (= ours / reference), ...} and {"name": "moe_mfu", ...} against the matmul peak
measured in this same run (a big float32 jnp.dot).

  .venv/bin/python benchmarks/moe_step.py [--d-model 256 --layers 4 --experts 8 ...]
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
    import jax.numpy as jnp
    from marin_assets.model import ModelConfig, init_params, init_router_bias, loss_fn, next_router_bias
    c = ModelConfig(vocab_size=args.vocab, d_model=args.d_model, n_layers=args.layers,
                    n_heads=args.heads, n_kv_heads=args.kv_heads, d_ff=args.expert_d_ff,
                    n_routed_experts=args.experts, n_shared_experts=0, top_k=args.top_k,
                    expert_d_ff=args.expert_d_ff, max_seq_len=args.seq, lm_z_loss=0.0,
                    grouped_matmul=args.grouped_matmul)
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
    import jax.numpy as jnp
    import levanter.tracker
    levanter.tracker.jit_log = lambda *a, **k: None  # breaks under jax 0.7.2 tracing
    import levanter.models.mixtral as mixtral
    mixtral.levanter.tracker.jit_log = levanter.tracker.jit_log
    from levanter.models.lm_model import LmExample, compute_next_token_loss

    cfg = mixtral.MixtralConfig(seq_len=args.seq, hidden_dim=args.d_model,
                                intermediate_dim=args.expert_d_ff, num_layers=args.layers,
                                num_heads=args.heads, num_kv_heads=args.kv_heads,
                                n_routed_experts=args.experts, num_experts_per_tok=args.top_k,
                                gradient_checkpointing=False, use_flash_attention=False,
                                use_qk_norm=True, scan_layers=True, lbl_coef=None, rzl_coef=None)
    Vocab = hax.Axis("vocab", args.vocab)
    model = mixtral.MixtralLMHeadModel.init(Vocab, cfg, key=jax.random.PRNGKey(0))
    model = jax.tree.map(lambda x: x.astype(dtype) if eqx.is_inexact_array(x) else x, model)
    Batch, Pos = hax.Axis("batch", args.batch), cfg.Pos
    tokens = hax.named(jax.random.randint(jax.random.PRNGKey(1), (args.batch, args.seq), 0,
                                          args.vocab), (Batch, Pos))
    example = hax.vmap(LmExample.causal, Batch)(tokens)

    @eqx.filter_jit
    def step(model, example):
        loss, g = eqx.filter_value_and_grad(lambda m: compute_next_token_loss(m, example).scalar())(model)
        model = eqx.apply_updates(model, jax.tree.map(lambda g: -1e-3 * g, g))
        return model, loss

    return step, (model, example)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    for name, default in [("d-model", 256), ("layers", 4), ("heads", 4), ("kv-heads", 2),
                          ("experts", 8), ("top-k", 2), ("expert-d-ff", 512), ("seq", 256),
                          ("batch", 8), ("vocab", 1024), ("peak-n", 2048)]:
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--grouped-matmul", default="auto", choices=["auto", "ragged_dot", "blocked"])
    ap.add_argument("--iters", type=int, default=5, help="timed iterations per side (interleaved)")
    args = ap.parse_args()
    import jax
    import jax.numpy as jnp
    from marin_assets.model import flops_per_token
    dtype = jnp.dtype(args.dtype)
    tokens = args.batch * args.seq
    config, ours = ours_step(args, dtype)
    ours_s, ref_s = _interleaved([ours, levanter_step(args, dtype)], warmup=2, iters=args.iters)
    peak = matmul_peak(args.peak_n, dtype)
    shape = {k: v for k, v in vars(args).items() if k not in ("peak_n", "iters", "grouped_matmul")}
    ours_tps, ref_tps = tokens / ours_s, tokens / ref_s
    print(json.dumps({"name": "moe_train_step", "unit": "tokens/s", "ours": ours_tps,
                      "reference": ref_tps, "ratio": ours_tps / ref_tps,
                      "reference_impl": "levanter.models.mixtral", "backend": jax.default_backend(),
                      "grouped_matmul": args.grouped_matmul, "timing": f"median of {args.iters}, interleaved",
                      "shape": shape}))
    flops = flops_per_token(config, args.seq)
    print(json.dumps({"name": "moe_mfu", "unit": "fraction of measured matmul peak",
                      "ours": ours_tps * flops / peak, "reference": ref_tps * flops / peak,
                      "ratio": ours_tps / ref_tps, "peak_flops_per_s": peak,
                      "flops_per_token": flops, "backend": jax.default_backend()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
