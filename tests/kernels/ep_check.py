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
from kernels.routing import route_topk  # noqa: E402
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
    ep = ExpertParallel(mesh, transport=transport, capacity_factor_send=float(P_DEV),
                        capacity_factor_recv=float(P_DEV))
    out, dropped, grads = value_and_grads(ep)
    result[transport] = {"forward_err": max_err(out, ref_out), "dropped": dropped,
                         "grad_err": max(max_err(a, b) for a, b in zip(grads, ref_grads))}

# Constructed routings with known drops (k=1, one expert per device, 10 tokens/device).
E1, TOK = 8, 80
x1 = jax.random.normal(keys[5], (TOK, D))
w1 = jnp.ones((TOK, 1))
wg1, wu1, wd1 = w_gate[:E1], w_up[:E1], w_down[:E1]
device_of_token = jnp.arange(TOK) // (TOK // P_DEV)
routings = {
    "all_to_one": jnp.zeros((TOK, 1), jnp.int32),  # every token wants expert 0 (device 0)
    "shift_by_one": ((device_of_token + 1) % E1)[:, None].astype(jnp.int32),  # one source each
}
for name, ids1 in routings.items():
    full, _ = moe_local(x1, ids1, w1, wg1, wu1, wd1)
    for transport in ("ragged", "pooled"):
        ep = ExpertParallel(mesh, transport=transport, capacity_factor_send=1.10,
                            capacity_factor_recv=1.15, waves=1)
        out, dropped = jax.jit(ep)(x1, ids1, w1, wg1, wu1, wd1)
        zero_rows = jnp.all(out == 0, axis=1)
        result[f"drops_{name}_{transport}"] = {
            "dropped": int(dropped), "zero_rows": int(jnp.sum(zero_rows)),
            "kept_err": max_err(jnp.where(zero_rows[:, None], 0.0, full), out)}

# The whole model: expert-parallel loss and gradients equal the single-device ones.
cfg = ModelConfig(vocab_size=64, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=16,
                  n_routed_experts=8, n_shared_experts=1, top_k=2, expert_d_ff=8, latent_dim=8,
                  max_seq_len=16)
params = init_params(cfg, jax.random.PRNGKey(1))
tokens = jax.random.randint(jax.random.PRNGKey(2), (2, 16), 0, cfg.vocab_size)
bias = init_router_bias(cfg)
grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
(ref_loss, _), ref_g = jax.jit(grad_fn, static_argnums=2)(params, tokens, cfg, bias)
for transport in ("ragged", "pooled"):
    ep = ExpertParallel(mesh, transport=transport, capacity_factor_send=8.0, capacity_factor_recv=8.0)
    step = jax.jit(lambda p: grad_fn(p, tokens, cfg, bias, None, ep))
    (loss, aux), g = step(params)
    errs = jax.tree.leaves(jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), g, ref_g))
    result[f"model_{transport}"] = {"loss_err": abs(float(loss) - float(ref_loss)),
                                    "grad_err": max(errs), "dropped": int(jnp.sum(aux["dropped"]))}

print(json.dumps(result))
