"""Parameter and FLOP counts (the one FLOP convention used for MFU everywhere).

Convention (PaLM appendix B style):
  training FLOPs per token = 6 * N_active_matmul + 12 * n_layers * seq_len * n_heads * head_dim
where N_active_matmul counts every weight matrix a token multiplies through: attention
projections, dense/shared MLPs, the router, the top_k routed experts it visits, the latent
projections and the LM head. The embedding lookup and norm weights are not matmuls and
are excluded. 6 = 2 (multiply-add) * 3 (forward + backward). The attention term counts
QK^T and AV over the full sequence (no causal discount), again x3 for training; a sliding-window
layer counts its window instead of the sequence.

MFU = tokens/s x flops_per_token / peak_flops (``peak_flops``: a configured figure when given,
else the datasheet peak of a listed accelerator, else a measured matmul rate, as on a CPU).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time

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


def attention_spans(config: ModelConfig, seq_len: int) -> list[int]:
    """Keys each layer's queries attend over at context ``seq_len``: the whole context, or a
    sliding-window layer's window when it is shorter."""
    return [seq_len if window is None else min(window, seq_len) for window in config.layer_windows]


def flops_per_token(config: ModelConfig, seq_len: int) -> float:
    """Training (forward + backward) FLOPs per token at context ``seq_len`` (a sliding-window layer
    attends over its window)."""
    if seq_len <= 0:
        raise ValueError(f"flops_per_token: seq_len must be positive, got {seq_len}")
    attn = 12 * sum(attention_spans(config, seq_len)) * config.n_heads * config.resolved_head_dim
    return float(6 * active_matmul_params(config) + attn)


# MFU's denominator: dense bf16 matrix-unit peak per chip (no structured sparsity), from the vendors' public
# datasheets, keyed by ``jax.Device.device_kind`` (JAX's spellings, and their aliases). A kind not listed (CPUs,
# other chips) has its peak measured. An H200 NVL reports the same kind as the SXM part but peaks lower (835e12 on
# the same page), so its MFU reads low by that factor; configure the peak there.
PEAK_FLOPS_PER_CHIP: dict[str, tuple[float, str]] = {
    "NVIDIA H100 80GB HBM3": (989e12, "https://www.nvidia.com/en-us/data-center/h100/ (SXM, BF16 dense)"),
    "NVIDIA H200": (989e12, "https://www.nvidia.com/en-us/data-center/h200/ (SXM, BF16 dense)"),
    "NVIDIA A100-SXM4-80GB": (312e12, "https://www.nvidia.com/en-us/data-center/a100/ (BF16 dense)"),
    "NVIDIA A100-SXM4-40GB": (312e12, "https://www.nvidia.com/en-us/data-center/a100/ (BF16 dense)"),
    "TPU v4": (275e12, "https://cloud.google.com/tpu/docs/v4 (bf16)"),
    "TPU v5 lite": (197e12, "https://cloud.google.com/tpu/docs/v5e (bf16)"),
    "TPU v5e": (197e12, "https://cloud.google.com/tpu/docs/v5e (bf16)"),
    "TPU v5": (459e12, "https://cloud.google.com/tpu/docs/v5p (bf16)"),
    "TPU v5p": (459e12, "https://cloud.google.com/tpu/docs/v5p (bf16)"),
    "TPU v6 lite": (918e12, "https://cloud.google.com/tpu/docs/v6e (bf16)"),
    "TPU v6e": (918e12, "https://cloud.google.com/tpu/docs/v6e (bf16)"),
}

MEASURE_SIZE, MEASURE_REPEATS = 1024, 5  # the measured peak: best of 5 fp32 [1024 x 1024] @ [1024 x 1024]


@dataclasses.dataclass(frozen=True)
class PeakFlops:
    """Peak FLOP/s of the devices a step runs on, and where the figure comes from."""

    flops_per_s: float
    source: str


def measured_matmul_flops(device=None) -> float:
    """FLOP/s of the best of ``MEASURE_REPEATS`` fp32 square matmuls on ``device`` (default: this process's first).

    On a CPU one matmul already uses every core XLA's thread pool has, so this is the whole
    host's achievable matmul rate, not one core's; measure before training starts, not beside it."""
    import jax
    import jax.numpy as jnp

    device = device or jax.local_devices()[0]
    n = MEASURE_SIZE
    a = jax.device_put(jnp.ones((n, n), jnp.float32), device)
    matmul = jax.jit(lambda x: x @ x)
    matmul(a).block_until_ready()  # compile outside the timing
    best = math.inf
    for _ in range(MEASURE_REPEATS):
        start = time.perf_counter()
        matmul(a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2.0 * n**3 / best


def peak_flops(devices=None, configured: float | None = None) -> PeakFlops:
    """The peak FLOP/s of ``devices`` (default: every device of the run) for MFU.

    ``configured`` (FLOP/s for all of them together) wins when given. Otherwise a listed chip
    (``PEAK_FLOPS_PER_CHIP``) counts its datasheet peak once per device. Anything else (a CPU)
    is measured (``measured_matmul_flops``) once per process: CPU devices that XLA splits one
    host into share its cores, so a host counts once, however many devices it shows."""
    import jax

    devices = list(devices) if devices is not None else jax.devices()
    if configured is not None:
        if not math.isfinite(configured) or configured <= 0:
            raise ValueError(f"peak_flops: configured peak must be a positive finite FLOP/s, got {configured!r}")
        return PeakFlops(float(configured), "configured")
    kind = devices[0].device_kind
    if kind in PEAK_FLOPS_PER_CHIP:
        per_chip, source = PEAK_FLOPS_PER_CHIP[kind]
        return PeakFlops(per_chip * len(devices), f"{kind} x {len(devices)}: {source}")
    hosts = len({d.process_index for d in devices})
    per_host = _measured_once(kind)
    return PeakFlops(
        per_host * hosts,
        f"measured: best of {MEASURE_REPEATS} fp32 {MEASURE_SIZE}^3 matmuls on {kind} = {per_host:.3g} FLOP/s per host x {hosts}",
    )


@functools.cache
def _measured_once(kind: str) -> float:
    return measured_matmul_flops()
