"""Expert-parallel checks on 8 host devices; prints one JSON object.

Run as a subprocess (XLA_FLAGS must be set before jax is imported, and pytest workers
may already have imported jax): ``python tests/kernels/ep_check.py``.
"""

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from kernels.dispatch import moe_local  # noqa: E402
from kernels.expert_parallel import ExpertParallel  # noqa: E402
from kernels.router import route_topk  # noqa: E402
from marin_assets.model import ModelConfig, init_params, init_router_bias, loss_fn  # noqa: E402

P_DEV = 8
mesh = jax.make_mesh((P_DEV,), ("expert",))
T, D, E, F, K = 64, 16, 16, 8, 2
keys = jax.random.split(jax.random.PRNGKey(0), 6)
x = jax.random.normal(keys[0], (T, D))
logits = jax.random.normal(keys[1], (T, E))
w_gate = 0.3 * jax.random.normal(keys[2], (E, D, F))
w_up = 0.3 * jax.random.normal(keys[3], (E, D, F))
w_down = 0.3 * jax.random.normal(keys[4], (E, F, D))
ids, weights = route_topk(logits, jnp.zeros(E), K)


def value_and_grads(layer):
    def loss(x, weights, w_gate, w_up, w_down):
        out, dropped = layer(x, ids, weights, w_gate, w_up, w_down)
        return jnp.sum(jnp.sin(out)), (out, dropped)

    fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4), has_aux=True))
    (_, (out, dropped)), grads = fn(x, weights, w_gate, w_up, w_down)
    return out, int(dropped), grads


def max_err(a, b):
    return float(jnp.max(jnp.abs(a - b)))


result = {}
ref_out, _, ref_grads = value_and_grads(moe_local)
for transport in ("ragged", "pooled"):
    # Capacity factors of P_DEV: every assignment fits even if all go to one device.
    ep = ExpertParallel(mesh, transport=transport, capacity_factor_send=float(P_DEV), capacity_factor_recv=float(P_DEV))
    out, dropped, grads = value_and_grads(ep)
    result[transport] = {
        "forward_err": max_err(out, ref_out),
        "dropped": dropped,
        "grad_err": max(max_err(a, b) for a, b in zip(grads, ref_grads, strict=True)),
    }

# Constructed routings with known drops (k=1, 10 tokens/device).
TOK = 80
x1 = jax.random.normal(keys[5], (TOK, D))
w1 = jnp.ones((TOK, 1))
device_of_token = jnp.arange(TOK) // (TOK // P_DEV)


def drops(ids1, n_experts, **ep_kwargs):
    """Sender and receiver drops, the tokens whose output is zero, and the largest error of the others."""
    wg1, wu1, wd1 = w_gate[:n_experts], w_up[:n_experts], w_down[:n_experts]
    full, _ = moe_local(x1, ids1, w1, wg1, wu1, wd1)
    ep = ExpertParallel(mesh, **ep_kwargs)
    out, sender, receiver = jax.jit(ep.with_drop_kinds)(x1, ids1, w1, wg1, wu1, wd1)
    zero_rows = jnp.all(out == 0, axis=1)
    return {
        "sender": int(sender),
        "receiver": int(receiver),
        "dropped": int(sender) + int(receiver),
        "zero_tokens": [int(t) for t in jnp.flatnonzero(zero_rows)],
        "kept_err": max_err(jnp.where(zero_rows[:, None], 0.0, full), out),
    }


# One expert per device (E = 8).
routings = {
    "all_to_one": jnp.zeros((TOK, 1), jnp.int32),  # every token wants expert 0 (device 0)
    "shift_by_one": ((device_of_token + 1) % P_DEV)[:, None].astype(jnp.int32),  # one source each
}
for name, ids1 in routings.items():
    for transport in ("ragged", "pooled"):
        result[f"drops_{name}_{transport}"] = drops(
            ids1, P_DEV, transport=transport, capacity_factor_send=1.10, capacity_factor_recv=1.15, waves=1
        )

# Two experts per device (E = 16). contended: device 0 sends tokens 0..4 to expert 1 and 5..9 to
# expert 0, devices 1 and 2 all theirs to expert 0, device d >= 3 five each to experts 2d, 2d + 1.
token = jnp.arange(TOK)
contended = jnp.where(
    device_of_token == 0,
    (token < 5).astype(jnp.int32),
    jnp.where(device_of_token < 3, 0, 2 * device_of_token + (token % 10 >= 5)),
)
result["drops2_expert_0_all_ragged"] = drops(jnp.zeros((TOK, 1), jnp.int32), 2 * P_DEV, transport="ragged")
result["drops2_expert_0_all_pooled"] = drops(jnp.zeros((TOK, 1), jnp.int32), 2 * P_DEV, transport="pooled", waves=1)
result["drops2_contended_ragged"] = drops(contended[:, None], 2 * P_DEV, transport="ragged")
for waves in (1, 3):  # pools that hold every row (10 and 12 rows), so only the receiver drops
    result[f"drops2_contended_pooled_waves{waves}"] = drops(
        contended[:, None], 2 * P_DEV, transport="pooled", capacity_factor_send=8.0, waves=waves
    )


# The whole model: expert-parallel loss and gradients equal the single-device ones.
cfg = ModelConfig(
    vocab_size=64,
    d_model=16,
    n_layers=2,
    n_heads=2,
    n_kv_heads=1,
    d_ff=16,
    n_routed_experts=8,
    n_shared_experts=1,
    top_k=2,
    expert_d_ff=8,
    latent_dim=8,
    max_seq_len=16,
)
params = init_params(cfg, jax.random.PRNGKey(1))
tokens = jax.random.randint(jax.random.PRNGKey(2), (2, 16), 0, cfg.vocab_size)
bias = init_router_bias(cfg)
grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
(ref_loss, _), ref_g = jax.jit(grad_fn, static_argnums=2)(params, tokens, cfg, bias)
for transport in ("ragged", "pooled"):
    ep = ExpertParallel(mesh, transport=transport, capacity_factor_send=8.0, capacity_factor_recv=8.0)
    step = jax.jit(lambda p, ep=ep: grad_fn(p, tokens, cfg, bias, None, ep))
    (loss, aux), g = step(params)
    errs = jax.tree.leaves(jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), g, ref_g))
    result[f"model_{transport}"] = {
        "loss_err": abs(float(loss) - float(ref_loss)),
        "grad_err": max(errs),
        "dropped": int(jnp.sum(aux["dropped"])),
    }

print(json.dumps(result))
