"""Turn (context, continuation) token pairs into summed log-probs with batched model calls.

Both bits-per-byte and the task suite reduce to: for each item, the log-probability of some
target tokens given the tokens before them. ``score_spans`` cuts every item into windows of
at most ``seq_len`` tokens, groups windows of similar length into a few padded shapes (powers
of two from ``seq_len // 8`` (at least ``MIN_BUCKET``) up to ``seq_len``, so the model compiles at
most four times and a 200-token multiple-choice pair is not padded to a 2,048-token context), calls
``token_logprobs`` and sums the log-probs of each item's target positions.

Each row is scored on its own (causal attention, right padding, dropless routing), so a
window's log-probs do not depend on what shares its batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence

import numpy as np

# tokens [B, S] int32 -> log p(tokens[:, 1:] | prefix) as [B, S-1] float
TokenLogprobs = Callable[[np.ndarray], np.ndarray]

# Shortest padded window: padding a shorter one costs less than compiling another shape (seconds
# on CPU), so the demo's 64-token model has one shape, as before buckets.
MIN_BUCKET = 64


@dataclasses.dataclass(frozen=True)
class Window:
    item: int
    tokens: np.ndarray  # int32, at most seq_len long
    first_target: int  # tokens[first_target:] are the item's targets in this window


def windows(items: Sequence[tuple[Sequence[int], Sequence[int]]], seq_len: int) -> Iterator[Window]:
    """Every (prefix_ids, target_ids) item as windows of at most ``seq_len`` tokens.

    prefix_ids must be non-empty (a BOS/EOS token at least). Targets are never dropped: a
    long target is split over several windows, each re-conditioned on as much of what
    precedes it as fits; an overlong prefix keeps its nearest tokens.
    """
    if seq_len < 2:
        raise ValueError(f"seq_len must be at least 2 (one context token and one target), got {seq_len}")
    for idx, (prefix, target) in enumerate(items):
        if len(prefix) == 0:
            raise ValueError(f"item {idx}: empty prefix; prepend a BOS/EOS token")
        ids = np.concatenate([np.asarray(prefix, np.int32), np.asarray(target, np.int32)])
        t = len(prefix)
        while t < len(ids):
            stop = min(len(ids), t + seq_len - 1)
            start = max(0, stop - seq_len)
            yield Window(idx, ids[start:stop], t - start)
            t = stop


def bucket_length(length: int, seq_len: int) -> int:
    """The padded length a window of ``length`` tokens is scored at: a power of two from
    ``max(MIN_BUCKET, seq_len // 8)`` up, capped at ``seq_len``, so there are at most four shapes
    (four compiles) for any context."""
    shortest = max(MIN_BUCKET, seq_len // 8)
    return min(seq_len, max(shortest, 1 << (max(length, 1) - 1).bit_length()))


def score_spans(
    items: Sequence[tuple[Sequence[int], Sequence[int]]], token_logprobs: TokenLogprobs, seq_len: int, batch_size: int
) -> list[tuple[float, int]]:
    """For each (prefix_ids, target_ids): (sum of target log-probs, number of targets scored).

    ``batch_size`` is rows per model call at ``seq_len``; shorter buckets take proportionally
    more rows, so every call holds about ``batch_size * seq_len`` tokens.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    by_bucket: dict[int, list[Window]] = {}
    for w in windows(items, seq_len):
        by_bucket.setdefault(bucket_length(len(w.tokens), seq_len), []).append(w)
    sums = np.zeros(len(items), np.float64)
    counts = np.zeros(len(items), np.int64)
    for length, group in sorted(by_bucket.items()):
        rows = max(1, batch_size * seq_len // length)
        for b in range(0, len(group), rows):
            chunk = group[b : b + rows]
            # One shape per bucket, the last chunk padded to it: a compile (seconds on CPU) costs more
            # than the one padded batch it would save.
            tokens = np.zeros((rows, length), np.int32)
            for i, w in enumerate(chunk):
                tokens[i, : len(w.tokens)] = w.tokens
            logprobs = np.asarray(token_logprobs(tokens), np.float64)
            for i, w in enumerate(chunk):
                # position j of the log-prob row scores token j+1 of the window
                sums[w.item] += logprobs[i, w.first_target - 1 : len(w.tokens) - 1].sum()
                counts[w.item] += len(w.tokens) - w.first_target
    return [(float(s), int(c)) for s, c in zip(sums, counts, strict=True)]


def model_token_logprobs(params, config, router_bias) -> TokenLogprobs:
    """A jitted TokenLogprobs for the marin MoE model (one compile per input shape)."""
    import jax
    import jax.numpy as jnp

    from marin_assets.model import forward  # deferred (import cost): jax

    # The balancing shift is a training statistic (routing reads router_bias either way):
    # not computing it leaves every logit as it is and saves its sort over all tokens.
    config = dataclasses.replace(config, balancing="none")

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
