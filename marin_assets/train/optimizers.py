"""Optimizers: AdamW, AdamH (norm-preserving) and Muon (Newton-Schulz), with param groups.

All three share one small interface so the train step does not care which is in use:

    opt = make_optimizer(config, params)
    state = opt.init(params)
    updates, state = opt.update(grads, state, params, lr)   # params + updates = new params

The learning rate is an argument of ``update`` (not baked into an optax schedule) so the
step can compute it once from the phase-relative step, log exactly that value, and keep
the optimizer state untouched on a skipped step.

Parameter groups come from the parameter's name and shape (the model stores each layer's
weights stacked on a leading axis, so a "matrix" is always the last two axes):
- ``norm``      : RMSNorm gains (name contains "norm") and any 0/1-D leaf; never decayed.
- ``embedding`` : the token embedding; never decayed (Marin/Levanter default).
- ``head``      : the output projection; decayed under AdamW, Adam-updated under Muon.
- ``matrix``    : every other weight; decayed (AdamW), norm-kept (AdamH), orthogonalised (Muon).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from marin_assets.train.config import OptimizerConfig


class Optimizer(NamedTuple):
    init: Callable[[Any], Any]
    update: Callable[[Any, Any, Any, jax.Array], tuple[Any, Any]]


def _leaf_name(path) -> str:
    last = path[-1]
    return str(getattr(last, "key", getattr(last, "name", getattr(last, "idx", last))))


def param_group(path, leaf) -> str:
    name = _leaf_name(path)
    if "norm" in name or jnp.ndim(leaf) <= 1:
        return "norm"
    if "embed" in name:
        return "embedding"
    if name in ("lm_head", "unembed"):
        return "head"
    return "matrix"


def param_groups(params) -> Any:
    """Same tree as params, each leaf replaced by its group name."""
    return jax.tree_util.tree_map_with_path(param_group, params)


def _mask(params, groups: tuple[str, ...]):
    labels = param_groups(params)
    return jax.tree.map(lambda g: g in groups, labels)


def matrix_norm(x: jax.Array) -> jax.Array:
    """Frobenius norm of every matrix in a stack ([..., m, n] -> [..., 1, 1])."""
    return jnp.sqrt(jnp.sum(jnp.square(x), axis=(-2, -1), keepdims=True))


def newton_schulz(g: jax.Array, steps: int = 5) -> jax.Array:
    """Approximately orthogonalise each [m, n] matrix of g (U V^T of its SVD).

    Quintic iteration with Keller Jordan's coefficients, which push singular values into
    roughly [0.7, 1.2] in 5 steps; exactness is not needed for Muon.
    """
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.astype(jnp.float32)
    transpose = x.shape[-2] > x.shape[-1]
    if transpose:
        x = jnp.swapaxes(x, -2, -1)
    x = x / (matrix_norm(x) + 1e-7)
    for _ in range(steps):
        gram = x @ jnp.swapaxes(x, -2, -1)
        x = a * x + (b * gram + c * gram @ gram) @ x
    if transpose:
        x = jnp.swapaxes(x, -2, -1)
    return x.astype(g.dtype)


def _adamw(cfg: OptimizerConfig, params) -> Optimizer:
    adam = optax.scale_by_adam(cfg.beta1, cfg.beta2, cfg.eps)
    decay = _mask(params, ("matrix", "head"))

    def update(grads, state, params, lr):
        direction, state = adam.update(grads, state, params)
        updates = jax.tree.map(lambda d, p, m: -lr * (d + cfg.weight_decay * p * m), direction, params, decay)
        return updates, state

    return Optimizer(adam.init, update)


def _adamh(cfg: OptimizerConfig, params) -> Optimizer:
    """Adam on the sphere: each hidden matrix takes an Adam step and is then rescaled back
    to its Frobenius norm, so its norm never drifts and weight decay has nothing to tune.
    Embeddings and norms take a plain Adam step without decay."""
    adam = optax.scale_by_adam(cfg.beta1, cfg.beta2, cfg.eps)
    on_sphere = _mask(params, ("matrix", "head"))

    def update(grads, state, params, lr):
        direction, state = adam.update(grads, state, params)

        def one(d, p, sphere):
            if not sphere:
                return -lr * d
            moved = p - lr * d
            return moved * (matrix_norm(p) / (matrix_norm(moved) + 1e-12)) - p

        return jax.tree.map(one, direction, params, on_sphere), state

    return Optimizer(adam.init, update)


def _muon(cfg: OptimizerConfig, params) -> Optimizer:
    """Muon for hidden matrices, AdamW for embeddings, head and norms.

    The orthogonalised update is scaled by 0.2 * sqrt(max(m, n)) so its RMS matches
    AdamW's; one learning rate then serves both groups (Moonshot's recipe)."""
    is_matrix = _mask(params, ("matrix",))
    decay = _mask(params, ("matrix", "head"))
    adam = optax.masked(optax.scale_by_adam(cfg.beta1, cfg.beta2, cfg.eps), jax.tree.map(lambda m: not m, is_matrix))

    def init(params):
        momentum = jax.tree.map(lambda p, m: jnp.zeros_like(p) if m else jnp.zeros((0,), p.dtype), params, is_matrix)
        return {"adam": adam.init(params), "momentum": momentum}

    def update(grads, state, params, lr):
        adam_dir, adam_state = adam.update(grads, state["adam"], params)

        def leaf(g, a, buf, p, matrix, wd):
            if not matrix:
                return -lr * (a + cfg.weight_decay * p * wd), buf
            buf = cfg.muon_momentum * buf + g
            nesterov = g + cfg.muon_momentum * buf
            o = newton_schulz(nesterov, cfg.muon_ns_steps)
            scale = 0.2 * max(p.shape[-2], p.shape[-1]) ** 0.5
            return -lr * (o * scale + cfg.weight_decay * p), buf

        out = jax.tree.map(leaf, grads, adam_dir, state["momentum"], params, is_matrix, decay)
        treedef = jax.tree.structure(params)
        pairs = treedef.flatten_up_to(out)
        updates = treedef.unflatten([u for u, _ in pairs])
        momentum = treedef.unflatten([b for _, b in pairs])
        return updates, {"adam": adam_state, "momentum": momentum}

    return Optimizer(init, update)


def make_optimizer(cfg: OptimizerConfig, params) -> Optimizer:
    return {"adamw": _adamw, "adamh": _adamh, "muon": _muon}[cfg.name](cfg, params)
