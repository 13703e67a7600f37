"""Small checkpoints for the HF tests: our init, with norms perturbed off ones (an exporter that dropped a
norm, or swapped q_norm and k_norm, would otherwise pass), saved as a train checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.configs import TINY_MODEL

# Dense, Llama layout: 2 layers, GQA 4:2, head_dim 16, no QK-norm, a non-default rope_theta and eps.
LLAMA_MODEL: dict[str, Any] = dict(
    TINY_MODEL, n_layers=2, n_heads=4, n_kv_heads=2, n_routed_experts=0, qk_norm=False, rope_theta=5000.0, norm_eps=1e-5
)
QWEN3_MODEL: dict[str, Any] = dict(LLAMA_MODEL, qk_norm=True, head_dim=12)  # head_dim not d_model / heads
# MoE, Mixtral layout: 4 experts top-2, softmax gating, no shared expert, bias kept 0.
MIXTRAL_MODEL: dict[str, Any] = dict(
    TINY_MODEL,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    n_shared_experts=0,
    qk_norm=False,
    router_gating="softmax",
    balancing="none",
    rope_theta=5000.0,
)
QWEN3_MOE_MODEL: dict[str, Any] = dict(MIXTRAL_MODEL, qk_norm=True)


def perturbed_params(model_config, seed: int = 0) -> dict:
    """init_params with every norm weight drawn from 1 +- 0.3 and larger matrices (init_std 0.2): logits
    far from uniform, so a wrong mapping shows in them."""
    import jax
    import jax.numpy as jnp

    from marin_assets.model import init_params

    params = init_params(model_config, jax.random.PRNGKey(seed))
    keys = iter(jax.random.split(jax.random.PRNGKey(seed + 1), 64))

    def perturb(path, leaf):
        name = jax.tree_util.keystr(path)
        if "norm" in name:
            return leaf + 0.3 * jax.random.uniform(next(keys), leaf.shape, jnp.float32, -1.0, 1.0)
        return leaf * 10.0  # init_std 0.02 -> 0.2

    return jax.tree_util.tree_map_with_path(perturb, params)


def save_checkpoint(out: Path, model: dict, *, seed: int = 0, router_bias=None, tokenizers: dict | None = None) -> Path:
    """A train checkpoint (step 7) of ``model`` under ``out``/checkpoints; returns ``out``."""
    import jax.numpy as jnp

    from marin_assets.model import init_router_bias
    from marin_assets.train.checkpoints import checkpoint as ckpt
    from marin_assets.train.config import config_from_dict, config_to_dict
    from tests.support.configs import EVAL_CHECKPOINT

    config = config_from_dict(dict(EVAL_CHECKPOINT, model=model, seq_len=model["max_seq_len"]))
    bias = init_router_bias(config.model) if router_bias is None else jnp.asarray(router_bias, jnp.float32)
    state = {"params": perturbed_params(config.model, seed), "router_bias": bias}
    meta = {
        "config": config_to_dict(config),
        "phase": "main",
        "tokens": 1234,
        "data_tokenizers": tokenizers if tokenizers is not None else {},
    }
    ckpt.save(out / "checkpoints", 7, state, meta)
    return out


def our_logits(params, model_config, tokens):
    import jax.numpy as jnp
    import numpy as np

    from marin_assets.model import forward, init_router_bias

    logits, _ = forward(params, jnp.asarray(tokens), model_config, init_router_bias(model_config), compute_dtype="float32")
    return np.asarray(logits)


def fixed_tokens(vocab: int, batch: int = 2, seq: int = 32):
    """Fixed token sequences: a ramp and a pseudo-random row (seeded), as [batch, seq] int32."""
    import numpy as np

    rows = [np.arange(seq) * 7 % vocab, np.random.default_rng(3).integers(0, vocab, seq)]
    return np.stack(rows[:batch]).astype(np.int32)
