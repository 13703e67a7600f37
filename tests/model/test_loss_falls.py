"""Training a tiny MoE a few hundred steps on real English text (bytes) lowers the loss."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from marin_assets.model import ModelConfig, init_params, init_router_bias, loss_fn, next_router_bias


def _real_text() -> bytes:
    license_txt = Path(sys.base_prefix) / "lib/python3.11/LICENSE.txt"
    if license_txt.exists():
        return license_txt.read_bytes()
    import codecs
    import this  # noqa: F401  (the Zen of Python, stored rot13)

    return codecs.decode(this.s, "rot13").encode() * 8


@pytest.mark.slow
def test_loss_falls_on_real_text():
    data = np.frombuffer(_real_text(), dtype=np.uint8).astype(np.int32)
    assert data.size > 5000
    c = ModelConfig(
        vocab_size=256,
        d_model=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        d_ff=64,
        n_routed_experts=4,
        top_k=2,
        expert_d_ff=64,
        max_seq_len=64,
    )
    params, bias = init_params(c, jax.random.PRNGKey(0)), init_router_bias(c)
    opt = optax.adamw(3e-3, weight_decay=0.0)
    opt_state = opt.init(params)

    @jax.jit
    def step(params, opt_state, bias, tokens):
        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, tokens, c, bias)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, next_router_bias(bias, aux, c), aux

    rng = np.random.default_rng(0)
    losses, cvs = [], []
    for _ in range(300):
        starts = rng.integers(0, data.size - 64, size=8)
        tokens = jnp.asarray(np.stack([data[s : s + 64] for s in starts]))
        params, opt_state, bias, aux = step(params, opt_state, bias, tokens)
        losses.append(float(aux["ce_loss"]))
        cvs.append(float(aux["load_cv"].mean()))
    first, last = losses[0], np.mean(losses[-20:])
    assert first > 5.0  # ~ln(256) at init
    print(f"loss {first:.3f} -> {last:.3f}; load cv {cvs[0]:.3f} -> {np.mean(cvs[-20:]):.3f}")
    assert last < 3.0, (first, last)  # bytes of English: the model learns a lot quickly
    assert np.mean(cvs[-20:]) < 0.3  # balancing keeps experts used while training
