"""Model configuration: one validated dataclass for dense and MoE decoders."""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from kernels.choices import ATTENTION_IMPLS as _ATTENTION_IMPLS
from kernels.choices import EP_TRANSPORTS as _EP_TRANSPORTS
from kernels.choices import GATINGS as _GATINGS
from kernels.choices import GROUPED_MATMUL_IMPLS as _GROUPED_MATMUL
from marin_assets.numeric_checks import check_field_types, check_float, check_int

# Token ids, positions and per-dimension index arithmetic are int32 on the device: a size past this
# is refused here rather than wrapping or overflowing inside the first step.
MAX_INT32 = 2**31 - 1
# Integer fields' ranges, checked before any other test (so 2**70 or -1 is named, never an
# OverflowError later). The ones only an MoE uses may be 0 on a dense model; the MoE checks below
# ask more of them.
_INT_RANGES = {
    "vocab_size": 1,
    "d_model": 1,
    "n_layers": 1,
    "n_heads": 1,
    "n_kv_heads": 1,
    "head_dim": 1,
    "d_ff": 1,
    "n_routed_experts": 0,
    "n_shared_experts": 0,
    "top_k": 0,
    "expert_d_ff": 0,
    "latent_dim": 1,
    "max_seq_len": 1,
    "histogram_bins": 1,
    "sliding_window": 1,
    "global_attention_every": 1,
}

# How the step computes (model/compute.py maps each name onto JAX), named here so a config checks them
# without importing JAX.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}  # bytes per value
DTYPE_NAMES = tuple(DTYPE_BYTES)
DEFAULT_DTYPE = "float32"
REMAT_NAMES = ("none", "full", "save_matmuls")
DEFAULT_REMAT = "none"


def check_dtype(name: str, what: str = "compute_dtype") -> str:
    """``name`` when it is one of DTYPE_NAMES, else a ValueError naming ``what`` (the knob it came from)."""
    if name not in DTYPE_NAMES:
        raise ValueError(f"{what} must be one of {DTYPE_NAMES}, got {name!r}")
    return name


def check_remat(policy: str, what: str = "remat") -> str:
    """``policy`` when it is one of REMAT_NAMES, else a ValueError naming ``what``."""
    if policy not in REMAT_NAMES:
        raise ValueError(f"{what} must be one of {REMAT_NAMES}, got {policy!r}")
    return policy


