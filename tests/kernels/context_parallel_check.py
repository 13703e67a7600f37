"""Context parallelism on 4 host devices: a 1x4 sequence split equals one device, the attention kernel and the
whole model (forward and gradients), at S = 4096 with document masking; prints one JSON object of max
differences. Run as a subprocess (XLA_FLAGS must be set before jax is imported):
``python tests/kernels/context_parallel_check.py``."""

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402
import sys  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from kernels.attention import SequenceParallel, causal_attention  # noqa: E402
from marin_assets.model import ModelConfig, init_params, loss_fn  # noqa: E402

S = 4096
DOCS = [700, 1300, 96, 1000, 1000]  # row 0's documents; they cross the 1024-token chunk boundaries


def max_diff(a, b) -> float:
    """The largest |a - b| relative to max(1, |b|), over every leaf."""
    return max(
        float(jnp.max(jnp.abs(x - y) / jnp.maximum(1.0, jnp.abs(y))))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def kernel_diffs(sp: SequenceParallel, segments) -> dict:
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    q = jax.random.normal(keys[0], (2, S, 4, 16))
    k, v = (jax.random.normal(key, (2, S, 2, 16)) for key in keys[1:3])
    cotangent = jax.random.normal(keys[3], q.shape)
    window = 300  # a window and documents: every mask at once

    def loss(attend):
        return jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(attend(q, k, v) * cotangent), argnums=(0, 1, 2)))

    one = loss(lambda q, k, v: causal_attention(q, k, v, segment_ids=segments, window=window, impl="blockwise"))
    split = loss(lambda q, k, v: sp(q, k, v, segments, window))
    return {f"kernel_window_{window}": max_diff(split(q, k, v)[1], one(q, k, v)[1])}


def model_diffs(sp: SequenceParallel, segments) -> dict:
    config = ModelConfig(
        vocab_size=256,
        d_model=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        d_ff=64,
        n_routed_experts=0,
        max_seq_len=S,
        attention_impl="blockwise",
        rope_per_document=True,
        sliding_window=512,
        global_attention_every=2,
    )
    params = init_params(config, jax.random.PRNGKey(1))
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, 256, (2, S)), jnp.int32)
    bias = jnp.zeros((config.n_layers, 0))

    def run(split):
        def loss(p):
            return loss_fn(p, tokens, config, bias, segment_ids=segments, sp=split)

        return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)

    (loss_one, _), grads_one = run(None)
    (loss_split, _), grads_split = run(sp)
    return {
        "model_loss": max_diff(loss_split, loss_one),
        "model_grads": max_diff(grads_split, grads_one),
        "loss": float(loss_one),
    }


def main() -> None:
    mesh = jax.make_mesh((1, 4), ("data", "sequence"))
    sp = SequenceParallel(mesh, "sequence", ("data",))
    segments = jnp.asarray(np.stack([np.repeat(np.arange(len(DOCS)), DOCS), np.zeros(S, int)]), jnp.int32)
    report = {"devices": jax.device_count(), "split": sp.size} | kernel_diffs(sp, segments) | model_diffs(sp, segments)
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main()
