"""The held-out loss: next-token cross-entropy on the validation splits, measured when a phase ends."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from marin_assets.datakit.datasets import LOSS_MASK
from marin_assets.train.compile_cache import reuse_jitted
from marin_assets.train.config import TrainConfig
from marin_assets.train.data.batches import MaskedRows, segment_ids, segment_keywords, segments_of, tokens_and_mask
from marin_assets.train.data.token_caches import TokenCache, TokenStream, as_stream
from marin_assets.train.distributed import mesh as meshlib
from marin_assets.train.hooks import StepInfo
from marin_assets.train.state import Model, TrainState

log = logging.getLogger(__name__)


def held_out_batches(
    caches: Mapping[str, TokenStream | TokenCache | str | os.PathLike],
    seq_len: int,
    batch_size: int,
    max_batches: int = 8,
    eos_ids: Mapping[str, int] | None = None,
) -> list[np.ndarray | MaskedRows]:
    """The held-out loss's batches: the first consecutive ``seq_len`` windows of each
    validation cache, in source order, in full batches only (at most ``max_batches``);
    ``MaskedRows`` when a cache is masked (a chat source: its loss counts the replies only) or
    ``eos_ids`` are given (document masking, as the run trains: each window's documents as segment ids).

    Fixed windows, not a shuffle, so every evaluation of a run sees the same tokens. Empty
    when the caches hold less than one batch; the caller reports that instead of a number.
    """
    windows, masks, segments = [], [], []
    streams = {name: as_stream(path) for name, path in sorted(caches.items())}  # source order
    masked = eos_ids is not None or any(stream.masked for stream in streams.values())
    for name, stream in streams.items():
        n = min(stream.num_tokens // seq_len, max_batches * batch_size - len(windows))
        if n > 0:
            starts = [i * seq_len for i in range(n)]
            read = stream.read(starts, seq_len)
            windows.extend(read)
            masks.extend(stream.read(starts, seq_len, LOSS_MASK) if stream.masked else np.ones((n, seq_len), np.int32))
            if eos_ids is not None:  # a window is contiguous text: documents end only at EOS tokens
                segments.extend(segment_ids(np.asarray(read), np.asarray(starts), seq_len, eos_ids[name]))
    if 0 < len(windows) < batch_size:  # a small split still gives a number, from one short batch
        bounds = [(0, len(windows))]
    else:
        bounds = [(b * batch_size, (b + 1) * batch_size) for b in range(len(windows) // batch_size)]
    tokens = [np.stack(windows[lo:hi]).astype(np.int32) for lo, hi in bounds]
    if not masked:
        return list[np.ndarray | MaskedRows](tokens)
    return [
        MaskedRows(t, np.stack(masks[lo:hi]).astype(np.int32), np.stack(segments[lo:hi]) if segments else None)
        for t, (lo, hi) in zip(tokens, bounds, strict=True)
    ]


def held_out_step(config: TrainConfig, model: Model, mesh):
    """(the jitted cross-entropy of one held-out batch, the sharding its arrays go in with) on ``mesh``.

    No EP layer: a short held-out batch need not divide into the batch shards, so every device holds
    every row and XLA partitions the local expert computation itself. The positions are split over the
    mesh's sequence axis when it has one (context parallelism, as the run trains): a context too long
    for one device's attention is too long for it here too."""
    sp = meshlib.context_parallel(mesh, batch_axes=())
    options = {} if sp is None else {"sp": sp}
    model_config = config.model

    def cross_entropy(p, bias, batch):  # the held-out number is CE alone, without the z-loss terms
        tokens, loss_mask = tokens_and_mask(batch)
        loss, aux = model.loss_fn(p, tokens, model_config, bias, loss_mask, **segment_keywords(segments_of(batch)), **options)
        return aux["ce_loss"] if isinstance(aux, dict) and "ce_loss" in aux else loss

    step = reuse_jitted(("held_out_ce", repr(model_config), model, sp), lambda: jax.jit(cross_entropy))
    return step, meshlib.replicated(mesh) if sp is None else meshlib.positions_sharding(mesh)


def validation_loss(
    config: TrainConfig,
    model: Model,
    state: TrainState,
    caches: Mapping[str, Any],
    mesh=None,
    eos_ids: Mapping[str, int] | None = None,
) -> float | None:
    """Mean next-token cross-entropy (nats) over the held-out batches (``held_out_batches``,
    each weighted by its rows); None when the validation splits hold less than one window.
    ``eos_ids`` ({source: EOS id}): a document-masked run's, so its documents are masked here too."""
    batches = held_out_batches(caches, config.seq_len, config.batch_size, eos_ids=eos_ids)
    if not batches:
        log.warning(
            "no held-out loss: the validation split(s) %s hold less than one window of seq_len=%d",
            sorted(getattr(c, "path", str(c)) for c in caches.values()),
            config.seq_len,
        )
        return None

    loss, where = held_out_step(config, model, mesh or meshlib.train_mesh(config))
    placed = [
        b._make(None if x is None else meshlib.place_state(x, where) for x in b)
        if isinstance(b, MaskedRows)
        else meshlib.place_state(b, where)
        for b in batches
    ]
    losses = [float(loss(state.params, state.router_bias, b)) for b in placed]
    # Each batch weighs by the targets it counts (its rows when unmasked).
    weights = [float(b.loss_mask[:, 1:].sum()) if isinstance(b, MaskedRows) else len(b) for b in batches]
    return float(np.average(losses, weights=weights)) if sum(weights) > 0 else None


class HeldOutLoss:
    """The end-of-phase hook: ``loss`` is ``validation_loss`` of the final state (None until it ran)."""

    def __init__(
        self, config: TrainConfig, model: Model, caches: Mapping[str, Any], mesh, eos_ids: Mapping[str, int] | None = None
    ) -> None:
        self.config, self.model, self.caches, self.mesh, self.eos_ids = config, model, caches, mesh, eos_ids
        self.loss: float | None = None

    def __call__(self, info: StepInfo) -> None:
        """Measure the held-out loss of ``info.state``."""
        self.loss = validation_loss(self.config, self.model, info.state, self.caches, self.mesh, self.eos_ids)
