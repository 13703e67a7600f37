"""Cross-architecture warm start: a checkpoint's parameters carried into a model of another shape.

Each architecture change is a ``ParamMapping``: a small declarative table of rules, one per target
parameter, ``target <- source + transform``, checked against both trees before anything is written.
A target parameter no rule makes, a source parameter no rule reads (and the mapping does not declare
unused), a rule whose source the checkpoint lacks, or a shape a transform cannot take is a one-line
ValueError naming the parameter. Rules whose target the target model does not have (a shared expert,
a latent projection) are left out; their sources must then be read by another rule.

The two mappings:

- ``qk_norm``: a model without QK-norm (``model.qk_norm: false``) into the same model with it. Every
  weight is copied; the new ``q_norm``/``k_norm`` gains start at ones, which is the identity for an
  RMSNorm's scale (so only the normalisation itself is new: q and k are rescaled to unit RMS per head,
  which changes the attention logits, and the loss moves). A source that has the gains (our models
  keep them, unused, when QK-norm is off) leaves them behind; one that lacks them (a Llama-style tree)
  needs none.
- ``upcycle``: a dense model into a MoE (sparse upcycling, Komatsuzaki et al. 2022,
  arXiv:2212.05055): every routed expert starts as a copy of the dense MLP, the router as small
  random weights (``init_std``, the model's own init). The routing weights of a token sum to one and
  the experts are identical, so the routed output equals the dense MLP's whatever the router says;
  when the target keeps a shared expert of the dense width it starts as the dense MLP too and both
  down projections are halved, so shared + routed is again the dense MLP. Up to dropped assignments
  (expert capacity) the upcycled model computes the dense model's function.

The result is a full train state of the target config (fresh optimizer state and guard windows;
step, RNG, data position and tokens of the source) written as ``out/checkpoints/step-<step>``, for
``marin train --warm-start OUT`` (the schedule restarts with its warmup) or for ``marin train
necromancy`` to rebuild its optimizer moments before a ``--resume``.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from marin_assets.model.compute import dtype_of
from marin_assets.model.config import ModelConfig
from marin_assets.store.fsutil import child
from marin_assets.train.checkpoints import checkpoint as ckpt
from marin_assets.train.checkpoints.necromancy import check_new_out
from marin_assets.train.config import TrainConfig, config_from_dict, config_to_dict, load_config
from marin_assets.train.guards import init_guard_state
from marin_assets.train.optimizers import make_optimizer
from marin_assets.train.restore import resolve_checkpoint
from marin_assets.train.state import Model, TrainState, moe_model

META_KEY = "transplant"


@dataclasses.dataclass(frozen=True)
class Rule:
    """``target`` (a parameter path, "layers/wq") is made by ``transform`` from ``source`` (None: from
    nothing but the target's shape)."""

    target: str
    source: str | None
    transform: str


@dataclasses.dataclass(frozen=True)
class ParamMapping:
    name: str
    rules: tuple[Rule, ...]
    unused: tuple[str, ...]  # source parameters left behind on purpose (see the module docstring)
    same_fields: tuple[str, ...]  # ModelConfig fields source and target must share (the forward reads them)
    router_bias: str  # "copy" the source's balancing bias, or "init" the target's (zeros)
    check: Callable[[ModelConfig, ModelConfig], str | None]  # why this pair of models cannot be mapped


def _copies(*names: str) -> tuple[Rule, ...]:
    return tuple(Rule(name, name, "copy") for name in names)


_ATTENTION = ("layers/attn_norm", "layers/wq", "layers/wk", "layers/wv", "layers/wo")
_EDGES = ("embed", "final_norm", "lm_head", "layers/mlp_norm")
_DENSE_MLP = ("layers/w_gate", "layers/w_up", "layers/w_down")
_ROUTED = ("layers/router", "layers/e_gate", "layers/e_up", "layers/e_down", "layers/latent_down", "layers/latent_up")
_SHAPE_FIELDS = (
    "vocab_size",
    "d_model",
    "n_layers",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    "rope_theta",
    "rope_fraction",
    "norm_eps",
)


def _qk_norm_check(source: ModelConfig, target: ModelConfig) -> str | None:
    if source.qk_norm:
        return "the source model already has QK-norm (model.qk_norm: true)"
    if not target.qk_norm:
        return "the target model has no QK-norm (model.qk_norm: false)"
    return None


def _upcycle_check(source: ModelConfig, target: ModelConfig) -> str | None:
    if source.is_moe:
        return f"the source model is not dense (n_routed_experts {source.n_routed_experts})"
    if not target.is_moe:
        return "the target model is dense (n_routed_experts 0)"
    return None


MAPPINGS: dict[str, ParamMapping] = {
    "qk_norm": ParamMapping(
        "qk_norm",
        rules=(
            *_copies(*_EDGES, *_ATTENTION, *_DENSE_MLP, *_ROUTED),
            Rule("layers/q_norm", None, "ones"),
            Rule("layers/k_norm", None, "ones"),
        ),
        unused=("layers/q_norm", "layers/k_norm"),
        same_fields=(*_SHAPE_FIELDS, "d_ff", "n_routed_experts", "n_shared_experts", "top_k", "expert_d_ff", "latent_dim"),
        router_bias="copy",
        check=_qk_norm_check,
    ),
    "upcycle": ParamMapping(
        "upcycle",
        rules=(
            *_copies(*_EDGES, *_ATTENTION, "layers/q_norm", "layers/k_norm", "layers/w_gate", "layers/w_up"),
            Rule("layers/w_down", "layers/w_down", "half"),
            Rule("layers/e_gate", "layers/w_gate", "experts"),
            Rule("layers/e_up", "layers/w_up", "experts"),
            Rule("layers/e_down", "layers/w_down", "experts_down"),
            Rule("layers/router", None, "router_init"),
        ),
        unused=(),
        same_fields=(*_SHAPE_FIELDS, "qk_norm"),
        router_bias="init",
        check=_upcycle_check,
    ),
}


@dataclasses.dataclass(frozen=True)
class _Context:
    target: ModelConfig
    key: jax.Array


def _experts(src: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """[L, a, b] -> [L, E, a, b]: one copy of the layer's matrix per routed expert."""
    return np.broadcast_to(src[:, None], shape).copy()


def _experts_down(src: np.ndarray, shape: tuple[int, ...], ctx: _Context) -> np.ndarray:
    share = 0.5 if ctx.target.n_shared_experts > 0 else 1.0  # the shared expert carries the other half
    return _experts(src, shape) * share


TRANSFORMS: dict[str, Callable[[Any, tuple[int, ...], _Context], np.ndarray]] = {
    "copy": lambda src, shape, ctx: src,
    "half": lambda src, shape, ctx: src * 0.5,  # the shared expert's half of the dense output (see upcycle)
    "ones": lambda src, shape, ctx: np.ones(shape),  # an RMSNorm gain of ones is the identity scale
    "experts": lambda src, shape, ctx: _experts(src, _check_expert_source(src, shape)),
    "experts_down": lambda src, shape, ctx: _experts_down(src, _check_expert_source(src, shape), ctx),
    "router_init": lambda src, shape, ctx: ctx.target.init_std * np.asarray(jax.random.normal(ctx.key, shape)),
}
_NEEDS_SOURCE = {"copy", "half", "experts", "experts_down"}


def _check_expert_source(src: np.ndarray, shape: tuple[int, ...]) -> tuple[int, ...]:
    if len(shape) != 4 or src.shape != shape[:1] + shape[2:]:
        raise _ShapeError(
            f"{list(src.shape)} cannot fill {shape[1] if len(shape) == 4 else '?'} experts of shape {list(shape[:1] + shape[2:])}"
        )
    return shape


class _ShapeError(ValueError):
    pass


def param_names(tree: Any) -> dict[str, Any]:
    """{"layers/wq": leaf, ...} of a parameter tree."""
    pairs, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {"/".join(str(k.key) for k in path): leaf for path, leaf in pairs}


def saved_params(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """{"layers/wq": array, ...}: the parameters among a checkpoint's arrays (``checkpoint.load``), whatever
    tree they came from."""
    out = {}
    for key, value in arrays.items():
        parts = re.findall(r"\['([^']*)'\]", key)
        if parts and parts[0] == "params" and key == "".join(f"['{p}']" for p in parts):
            out["/".join(parts[1:])] = value
    return out


def _applied_rules(mapping: ParamMapping, target: Mapping[str, Any], source: Mapping[str, Any]) -> list[Rule]:
    """The rules for the target's parameters, checked: each target made once, each source read or declared unused."""
    by_target: dict[str, Rule] = {}
    for rule in mapping.rules:
        if rule.target in by_target:
            raise ValueError(f"mapping {mapping.name}: two rules make {rule.target}")
        by_target[rule.target] = rule
    missing = [name for name in target if name not in by_target]
    if missing:
        raise ValueError(f"mapping {mapping.name}: target parameter {missing[0]} has no rule")
    rules = [by_target[name] for name in target]
    for rule in rules:
        if rule.source is not None and rule.source not in source:
            raise ValueError(
                f"mapping {mapping.name}: target {rule.target} reads source parameter {rule.source}, "
                f"which the checkpoint does not have"
            )
    read = {rule.source for rule in rules} | set(mapping.unused)
    extra = [name for name in source if name not in read]
    if extra:
        raise ValueError(
            f"mapping {mapping.name}: source parameter {extra[0]} is not used by any rule (the target model has no place for it)"
        )
    return rules


def map_params(
    mapping: ParamMapping, source: Mapping[str, np.ndarray], target_config: TrainConfig, model: Model, seed: int = 0
) -> dict:
    """The target model's parameter tree made from ``source`` ({"layers/wq": array}) by ``mapping``'s
    rules, in ``target_config.param_dtype``; ValueError (one line, naming the parameter) on any mismatch."""
    template = jax.eval_shape(lambda: model.init_params(target_config.model, jax.random.PRNGKey(0)))
    shapes = {name: tuple(leaf.shape) for name, leaf in param_names(template).items()}
    rules = _applied_rules(mapping, shapes, source)
    dtype = dtype_of(target_config.param_dtype, "TrainConfig.param_dtype")
    keys = jax.random.split(jax.random.PRNGKey(seed), len(rules))
    made = {}
    for rule, key in zip(rules, keys, strict=True):
        made[rule.target] = _apply(rule, source, shapes[rule.target], _Context(target_config.model, key), mapping.name)
    leaves = [np.asarray(made[name], dtype) for name in param_names(template)]
    return jax.tree_util.tree_unflatten(jax.tree.structure(template), leaves)


def _apply(rule: Rule, source: Mapping[str, np.ndarray], shape: tuple[int, ...], ctx: _Context, name: str) -> np.ndarray:
    if rule.transform not in TRANSFORMS:
        raise ValueError(f"mapping {name}: {rule.target} has unknown transform {rule.transform!r}")
    src = np.asarray(source[rule.source], np.float32) if rule.source is not None else None
    if (src is None) == (rule.transform in _NEEDS_SOURCE):
        raise ValueError(
            f"mapping {name}: transform {rule.transform} of {rule.target} "
            f"{'needs' if src is None else 'takes no'} source parameter"
        )
    where = f"mapping {name}: {rule.target} from {rule.source or 'nothing'} ({rule.transform})"
    try:
        out = TRANSFORMS[rule.transform](src, shape, ctx)
    except _ShapeError as e:
        raise ValueError(f"{where}: source {e}") from None
    if tuple(out.shape) != shape:
        raise ValueError(
            f"{where}: source shape {list(src.shape) if src is not None else []} gives "
            f"{list(out.shape)}, the target needs {list(shape)}"
        )
    return out


def _check_configs(mapping: ParamMapping, source: ModelConfig, target: ModelConfig) -> None:
    problem = mapping.check(source, target)
    if problem is not None:
        raise ValueError(f"mapping {mapping.name}: {problem}")
    for field in mapping.same_fields:
        if getattr(source, field) != getattr(target, field):
            raise ValueError(
                f"mapping {mapping.name}: model.{field} is {getattr(source, field)!r} in the source "
                f"and {getattr(target, field)!r} in the target; this mapping keeps it"
            )


def get_mapping(name: str) -> ParamMapping:
    if name not in MAPPINGS:
        raise ValueError(f"unknown mapping {name!r}; one of {sorted(MAPPINGS)}")
    return MAPPINGS[name]


@dataclasses.dataclass(frozen=True)
class Transplanted:
    checkpoint: Path | str  # the target checkpoint written
    step: int
    mapping: str


def transplant(
    checkpoint: str | os.PathLike,
    target: TrainConfig | str | os.PathLike,
    mapping: str,
    out: str | os.PathLike,
    model: Model | None = None,
    seed: int | None = None,
) -> Transplanted:
    """Write ``checkpoint``'s (a folder or an out dir: its newest valid one) parameters, carried over by the
    mapping named ``mapping``, as a checkpoint of ``target`` at ``out/checkpoints/step-<step>`` (see the
    module docstring for what else it holds). ``target``: the TrainConfig the run goes on with, or a YAML
    file of one (a ``model.vocab_size`` it leaves unset is the source's). ``seed`` seeds the new router weights
    (default: the target's ``seed``)."""
    rules = get_mapping(mapping)
    out = os.fspath(out)
    check_new_out(out, "transplant")
    folder = resolve_checkpoint(os.fspath(checkpoint))
    arrays, meta = ckpt.load(folder)
    if "config" not in meta or "step" not in meta:
        raise ValueError(f"{folder}/meta.json has no config or step: not a checkpoint marin train wrote")
    source_config = config_from_dict(meta["config"], where=f"{folder}/meta.json: config")
    if not isinstance(target, TrainConfig):
        target = load_config(os.fspath(target), vocab_size=source_config.model.vocab_size)
    _check_configs(rules, source_config.model, target.model)
    model = model or moe_model()
    params = map_params(rules, saved_params(arrays), target, model, target.seed if seed is None else seed)
    step = int(meta["step"])
    state = _target_state(target, model, params, arrays, rules, str(folder), step)
    made = param_names(params)
    record = {
        "source": str(folder),
        "mapping": rules.name,
        "rules": [[r.target, r.source, r.transform] for r in rules.rules if r.target in made],
    }
    new_meta = dict(meta, config=config_to_dict(target), optimizer=target.optimizer.name, **{META_KEY: record})
    written = ckpt.save(child(out, "checkpoints"), step, state.to_dict(), new_meta)
    return Transplanted(written, step, rules.name)


def _target_state(
    target: TrainConfig,
    model: Model,
    params: dict,
    arrays: Mapping[str, np.ndarray],
    mapping: ParamMapping,
    where: str,
    step: int,
) -> TrainState:
    """The target's train state around ``params``: a fresh optimizer state and guard windows, the source's
    step and RNG, its router bias when the mapping keeps it."""
    bias = model.init_router_bias(target.model)
    if mapping.router_bias == "copy":
        bias = ckpt.restore_like(bias, dict(arrays), "['router_bias']", where)
    opt = make_optimizer(target.optimizer, params)
    rng = ckpt.restore_like(jax.random.PRNGKey(0), dict(arrays), "['rng']", where)
    return TrainState(
        params=params,
        opt_state=jax.device_get(opt.init(params)),
        guard=init_guard_state(target.guards),
        router_bias=jnp.asarray(bias),
        step=jnp.int32(step),
        rng=rng,
    )
