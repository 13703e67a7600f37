"""Turn (context, continuation) token pairs into summed log-probs with a batched model call.

Both bits-per-byte and multiple choice reduce to: for each item, the log-probability of
some target tokens given the tokens before them. ``score_spans`` packs items into fixed
``[batch, seq_len]`` windows (so the model compiles once), calls ``token_logprobs`` and sums
the log-probs of each item's target positions.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

# tokens [B, S] int32 -> log p(tokens[:, 1:] | prefix) as [B, S-1] float
TokenLogprobs = Callable[[np.ndarray], np.ndarray]


def score_spans(items: Sequence[tuple[list[int], list[int]]], token_logprobs: TokenLogprobs,
                seq_len: int, batch_size: int) -> list[tuple[float, int]]:
    """For each (prefix_ids, target_ids): (sum of target log-probs, number of targets scored).

    prefix_ids must be non-empty (a BOS/EOS token at least). Items longer than seq_len keep
    as many targets as fit and the nearest prefix (targets are never dropped silently:
    overlong targets are split over several windows, each re-conditioned on what precedes).
    """
    windows: list[tuple[int, np.ndarray, np.ndarray]] = []  # (item index, tokens, target mask)
    for idx, (prefix, target) in enumerate(items):
        if not prefix:
            raise ValueError(f"item {idx}: empty prefix; prepend a BOS/EOS token")
        ids = list(prefix) + list(target)
        first_target = len(prefix)
        # Score targets [t0, t1) in windows of up to seq_len-1 new targets each.
        t = first_target
        while t < len(ids):
            stop = min(len(ids), t + seq_len - 1)
            start = max(0, stop - seq_len)
            window = ids[start:stop]
            tokens = np.zeros(seq_len, np.int32)
            tokens[:len(window)] = window
            mask = np.zeros(seq_len - 1, bool)
            # position j of the logprob array scores token j+1 of the window
            for pos in range(t, stop):
                mask[pos - start - 1] = True
            windows.append((idx, tokens, mask))
            t = stop
    sums = np.zeros(len(items), np.float64)
    counts = np.zeros(len(items), np.int64)
    for b in range(0, len(windows), batch_size):
        chunk = windows[b:b + batch_size]
        tokens = np.zeros((batch_size, seq_len), np.int32)
        for i, (_, tok, _) in enumerate(chunk):
            tokens[i] = tok
        logprobs = np.asarray(token_logprobs(tokens), np.float64)
        for i, (idx, _, mask) in enumerate(chunk):
            sums[idx] += logprobs[i][mask].sum()
            counts[idx] += int(mask.sum())
    return [(float(s), int(c)) for s, c in zip(sums, counts)]


def model_token_logprobs(params, config, router_bias) -> TokenLogprobs:
    """A jitted TokenLogprobs for the marin MoE model."""
    import jax
    import jax.numpy as jnp

    from marin_assets.model import forward

    @jax.jit
    def fn(params, router_bias, tokens):
        logits, _ = forward(params, tokens, config, router_bias)
        logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
        return jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]

    params, router_bias = jax.device_put((params, router_bias))
    return lambda tokens: np.asarray(fn(params, router_bias, jnp.asarray(tokens)))


def byte_encode(text: str) -> list[int]:
    """Byte-level tokenizer (ids 0-255) for models trained on raw UTF-8 bytes."""
    return list(text.encode("utf-8"))
