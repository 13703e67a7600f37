"""Communication planner for a layer of routed experts: FSDP over the experts vs expert parallelism.

Per GPU, per MoE layer, forward pass, with E routed experts of width F, top-k routing, routed width R
(``ModelConfig.routed_dim``: the latent when the routed input is projected down, else d_model), T
tokens on the GPU per step and b bytes per value on the wire:

  FSDP over experts  the GPU all-gathers the layer's routed-expert weights before using them:
                     W = E * 3 * R * F * b            (SwiGLU: gate and up [R, F], down [F, R])
  expert parallelism the weights stay put; each of the T * k assignments travels to its expert's
                     GPU (dispatch) and its output comes back (combine), R values each way:
                     A = 2 * T * k * R * b

Both are upper bounds by a factor (P - 1) / P for a group of P GPUs (the GPU's own shard, or the
assignments whose expert is local, do not travel), ~1 at EP64. The backward pass repeats the
exchange (EP: two more all-to-alls; FSDP: a second gather plus a reduce-scatter of the gradients).
Capacity padding of a fixed-size transport is not counted: A is the dropless ragged payload.

Consequences the tests check on these formulas:
- projecting the routed input to a latent R < d_model scales A by R / d_model (a half at R = D/2);
  W shrinks by the same factor, since the experts then work at width R;
- at equal tokens, g times as many experts, each 1/g as wide, with g times the top-k (384-choose-8
  against 192-choose-4: g = 2) keep W (E * F is unchanged) and multiply A by g.

Marin's 535B-A23B (marin-community/marin#8435: 48 layers, d_model 6144, 384 experts of width 3072,
top-8, latent 3072, 2 shared experts of width 3072, 48 heads of 128, 12 KV heads, vocab 128,256) gives
W = 384 * 3 * 3072 * 3072 * 2 B = 20.25 GiB. A assumes T = 65,536 tokens per GPU per step: a batch
of 1024 sequences of 4096 over the 64 GPUs of one EP64 rack, the setup of marin-community/marin#7279
(the hero run's own batch is not assumed); then A = 2 * 65536 * 8 * 3072 * 2 B = 6.0 GiB.

Parameter counts come from ``jax.eval_shape`` over ``marin_assets.model.init_params`` (shapes only,
no allocation). ``active`` follows the convention of the published "22.76B active": what one token
passes through in the blocks (attention, norms, router, latent projections, shared experts, its top-k
routed experts), without the two vocabulary matrices; ``active_with_vocab`` adds the embedding table
and the LM head (``marin_assets.model.count_params``' active count).
"""

from __future__ import annotations

import dataclasses
import math

from marin_assets.knobs import knob
from marin_assets.model.config import ModelConfig
from marin_assets.model.flops import attention_spans
from marin_assets.model.transformer import init_params
from marin_assets.numeric_checks import check_float, check_int

GIB = 2**30
TIB = 2**40
ROUTED_EXPERT_LEAVES = ("e_gate", "e_up", "e_down")  # init_params' stacked [L, E, ...] routed weights
VOCAB_LEAVES = ("embed", "lm_head")


@dataclasses.dataclass(frozen=True)
class CommPlanConfig:
    """What the planner assumes beyond the model config (see the module docstring)."""

    tokens_per_gpu: int = knob(65536, help="tokens each GPU holds per step (batch x seq_len / GPUs)")
    bytes_per_value: float = knob(2.0, help="bytes per weight or activation value on the wire (bf16: 2)")
    state_bytes_per_param: float = knob(
        16.0, help="training-state bytes per parameter (bf16 weights and grads, fp32 master weights and two Adam moments)"
    )
    granularity: int = knob(2, help="the coarser layout compared against has this factor fewer experts and top-k, wider experts")

    def __post_init__(self) -> None:
        check_int("CommPlanConfig.tokens_per_gpu", self.tokens_per_gpu, lo=1)
        check_float("CommPlanConfig.bytes_per_value", self.bytes_per_value, lo=0.0, lo_open=True)
        check_float("CommPlanConfig.state_bytes_per_param", self.state_bytes_per_param, lo=0.0, lo_open=True)
        check_int("CommPlanConfig.granularity", self.granularity, lo=2)