Balancing = Literal["quantile_exact", "quantile_histogram", "none"]
_BALANCING = ("quantile_exact", "quantile_histogram", "none")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer; ``n_routed_experts == 0`` makes it dense.

    Dense model: every layer has a SwiGLU MLP of width ``d_ff``.
    MoE model: every layer has ``n_shared_experts`` SwiGLU experts of width ``d_ff``
    that every token passes through, plus ``n_routed_experts`` routed experts of width
    ``expert_d_ff`` of which each token uses ``top_k``.
    """

    vocab_size: int = 256
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int | None = None  # None: d_model // n_heads
    d_ff: int = 128  # dense MLP width, and the width of each shared expert
    n_routed_experts: int = 4  # 0 = dense
    n_shared_experts: int = 1
    top_k: int = 2
    expert_d_ff: int = 64
    latent_dim: int | None = None  # routed input projected to this width before dispatch
    # Expert-parallel capacities (kernels/expert_parallel.py). send: a pooled sender's fixed pool per
    # destination device, ceil(cf * A / P) rows (A assignments per device, P devices on the expert axis).
    # recv, both transports: each local expert accepts ceil(cf * A * P / E) rows, cf times its even share.
    capacity_factor_send: float = 1.10
    capacity_factor_recv: float = 1.15
    router_z_loss: float = 0.0
    lm_z_loss: float = 1e-4
    max_seq_len: int = 256
    rope_theta: float = 10000.0
    rope_fraction: float = 1.0  # share of each head's dims that RoPE rotates (partial RoPE < 1)
    qk_norm: bool = True  # RMS-normalise q and k before the attention logits
    # Attention kernel (kernels/attention.py), the same math either way: "auto" = cuDNN flash attention on
    # an NVIDIA GPU (bf16), Pallas splash on TPU, on CPU the naive reference up to 1024 tokens and the
    # blockwise (memory linear in S) path beyond; or one of "reference", "blockwise", "xla", "cudnn", "splash".
    attention_impl: str = "auto"
    # Sliding-window layers see only the last ``sliding_window`` positions; with ``global_attention_every``
    # k, layers k-1, 2k-1, ... stay global (k=4: a window on three layers of four). None: every layer global.
    sliding_window: int | None = None
    global_attention_every: int | None = None
    # RoPE positions restart at each document of a packed row (with document masking, a packed document
    # then computes exactly what it would alone).
    rope_per_document: bool = False
    balancing: Balancing = "quantile_exact"
    # Router scores that weight the chosen experts (kernels/router.route_topk): "sigmoid" (ours), or
    # "softmax" over every expert, which is Mixtral's and Qwen3-MoE's router (what an HF export needs).
    router_gating: Literal["sigmoid", "softmax"] = "sigmoid"
    histogram_bins: int = 10_000
    # Fraction of the measured quantile shift applied per step. 1.0 is the full
    # correction; a little damping stops experts from oscillating around their share.
    balancing_rate: float = 0.5
    # Coefficient of the sequence-wise balance loss (kernels/balancing.sequence_balance_loss, DeepSeek-V3's
    # complementary loss; they use a tiny one): evens each sequence's routing, which the batch-wide quantile
    # bias cannot. 0 = off.
    sequence_balance_loss: float = 0.0
    # Routed-expert grouped matmul (kernels/grouped_matmul.py): "auto" = jax.lax.ragged_dot
    # on TPU, the blocked batched matmul elsewhere (ragged_dot is lowered densely there, G
    # times the FLOPs); "ragged_dot" / "blocked" force one. Same math either way.
    grouped_matmul: str = "auto"
    # How routed tokens travel between the devices of a mesh's expert axis (kernels/expert_parallel.py):
    # "ragged" exchanges counts first and sends exactly what the experts accept; "pooled" sends fixed
    # pools in 3 waves, running the experts on each wave as it arrives. capacity_factor_send/recv bound them.
    ep_transport: str = "ragged"
    norm_eps: float = 1e-6
    init_std: float = 0.02

    def __post_init__(self) -> None:
        check_field_types(self)
        for name, lo in _INT_RANGES.items():
            if getattr(self, name) is not None:
                check_int(f"ModelConfig.{name}", getattr(self, name), lo, MAX_INT32)

        def positive(name: str) -> None:
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")

        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"ModelConfig: n_heads ({self.n_heads}) must be divisible by "
                f"n_kv_heads ({self.n_kv_heads}) for grouped-query attention"
            )
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ValueError(
                f"ModelConfig: d_model ({self.d_model}) is not divisible by n_heads ({self.n_heads}); set head_dim explicitly"
            )
        if self.head_dim is not None:
            positive("head_dim")
        if self.resolved_head_dim % 2:
            raise ValueError(f"ModelConfig: head_dim ({self.resolved_head_dim}) must be even for RoPE")
        if self.n_routed_experts < 0 or self.n_shared_experts < 0:
            raise ValueError("ModelConfig: expert counts must be >= 0")
        if self.n_routed_experts > 0:
            positive("expert_d_ff")
            positive("top_k")
            if self.top_k > self.n_routed_experts:
                raise ValueError(f"ModelConfig: top_k ({self.top_k}) must be <= n_routed_experts ({self.n_routed_experts})")
            if self.latent_dim is not None:
                positive("latent_dim")
        for name in ("capacity_factor_send", "capacity_factor_recv"):
            # At n_routed_experts a capacity already holds every assignment (send: the expert axis divides
            # E; recv: E x the even share is all of them); a larger one only sizes larger empty buffers, and
            # an absurd one (1e300) buffers that cannot be allocated. 2 leaves a one-expert layout its slack.
            check_float(
                f"ModelConfig.{name}",
                getattr(self, name),
                0.0,
                max(self.n_routed_experts, 2) if self.is_moe else None,
                lo_open=True,
            )
        if self.router_z_loss < 0 or self.lm_z_loss < 0:
            raise ValueError("ModelConfig: z-loss coefficients must be >= 0")
        if self.balancing not in _BALANCING:
            raise ValueError(f"ModelConfig.balancing must be one of {_BALANCING}, got {self.balancing!r}")
        if self.router_gating not in _GATINGS:
            raise ValueError(f"ModelConfig.router_gating must be one of {_GATINGS}, got {self.router_gating!r}")
        if self.grouped_matmul not in _GROUPED_MATMUL:
            raise ValueError(f"ModelConfig.grouped_matmul must be one of {_GROUPED_MATMUL}, got {self.grouped_matmul!r}")
        for name in ("norm_eps", "init_std", "rope_theta"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ModelConfig.{name} must be > 0, got {getattr(self, name)}")
        if not 0.0 <= self.rope_fraction <= 1.0:
            raise ValueError(f"ModelConfig.rope_fraction must be in [0, 1], got {self.rope_fraction}")
        if self.attention_impl not in _ATTENTION_IMPLS:
            raise ValueError(f"ModelConfig.attention_impl must be one of {_ATTENTION_IMPLS}, got {self.attention_impl!r}")
        if self.global_attention_every is not None and self.sliding_window is None:
            raise ValueError("ModelConfig.global_attention_every needs a sliding_window (otherwise every layer is global)")
        if self.ep_transport not in _EP_TRANSPORTS:
            raise ValueError(f"ModelConfig.ep_transport must be one of {_EP_TRANSPORTS}, got {self.ep_transport!r}")
        if not (math.isfinite(self.sequence_balance_loss) and self.sequence_balance_loss >= 0.0):
            raise ValueError(f"ModelConfig.sequence_balance_loss must be a finite number >= 0, got {self.sequence_balance_loss}")
        if not 0.0 < self.balancing_rate <= 1.0:
            raise ValueError(f"ModelConfig.balancing_rate must be in (0, 1], got {self.balancing_rate}")

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's attention window (None: global), in layer order."""
        every = self.global_attention_every
        return tuple(
            None if self.sliding_window is None or (every and (i + 1) % every == 0) else self.sliding_window
            for i in range(self.n_layers)
        )

    @property
    def is_moe(self) -> bool:
        return self.n_routed_experts > 0

    @property
    def routed_dim(self) -> int:
        """Width of the tokens the routed experts see (the latent when enabled)."""
        return self.latent_dim if self.latent_dim is not None else self.d_model


# The fields that decide the parameters and the forward; a warm start needs them equal.
_ARCH_FIELDS = (
    "vocab_size",
    "d_model",
    "n_layers",
    "n_heads",
    "n_kv_heads",
    "resolved_head_dim",
    "qk_norm",
    "rope_theta",
    "rope_fraction",
    "norm_eps",
    "n_routed_experts",
)
_MOE_FIELDS = ("top_k", "expert_d_ff", "n_shared_experts", "latent_dim", "router_gating")


def first_architecture_difference(a: ModelConfig, b: ModelConfig) -> str | None:
    """The first field (ours) that makes ``a`` and ``b`` different models, or None when they are the same
    model (training knobs and max_seq_len aside)."""
    fields: list[str] = list(_ARCH_FIELDS)
    if a.is_moe and b.is_moe:
        fields += _MOE_FIELDS
    if not a.is_moe or a.n_shared_experts or not b.is_moe or b.n_shared_experts:
        fields.append("d_ff")
    for field in fields:
        if getattr(a, field) != getattr(b, field):
            return "head_dim" if field == "resolved_head_dim" else field
    return None
