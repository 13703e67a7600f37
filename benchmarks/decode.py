"""decode: tokens/s of KV-cached greedy decoding vs re-running the full forward for each new token.

The demo's main-run model (_common.DEMO_MODEL, random init, max_seq_len 512), --batch prompts of
different lengths (random ids), --new-tokens greedy tokens each:
  ours       model/decode.py Generator: one prefill, then one token per row per step against the cache
             (the steps run in on-device loops of decode.CHUNK_STEPS).
  reference  a jitted full forward over the prompt and the tokens so far (right-padded: causal, so the
             padding never changes a prefix's logits), the argmax at each row's last token appended;
             the length is rounded up to a power of two, as ours is, so it compiles once per bucket too.
Both are compiled before the timing (a warm-up call each); each side's time is the median of
--repeats, the sides alternating. ``identical`` says both produced the same tokens (the run fails
otherwise: greedy decoding with the cache must be the full forward's argmax).

One JSON line (ratio > 1: we are better; target >= 5):
  decode_cached  tokens/s generated, ours vs reference
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from _common import DEMO_MODEL, emit  # noqa: E402


def reference_decoder(params, config, bias):
    """Greedy decoding that re-runs the full forward for every new token (one compile per length bucket)."""
    import jax
    import jax.numpy as jnp

    from marin_assets.model import forward
    from marin_assets.model.decode import bucket

    @jax.jit
    def next_tokens(params, bias, tokens, last):
        logits, _ = forward(params, tokens, config, bias)
        return jnp.argmax(jnp.take_along_axis(logits, last[:, None, None], axis=1)[:, 0], axis=-1).astype(jnp.int32)

    def run(prompts: list[list[int]], new: int) -> list[list[int]]:
        lengths = np.asarray([len(p) for p in prompts], np.int32)
        buf = np.zeros((len(prompts), bucket(int(lengths.max()) + new)), np.int32)
        for row, prompt in enumerate(prompts):
            buf[row, : len(prompt)] = prompt
        buf = jnp.asarray(buf)
        rows = jnp.arange(len(prompts))
        for t in range(new):
            width = bucket(int(lengths.max()) + t, 8)
            token = next_tokens(params, bias, buf[:, :width], jnp.asarray(lengths - 1 + t))
            buf = buf.at[rows, jnp.asarray(lengths + t)].set(token)
        buf = np.asarray(buf)
        return [buf[row, n : n + new].tolist() for row, n in enumerate(lengths)]

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="2 prompts, 16 new tokens, 1 repeat (the smoke test)")
    args = parser.parse_args()
    if args.quick:
        args.batch, args.new_tokens, args.repeats = 2, 16, 1

    import jax

    from marin_assets.model import ModelConfig, init_params, init_router_bias
    from marin_assets.model.decode import Generator

    config = ModelConfig(**DEMO_MODEL, max_seq_len=512)
    params, bias = init_params(config, jax.random.PRNGKey(0)), init_router_bias(config)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, config.vocab_size, 16 + 8 * i).tolist() for i in range(args.batch)]
    ours, reference = Generator(params, config, bias), reference_decoder(params, config, bias)
    sides = {
        "ours": lambda: ours(prompts, max_new_tokens=args.new_tokens),
        "reference": lambda: reference(prompts, args.new_tokens),
    }
    outputs = {name: run() for name, run in sides.items()}  # warm-up: every bucket compiled
    if outputs["ours"] != outputs["reference"]:
        sys.exit("decode: cached greedy tokens differ from the full forward's argmax")
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.repeats):
        for name, run in sides.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    tokens = args.batch * args.new_tokens
    emit(
        "decode_cached",
        "tokens/s",
        tokens / statistics.median(times["ours"]),
        tokens / statistics.median(times["reference"]),
        higher_is_better=True,
        batch=args.batch,
        new_tokens=args.new_tokens,
        prompt_lengths=[len(p) for p in prompts],
        identical=True,
    )


if __name__ == "__main__":
    main()
