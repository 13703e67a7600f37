"""Gradient accumulation (``TrainConfig.microbatches``): a step's gradient from its batch run as m microbatches.

Split: microbatch j of a [B, S] batch is rows j, j + m, j + 2m, ... (a reshape to [B/m, m, S]). The batch is
split over the mesh's batch axes in contiguous blocks of B/D rows and m divides B/D (``mesh.check_fits``), so
every device keeps its own rows in every microbatch: nothing moves between devices. ``jax.lax.scan`` runs
value_and_grad on one microbatch at a time, so memory holds one microbatch's activations; the gradients are
summed in float32 (or the params' dtype, if wider) and cast to the params' dtype once.

Weights: the model's loss is a mean over the counted targets (cross-entropy, LM z-loss: the loss mask's) plus
means over every token or sequence (router z-loss, sequence balance: ``Model.token_mean_loss`` tells the first
part from the rest). Microbatch j's first part is weighed by its share n_j / N of the batch's counted targets,
the rest by 1/m (every microbatch has B/m rows), so the sum of the weighted losses is the batch's loss and its
gradient the batch's gradient, up to rounding. Without a loss mask every share is 1/m.

The aux (``combine_aux``): counts over the batch (expert loads, drops, n_tokens) are summed; ce_loss and
lm_z_loss are weighed like the loss; load_cv is recomputed from the summed loads; every other value is a mean
over the batch's tokens or rows and is averaged over microbatches. Except ``balance_shift``: it is averaged
too, but a quantile of the batch's routing margins is not a function of the microbatches' quantiles (nor of
the loads, which do not hold the margins), so the router bias moves by the microbatches' mean correction, not
exactly the batch's. The routing itself is the batch's: every microbatch routes with the step's one bias.

Expert capacity: an expert-parallel layer sizes its capacity from the tokens it is given, a microbatch's, so
what it drops can differ from what the whole batch would drop. With nothing dropped (e.g. capacity factors
of n_routed_experts), accumulation is the full batch's computation up to rounding.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from kernels.balancing import load_cv
from marin_assets.train.data.batches import segments_of, tokens_and_mask
from marin_assets.train.distributed import mesh as meshlib

# aux keys (model.forward / loss_fn) that count over the batch: summed over the microbatches.
SUMMED = ("expert_load", "dropped", "dropped_sender", "dropped_receiver", "n_tokens")
# aux keys that are means over the counted targets: weighed by each microbatch's share of them.
TOKEN_WEIGHTED = ("ce_loss", "lm_z_loss")

# (params, tokens [B, S], loss mask [B, S] or None, segment ids [B, S] or None) -> (loss, aux)
LossOf = Callable[..., tuple[jax.Array, dict]]


def loss_and_grads(
    loss_of: LossOf, params, batch, *, microbatches: int, mesh, grad_sh, token_mean_loss: Callable[[dict], jax.Array] | None
):
    """((loss, aux), grads) of ``loss_of(params, tokens, loss_mask, segment_ids)`` on ``batch`` (tokens, or
    ``MaskedRows``),
    as ``jax.value_and_grad(..., has_aux=True)`` gives them for the whole batch, computed in ``microbatches``
    parts (module docstring); 1: that call itself. ``grad_sh``: the params' shardings (the sum's layout);
    ``token_mean_loss``: the part of the loss that is a mean over the counted targets (None: all of it)."""
    tokens, loss_mask = tokens_and_mask(batch)
    segments = segments_of(batch)
    if microbatches == 1:
        return jax.value_and_grad(lambda p: loss_of(p, tokens, loss_mask, segments), has_aux=True)(params)
    m = microbatches
    parts = jax.tree.map(lambda x: split(x, m, mesh), (tokens, loss_mask, segments))
    counts, shares = target_shares(parts[1])

    def one(total, xs):
        (part_tokens, part_mask, part_segments), share = xs
        objective = weighted_loss(loss_of, part_tokens, part_mask, part_segments, share, m, token_mean_loss)
        (part_loss, aux), grads = jax.value_and_grad(objective, has_aux=True)(params)
        return jax.tree.map(lambda t, g: t + g.astype(t.dtype), total, grads), (part_loss, aux)

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.promote_types(p.dtype, jnp.float32)), params)
    total, (part_losses, auxes) = jax.lax.scan(one, jax.lax.with_sharding_constraint(zeros, grad_sh), (parts, shares))
    grads = jax.tree.map(lambda t, p: t.astype(p.dtype), total, params)
    return (jnp.sum(part_losses), combine_aux(auxes, shares, counts)), grads


def split(x: jax.Array, m: int, mesh) -> jax.Array:
    """[B, S] -> [m, B/m, S]: microbatch j is rows j, j + m, ...; kept split over the batch axes (rows) and
    the sequence axis (positions)."""
    x = x.reshape(x.shape[0] // m, m, *x.shape[1:]).swapaxes(0, 1)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(None, meshlib.BATCH_AXES, meshlib.SEQUENCE_AXIS)))


def target_shares(mask_parts: jax.Array | None) -> tuple[jax.Array | None, jax.Array | None]:
    """(counted targets [m], their shares [m]) of the microbatches of a split loss mask; (None, None) without
    one. Position s predicts token s + 1, so a row's targets are mask[1:] (as ``loss_fn`` counts them)."""
    if mask_parts is None:
        return None, None
    counts = jnp.sum(mask_parts[:, :, 1:].astype(jnp.float32), axis=(1, 2))
    return counts, counts / jnp.maximum(jnp.sum(counts), 1.0)  # a batch with no target: every share 0, as its loss


def weighted_loss(loss_of: LossOf, tokens, loss_mask, segment_ids, share, m: int, token_mean_loss):
    """params -> (this microbatch's weighted part of the batch's loss, its aux) (module docstring)."""

    def objective(params):
        loss, aux = loss_of(params, tokens, loss_mask, segment_ids)
        if share is None:  # no mask: every microbatch counts as many targets
            return loss / m, aux
        if token_mean_loss is None:
            return share * loss, aux
        return loss / m + (share - 1.0 / m) * token_mean_loss(aux), aux

    return objective


def combine_aux(stacked: dict, shares: jax.Array | None, counts: jax.Array | None) -> dict:
    """The batch's aux from the microbatches' (stacked on axis 0), as the module docstring says."""
    out = {}
    for key, x in stacked.items():
        if key in SUMMED:
            out[key] = jnp.sum(x, axis=0)
        elif key in TOKEN_WEIGHTED and shares is not None:
            out[key] = jnp.tensordot(shares, x, axes=1)
        else:
            out[key] = jnp.mean(x, axis=0)
    if counts is not None and "n_tokens" in out:  # loss_fn counts at least 1 per microbatch: the batch's, exactly
        out["n_tokens"] = jnp.maximum(jnp.sum(counts), 1.0)
    if "load_cv" in out and out.get("expert_load", jnp.zeros((0,))).shape[-1] > 0:  # a dense model has no loads
        out["load_cv"] = load_cv(out["expert_load"])
    return out
