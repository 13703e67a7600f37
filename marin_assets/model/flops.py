"""Parameter and FLOP counts (the one FLOP convention used for MFU everywhere).

Convention (PaLM appendix B style):
  training FLOPs per token = 6 * N_active_matmul + 12 * n_layers * seq_len * n_heads * head_dim
where N_active_matmul counts every weight matrix a token multiplies through: attention
projections, dense/shared MLPs, the router, the top_k routed experts it visits, the latent
projections and the LM head. The embedding lookup and norm weights are not matmuls and
are excluded. 6 = 2 (multiply-add) * 3 (forward + backward). The attention term counts
QK^T and AV over the full sequence (no causal discount), again x3 for training.
"""

from __future__ import annotations

from marin_assets.model.config import ModelConfig


def _layer_counts(config: ModelConfig) -> tuple[int, int, int]:
    """(matmul params always active, routed-expert params total, routed params active) per layer."""
    D, H, KV, hd = config.d_model, config.n_heads, config.n_kv_heads, config.resolved_head_dim
    attn = D * H * hd + 2 * D * KV * hd + H * hd * D
    dense_width = config.d_ff * (config.n_shared_experts if config.is_moe else 1)
    always = attn + 3 * D * dense_width
    if not config.is_moe:
        return always, 0, 0
    E, F, R = config.n_routed_experts, config.expert_d_ff, config.routed_dim
    always += D * E  # router
    if config.latent_dim is not None:
        always += 2 * D * R
    per_expert = 3 * R * F
    return always, E * per_expert, config.top_k * per_expert


def count_params(config: ModelConfig) -> tuple[int, int]:
    """(total parameters, parameters active per token), embeddings and norms included."""
    always, routed_total, routed_active = _layer_counts(config)
    D, V, L = config.d_model, config.vocab_size, config.n_layers
    norms = L * (2 * D + 2 * config.resolved_head_dim) + D
    shared = 2 * V * D + norms  # embedding + untied LM head + norms
    return shared + L * (always + routed_total), shared + L * (always + routed_active)


def active_matmul_params(config: ModelConfig) -> int:
    """Weights a token multiplies through (no embedding lookup, no norms)."""
    always, _, routed_active = _layer_counts(config)
    return config.n_layers * (always + routed_active) + config.d_model * config.vocab_size


def flops_per_token(config: ModelConfig, seq_len: int) -> float:
    """Training (forward + backward) FLOPs per token at context ``seq_len``."""
    if seq_len <= 0:
        raise ValueError(f"flops_per_token: seq_len must be positive, got {seq_len}")
    attn = 12 * config.n_layers * seq_len * config.n_heads * config.resolved_head_dim
    return float(6 * active_matmul_params(config) + attn)
