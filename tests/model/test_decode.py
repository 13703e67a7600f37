"""KV-cached generation (model/decode.py) against the full forward: greedy decoding is the
forward's argmax at every step, for a dense model (partial RoPE, GQA) and an MoE (router bias);
batching, sampling, stop sequences and shape buckets."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marin_assets.model import ModelConfig, decode, forward, init_params
from tests.support.configs import NARROW_MODEL, TINY_MODEL

# init_std 0.5: logits far from uniform, so no near-tie flips an argmax between two exact computations
DENSE = ModelConfig(**dict(TINY_MODEL, n_layers=2, n_routed_experts=0, rope_fraction=0.5, init_std=0.5))
MOE = ModelConfig(**dict(NARROW_MODEL, n_layers=2, max_seq_len=32, init_std=0.5))
# a window of 4 on layer 0, layer 1 global: the cache must mask what the forward's window masks
WINDOWED = ModelConfig(
    **dict(TINY_MODEL, n_layers=2, n_routed_experts=0, init_std=0.5, sliding_window=4, global_attention_every=2)
)
PROMPTS = [[5, 17, 200, 3, 9], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [42, 43]]
NEW = 8


def _model(config: ModelConfig):
    params = init_params(config, jax.random.PRNGKey(0))
    bias = np.random.default_rng(1).standard_normal((config.n_layers, config.n_routed_experts)).astype(np.float32)
    return params, bias


def _forward_logits(params, config, bias, rows: list[list[int]]) -> list[np.ndarray]:
    """Each row's logits [len, V] from one full forward (rows right-padded: causal, so padding after
    a prefix never changes the prefix's logits)."""
    tokens = np.zeros((len(rows), max(map(len, rows))), np.int32)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = row
    logits = np.asarray(jax.jit(lambda p, t, b: forward(p, t, config, b)[0])(params, tokens, bias))
    return [logits[i, : len(row)] for i, row in enumerate(rows)]


@pytest.mark.parametrize("config", [DENSE, MOE, WINDOWED], ids=["dense", "moe", "windowed"])
def test_greedy_decoding_is_the_full_forwards_argmax_at_every_step(config):
    params, bias = _model(config)
    generated = decode.generate(params, config, bias, PROMPTS, max_new_tokens=NEW)
    assert [len(g) for g in generated] == [NEW] * len(PROMPTS)
    full = _forward_logits(params, config, bias, [p + g for p, g in zip(PROMPTS, generated)])
    for prompt, new, logits in zip(PROMPTS, generated, full):
        # the logits at the prompt's last token and at each generated one predict the next generated token
        assert np.argmax(logits[len(prompt) - 1 : -1], axis=-1).tolist() == new

    # and the cache's logits equal the forward's at every step (the decode step _decode runs)
    tokens, pad = decode._left_padded(PROMPTS)
    step = jax.jit(decode._layers, static_argnames=("config", "dtype"))
    logits, cache = decode._prefill(
        params,
        jnp.asarray(bias),
        tokens,
        pad,
        config=config,
        compute_dtype="float32",
        cache_len=decode.bucket(tokens.shape[1] + NEW),
    )
    for t in range(NEW):
        want = np.stack([row[len(p) - 1 + t] for p, row in zip(PROMPTS, full)])
        np.testing.assert_allclose(np.asarray(logits)[: len(PROMPTS)], want, rtol=1e-5, atol=1e-5)
        new = np.asarray([g[t] for g in generated] + [0] * (tokens.shape[0] - len(PROMPTS)), np.int32)
        logits, cache = step(
            params,
            jnp.asarray(bias),
            new[:, None],
            jnp.asarray(pad),
            cache,
            jnp.int32(tokens.shape[1] + t),
            config=config,
            dtype=jnp.float32,
        )


def test_a_batched_prompt_decodes_as_it_does_alone():
    params, bias = _model(MOE)
    batched = decode.generate(params, MOE, bias, PROMPTS, max_new_tokens=NEW)
    assert [decode.generate(params, MOE, bias, [p], max_new_tokens=NEW)[0] for p in PROMPTS] == batched


def test_sampling_nucleus_seed_and_stop_sequences():
    params, bias = _model(DENSE)
    gen = decode.Generator(params, DENSE, bias)
    greedy = gen(PROMPTS, max_new_tokens=NEW)
    # a nucleus that holds only the most likely token is greedy, whatever the temperature
    assert gen(PROMPTS, max_new_tokens=NEW, temperature=2.0, top_p=1e-6) == greedy
    sampled = gen(PROMPTS, max_new_tokens=NEW, temperature=1.5, seed=3)
    assert gen(PROMPTS, max_new_tokens=NEW, temperature=1.5, seed=3) == sampled  # reproducible
    assert gen(PROMPTS, max_new_tokens=NEW, temperature=1.5, seed=4) != sampled
    assert sampled != greedy
    # a row's draws depend on its seed and index, not on the other rows
    assert gen(PROMPTS[:1], max_new_tokens=NEW, temperature=1.5, seed=3)[0] == sampled[0]

    # row 0 stops at its own tokens 2..3 (excluded from the output); the other rows run to the end
    stop = greedy[0][2:4]
    stopped = gen(PROMPTS, max_new_tokens=NEW, stop_sequences=[stop, [999 % DENSE.vocab_size] * 3])
    for row, (s, g) in enumerate(zip(stopped, greedy)):
        at = next((i for i in range(len(g) - 1) if g[i : i + 2] == stop), None)
        assert s == (g[:at] if at is not None else g), row
    assert stopped[0] == greedy[0][:2]
    # a one-token stop sequence that is every row's first token: every row returns nothing
    firsts = gen([PROMPTS[0]] * 2, max_new_tokens=NEW, stop_sequences=[[greedy[0][0]]])
    assert firsts == [[], []]


def test_a_new_prompt_length_in_the_same_bucket_does_not_retrace():
    params, bias = _model(DENSE)
    gen = decode.Generator(params, DENSE, bias)
    progress = []
    gen([[1, 2, 3], [4, 5]], max_new_tokens=6, on_progress=progress.append)
    assert sum(progress) == 6
    before = dict(decode.TRACES)
    out = gen([[7, 8, 9, 10, 11, 12], [3]], max_new_tokens=5, temperature=0.7, top_p=0.9, seed=2)  # lengths 6, 1: bucket 8
    assert [len(o) for o in out] == [5, 5]
    assert dict(decode.TRACES) == before
    gen([[1] * 9], max_new_tokens=5)  # prompt bucket 16: a new shape compiles
    assert decode.TRACES["prefill"] == before["prefill"] + 1


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"top_p": 0.0}, "top_p"),
        ({"temperature": float("nan")}, "temperature"),
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"prompts": [[1], []]}, "prompt 1 is empty"),
        ({"prompts": [[1, 257]]}, "prompt 0 holds 257"),
        ({"prompts": [[1] * 30]}, "max_seq_len 32"),
        ({"stop_sequences": [[]]}, "stop sequence 0 is empty"),
    ],
)
def test_bad_arguments_are_refused_naming_them(kwargs, message):
    params, bias = _model(DENSE)
    args = {"prompts": [[1, 2]], "max_new_tokens": 4} | kwargs
    with pytest.raises(ValueError, match=message):
        decode.generate(params, DENSE, bias, args.pop("prompts"), **args)
