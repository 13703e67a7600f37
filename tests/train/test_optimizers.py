import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marin_assets.train.config import OptimizerConfig
from marin_assets.train.optimizers import make_optimizer, newton_schulz, param_groups


def toy_params():
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    return {
        "embed": jax.random.normal(k[0], (16, 8)),
        "final_norm": jnp.ones((8,)),
        "layers": {
            "attn_norm": jnp.ones((2, 8)),
            "wq": jax.random.normal(k[1], (2, 8, 8)) * 0.3,
            "e_up": jax.random.normal(k[2], (2, 3, 8, 4)) * 0.3,
        },
        "lm_head": jax.random.normal(k[3], (8, 16)) * 0.3,
    }


def toy_loss(p, x):
    h = p["embed"][x] * p["final_norm"]
    for layer in range(2):
        h = h + jnp.tanh(h @ p["layers"]["wq"][layer]) * p["layers"]["attn_norm"][layer]
        h = h + jnp.tanh(h @ p["layers"]["e_up"][layer, 0]).sum(-1, keepdims=True)
    logits = h @ p["lm_head"]
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(x.shape[0]), (x + 1) % 16])


def run(name, steps=30, lr=0.05, **kw):
    params = toy_params()
    opt = make_optimizer(OptimizerConfig(name=name, **kw), params)
    state = opt.init(params)
    x = jnp.arange(16) % 16
    losses = []
    step = jax.jit(lambda p, s: (lambda l, g: (l, *opt.update(g, s, p, jnp.float32(lr))))(*jax.value_and_grad(toy_loss)(p, x)))
    for _ in range(steps):
        loss, updates, state = step(params, state)
        params = jax.tree.map(lambda p, u: p + u, params, updates)
        losses.append(float(loss))
    return params, losses


def test_param_groups():
    groups = param_groups(toy_params())
    assert groups["embed"] == "embedding" and groups["final_norm"] == "norm"
    assert groups["layers"]["attn_norm"] == "norm"  # 2-D stacked norm still a norm
    assert groups["layers"]["wq"] == "matrix" and groups["lm_head"] == "head"


@pytest.mark.parametrize("name", ["adamw", "adamh", "muon"])
def test_each_optimizer_reduces_loss(name):
    _, losses = run(name, lr=0.02)
    assert losses[-1] < losses[0] - 0.3, losses


def test_adamw_does_not_decay_norms_or_embeddings():
    params = toy_params()
    opt = make_optimizer(OptimizerConfig(name="adamw", weight_decay=0.5), params)
    zero = jax.tree.map(jnp.zeros_like, params)
    updates, _ = opt.update(zero, opt.init(params), params, jnp.float32(0.1))
    assert float(jnp.abs(updates["embed"]).max()) == 0.0
    assert float(jnp.abs(updates["final_norm"]).max()) == 0.0
    np.testing.assert_allclose(updates["layers"]["wq"], -0.1 * 0.5 * params["layers"]["wq"], rtol=1e-6)


def test_adamh_keeps_each_matrix_norm():
    before = toy_params()
    after, _ = run("adamh", steps=20, lr=0.05)
    for key in ("wq", "e_up"):
        nb = jnp.sqrt(jnp.sum(before["layers"][key] ** 2, axis=(-2, -1)))
        na = jnp.sqrt(jnp.sum(after["layers"][key] ** 2, axis=(-2, -1)))
        np.testing.assert_allclose(na, nb, rtol=1e-4)
        assert not np.allclose(after["layers"][key], before["layers"][key])  # but it did move
    # embeddings are not on the sphere
    assert not np.isclose(float(jnp.linalg.norm(after["embed"])), float(jnp.linalg.norm(before["embed"])), rtol=1e-4)


def test_newton_schulz_orthogonalises():
    g = jax.random.normal(jax.random.PRNGKey(3), (3, 16, 8))
    o = newton_schulz(g, steps=5)
    s = jnp.linalg.svd(o, compute_uv=False)
    assert float(s.min()) > 0.6 and float(s.max()) < 1.25  # Muon's loose orthogonality band
    # same singular vectors as g's polar factor: o is close to U V^T
    u, _, vt = jnp.linalg.svd(g, full_matrices=False)
    assert float(jnp.mean(jnp.sum(o * (u @ vt), axis=(-2, -1)) / 8)) > 0.85
