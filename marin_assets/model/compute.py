"""How the forward computes: the dtype of its matmuls (mixed precision) and what the backward
keeps of each layer (activation rematerialisation). Neither changes the parameter tree.

Mixed precision keeps the parameters in their own dtype (the fp32 masters the optimizer updates
and checkpoints store) and casts them to the compute dtype where they are used, inside each
layer; the gradient of that cast is a cast back, so gradients arrive in the parameters' dtype.
bfloat16 has float32's exponent range, so no loss scaling is needed; float16 would need it
(its range ends at 65504) and is not offered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint, checkpoint_policies

from marin_assets.model.config import DTYPE_NAMES, REMAT_NAMES, check_dtype, check_remat

DTYPES: dict[str, Any] = {name: getattr(jnp, name) for name in DTYPE_NAMES}  # the names: model/config.py

# What jax.checkpoint keeps of a layer for its backward (JAX 0.7 policies):
#   none          no jax.checkpoint: autodiff keeps whatever residuals the backward needs.
#   full          keep only the layer's inputs; the backward recomputes the whole layer.
#   save_matmuls  keep the outputs of matmuls against weights (dot_generals without batch
#                 dimensions: q/k/v/o projections, dense and shared MLPs, router, latent
#                 projections); recompute the rest, in particular attention's batched score and
#                 value einsums (their [S, S] per head is the largest activation at long context)
#                 and the routed experts' grouped matmuls (batched over row blocks, or ragged_dot).
REMAT_POLICIES: dict[str, Callable[..., bool] | None] = {
    "none": None,
    "full": checkpoint_policies.nothing_saveable,
    "save_matmuls": checkpoint_policies.dots_with_no_batch_dims_saveable,
}
if tuple(REMAT_POLICIES) != REMAT_NAMES:  # the names a config checks without JAX (model/config.py)
    raise ImportError(f"remat policies {tuple(REMAT_POLICIES)} and model.config.REMAT_NAMES {REMAT_NAMES} differ")

# Layer weights that stay in their stored dtype inside a bf16 layer, and why:
#   *_norm   RMSNorm gains multiply fp32-normalised activations (layers.rms_norm computes the
#            statistics in fp32); a bf16 gain would round every output scale for no saving.
#   router   its logits choose each token's experts and feed quantile balancing: bf16 rounding
#            flips near-ties in the top-k and shifts the quantiles (moe.py computes them in fp32).
KEEP_STORED_DTYPE = ("attn_norm", "mlp_norm", "q_norm", "k_norm", "router")


def dtype_of(name: str, what: str = "compute_dtype") -> Any:
    """The jnp dtype named ``name`` (DTYPE_NAMES), or a ValueError naming ``what`` (the knob it came from)."""
    return DTYPES[check_dtype(name, what)]


def for_compute(layer_params: dict, dtype: Any) -> dict:
    """One layer's weights cast to ``dtype`` for use, except ``KEEP_STORED_DTYPE``."""
    return {name: w if name in KEEP_STORED_DTYPE else w.astype(dtype) for name, w in layer_params.items()}


def rematerialised(layer: Callable, policy: str) -> Callable:
    """``layer`` under jax.checkpoint with ``policy`` (REMAT_POLICIES); unchanged for "none".

    prevent_cse=False: the layer runs inside lax.scan, which already keeps XLA from merging the
    recomputation with the forward (JAX's jax.checkpoint documentation recommends it there).
    """
    if check_remat(policy) == "none":
        return layer
    return checkpoint(layer, policy=REMAT_POLICIES[policy], prevent_cse=False)
