"""Attention equivalence on this machine's accelerator: every kernel that runs here against the naive
reference, outputs and gradients, with document masking and a sliding window. On an NVIDIA GPU that is
cuDNN flash attention (bf16: checked against the reference in fp32 at bf16's tolerance) and the blockwise
and XLA paths (fp32, 1e-5); on CPU the cuDNN line says it was skipped. One JSON line per check:
{"name", "impl", "dtype", "max_abs_diff", "tolerance", "ok"}; exit status 1 when a check fails.

    python benchmarks/device_check_attention.py [--seq 4096]
"""

from __future__ import annotations

import argparse
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from kernels.attention import causal_attention

TOLERANCE = {"float32": 1e-5, "bfloat16": 3e-2}
# fp32 means fp32: an NVIDIA GPU would otherwise run fp32 matmuls in TF32 (~1e-3), on both sides differently
jax.config.update("jax_default_matmul_precision", "highest")


def inputs(seq: int, dtype):
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    q = jax.random.normal(keys[0], (2, seq, 8, 128), jnp.float32)
    k, v = (jax.random.normal(key, (2, seq, 2, 128), jnp.float32) for key in keys[1:3])
    cotangent = jax.random.normal(keys[3], q.shape, jnp.float32)
    lengths = [seq // 3, seq // 4, seq - seq // 3 - seq // 4]  # row 0: three documents; row 1: one
    segments = jnp.asarray(np.stack([np.repeat(np.arange(3), lengths), np.zeros(seq, int)]), jnp.int32)
    return [x.astype(dtype) for x in (q, k, v)], cotangent, segments


def outputs_and_grads(impl: str, qkv, cotangent, segments, window):
    def loss(q, k, v):
        out = causal_attention(q, k, v, segment_ids=segments, window=window, impl=impl)
        return jnp.sum(out.astype(jnp.float32) * cotangent), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(*qkv)
    return [out, *grads]


def check(impl: str, dtype: str, seq: int, window) -> dict:
    qkv, cotangent, segments = inputs(seq, jnp.dtype(dtype))
    reference = outputs_and_grads("reference", [x.astype(jnp.float32) for x in qkv], cotangent, segments, window)
    got = outputs_and_grads(impl, qkv, cotangent, segments, window)
    diff = max(float(jnp.max(jnp.abs(a.astype(jnp.float32) - b))) for a, b in zip(got, reference, strict=True))
    return {
        "name": "attention_equivalence",
        "impl": impl,
        "dtype": dtype,
        "seq": seq,
        "window": window,
        "max_abs_diff": diff,
        "tolerance": TOLERANCE[dtype],
        "ok": diff <= TOLERANCE[dtype],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seq", type=int, default=4096)
    args = ap.parse_args()
    gpu = jax.default_backend() == "gpu"
    cases = [("blockwise", "float32"), ("xla", "float32")] + ([("cudnn", "bfloat16")] if gpu else [])
    failed = 0
    for impl, dtype in cases:
        for window in (None, 1024):
            line = check(impl, dtype, args.seq, window)
            failed += not line["ok"]
            print(json.dumps(line), flush=True)
    if not gpu:
        print(json.dumps({"name": "attention_equivalence", "impl": "cudnn", "skipped": f"backend {jax.default_backend()}"}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
