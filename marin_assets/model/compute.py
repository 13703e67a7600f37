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

DTYPES: dict[str, Any] = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
DTYPE_NAMES = tuple(DTYPES)
DEFAULT_DTYPE = "float32"

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
REMAT_NAMES = tuple(REMAT_POLICIES)
DEFAULT_REMAT = "none"

# Layer weights that stay in their stored dtype inside a bf16 layer, and why:
#   *_norm   RMSNorm gains multiply fp32-normalised activations (layers.rms_norm computes the
#            statistics in fp32); a bf16 gain would round every output scale for no saving.
#   router   its logits choose each token's experts and feed quantile balancing: bf16 rounding
#            flips near-ties in the top-k and shifts the quantiles (moe.py computes them in fp32).
KEEP_STORED_DTYPE = ("attn_norm", "mlp_norm", "q_norm", "k_norm", "router")


def dtype_of(name: str, what: str = "compute_dtype") -> Any:
    """The jnp dtype named ``name`` (DTYPE_NAMES), or a ValueError naming ``what`` (the knob it came from)."""
    if name not in DTYPES:
        raise ValueError(f"{what} must be one of {DTYPE_NAMES}, got {name!r}")
    return DTYPES[name]


def check_remat(policy: str, what: str = "remat") -> str:
    """``policy`` when it is one of REMAT_NAMES, else a ValueError naming ``what``."""
    if policy not in REMAT_POLICIES:
        raise ValueError(f"{what} must be one of {REMAT_NAMES}, got {policy!r}")
    return policy


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