@dataclasses.dataclass(frozen=True)
class ExpertLayout:
    """The routed experts of one layer, as far as communication is concerned."""

    n_experts: int
    top_k: int
    expert_d_ff: int
    routed_dim: int

    @classmethod
    def of(cls, model: ModelConfig) -> ExpertLayout:
        if not model.is_moe:
            raise ValueError("the model has no routed experts (n_routed_experts = 0): nothing to plan")
        return cls(model.n_routed_experts, model.top_k, model.expert_d_ff, model.routed_dim)

    @property
    def expert_params(self) -> int:
        """Routed-expert parameters of the layer: E * 3 * R * F."""
        return self.n_experts * 3 * self.routed_dim * self.expert_d_ff

    def coarser(self, g: int) -> ExpertLayout:
        """g times fewer experts, g times as wide, g times fewer picks: same expert parameters and compute."""
        if self.n_experts % g or self.top_k % g:
            raise ValueError(f"{self.n_experts} experts top-{self.top_k} cannot be made {g} times coarser (not divisible)")
        return ExpertLayout(self.n_experts // g, self.top_k // g, self.expert_d_ff * g, self.routed_dim)


def fsdp_weight_bytes(layout: ExpertLayout, bytes_per_value: float) -> float:
    """W = E * 3 * R * F * b: the layer's routed-expert weights one GPU gathers under FSDP."""
    return layout.expert_params * bytes_per_value


def ep_activation_bytes(layout: ExpertLayout, tokens_per_gpu: int, bytes_per_value: float) -> float:
    """A = 2 * T * k * R * b: one GPU's dispatch plus combine payload under expert parallelism."""
    return 2 * tokens_per_gpu * layout.top_k * layout.routed_dim * bytes_per_value


def param_counts(model: ModelConfig) -> dict[str, int]:
    """Parameter counts of ``init_params(model)`` from ``jax.eval_shape``: shapes only, nothing allocated."""
    import jax

    shapes = jax.eval_shape(lambda key: init_params(model, key), jax.random.PRNGKey(0))
    layers = shapes["layers"]
    total = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(shapes))
    routed = sum(math.prod(layers[name].shape) for name in ROUTED_EXPERT_LEAVES if name in layers)
    unvisited = routed - routed * model.top_k // model.n_routed_experts if model.is_moe else 0
    vocab = sum(math.prod(shapes[name].shape) for name in VOCAB_LEAVES)
    return {
        "total": total,
        "active": total - unvisited - vocab,
        "active_with_vocab": total - unvisited,
        "routed_expert_per_layer": routed // model.n_layers,
    }


def layout_row(layout: ExpertLayout, config: CommPlanConfig) -> dict:
    """One layout's figures (bytes and GiB per GPU per layer)."""
    weights = fsdp_weight_bytes(layout, config.bytes_per_value)
    activations = ep_activation_bytes(layout, config.tokens_per_gpu, config.bytes_per_value)
    return dataclasses.asdict(layout) | {
        "expert_params_per_layer": layout.expert_params,
        "fsdp_weight_bytes": weights,
        "fsdp_weight_gib": weights / GIB,
        "ep_activation_bytes": activations,
        "ep_activation_gib": activations / GIB,
        "fsdp_over_ep": weights / activations,
    }


def coarser_row(layout: ExpertLayout, config: CommPlanConfig) -> tuple[dict | None, list[str]]:
    """The ``granularity`` times coarser layout's row, or None and the reason when it does not divide."""
    try:
        return layout_row(layout.coarser(config.granularity), config), []
    except ValueError as exc:
        return None, [f"coarser layout not computed: {exc}"]


def attention_plan(model: ModelConfig, seq_len: int, bytes_per_value: float) -> dict:
    """The attention pattern at context ``seq_len``: global and sliding-window layers, the attention FLOPs
    per token (model/flops.py's convention) and the keys and values one sequence holds, against the same
    model with every layer global."""
    spans = attention_spans(model, seq_len)
    per_key = 12 * model.n_heads * model.resolved_head_dim  # training FLOPs per token per attended key
    kv_bytes = 2 * model.n_kv_heads * model.resolved_head_dim * bytes_per_value  # one key and value, one layer
    everywhere = len(spans) * seq_len
    return {
        "seq_len": seq_len,
        "window": model.sliding_window,
        "global_layers": sum(w is None for w in model.layer_windows),
        "sliding_layers": sum(w is not None for w in model.layer_windows),
        "attention_flops_per_token": per_key * sum(spans),
        "all_global_attention_flops_per_token": per_key * everywhere,
        "kv_bytes_per_sequence": kv_bytes * sum(spans),
        "all_global_kv_bytes_per_sequence": kv_bytes * everywhere,
        "pattern_over_all_global": sum(spans) / everywhere,
    }


def plan_comm(model: ModelConfig, config: CommPlanConfig, seq_len: int | None = None) -> dict:
    """Every figure ``marin plan comm`` prints: parameter counts, training state, the traffic of the model's
    layout, of the same without a latent (R = d_model) and of a ``granularity`` times coarser one, with ratios,
    and the attention pattern at ``seq_len`` (default: the model's max_seq_len)."""
    layout = ExpertLayout.of(model)
    mine = layout_row(layout, config)
    plain = layout_row(dataclasses.replace(layout, routed_dim=model.d_model), config)
    coarse, notes = coarser_row(layout, config)
    params = param_counts(model)
    state = params["total"] * config.state_bytes_per_param
    ratios = {
        "fsdp_over_ep": mine["fsdp_over_ep"],
        "latent_over_no_latent_ep": mine["ep_activation_bytes"] / plain["ep_activation_bytes"],
        "config_over_coarser_ep": None if coarse is None else mine["ep_activation_bytes"] / coarse["ep_activation_bytes"],
    }
    return {
        "assumptions": dataclasses.asdict(config),
        "params": params | {"source": "jax.eval_shape(init_params)"},
        "training_state_bytes": state,
        "training_state_tib": state / TIB,
        "layouts": {"config": mine, "without_latent": plain, "coarser": coarse},
        "ratios": ratios,
        "attention": attention_plan(model, seq_len or model.max_seq_len, config.bytes_per_value),
        "notes": notes,
    }
