"""The per-step MoE telemetry (``model.moe.moe_step_metrics``) on routers forced into known loads
and transports forced into known drops, and the peak FLOP/s MFU is taken against."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from kernels.expert_parallel import ExpertParallel
from marin_assets.model.config import ModelConfig
from marin_assets.model.flops import PEAK_FLOPS_PER_CHIP, peak_flops
from marin_assets.model.moe import moe_step_metrics
from marin_assets.model.transformer import forward, init_params, init_router_bias
from tests.support.configs import TINY_MODEL

B, S = 4, 16  # 64 tokens


def _forced(top_k: int, experts: list[int]):
    """A model whose router sends every token to ``experts`` (zero router weights, a large bias)."""
    config = ModelConfig(**dict(TINY_MODEL, top_k=top_k))
    params = init_params(config, jax.random.PRNGKey(0))
    params["layers"]["router"] = jnp.zeros_like(params["layers"]["router"])
    bias = init_router_bias(config).at[:, jnp.asarray(experts)].set(10.0)
    return config, params, bias


def _stats(config, params, bias, ep=None) -> dict:
    tokens = jnp.zeros((B, S), jnp.int32)
    _, aux = jax.jit(lambda p, b: forward(p, tokens, config, b, ep))(params, bias)
    return {k: np.asarray(v) for k, v in jax.device_get(moe_step_metrics(aux)).items()}


@pytest.mark.parametrize("top_k,experts", [(1, [2]), (2, [1, 3])])
def test_a_router_forced_onto_k_experts_has_the_hand_computed_load_stats(top_k, experts):
    config, params, bias = _forced(top_k, experts)
    m = _stats(config, params, bias)
    E = config.n_routed_experts
    # load: T on each of the k chosen experts, 0 elsewhere; mean T*k/E.
    load = np.zeros(E)
    load[experts] = B * S
    assert float(m["load_max_over_mean"]) == pytest.approx(E / top_k)  # = n_experts for a top-1 router
    cv = load.std() / load.mean()  # population std, by hand: sqrt(E/k - 1)
    assert cv == pytest.approx(math.sqrt(E / top_k - 1))
    assert float(m["load_cv"]) == pytest.approx(cv, rel=1e-6)
    assert m["layer_load_cv"].shape == (config.n_layers,)
    # zero router weights: every logit 0, so the z-loss is log(E)^2
    assert float(m["router_z_loss"]) == pytest.approx(math.log(E) ** 2, rel=1e-6)
    # the single-device path has no capacity: nothing drops, of either kind
    assert float(m["drop_rate"]) == float(m["drop_rate_sender"]) == float(m["drop_rate_receiver"]) == 0.0


def test_an_even_load_has_cv_zero_and_max_over_mean_one():
    m = moe_step_metrics(
        {
            "expert_load": jnp.full((1, 4), 16),
            "dropped_sender": jnp.zeros((1,), jnp.int32),
            "dropped_receiver": jnp.zeros((1,), jnp.int32),
            "router_z": jnp.zeros((1,)),
        }
    )
    assert float(m["load_cv"]) == 0.0 and float(m["load_max_over_mean"]) == 1.0


@pytest.mark.parametrize("transport", ["pooled", "ragged"])
def test_drop_rate_is_dropped_over_routed_split_by_the_limit_that_dropped(transport):
    # One device, capacity factors below 1, every token to expert 0: A = 64 assignments.
    # pooled: pool = 3 waves * ceil(ceil(0.5 * 64) / 3) = 33 rows sent, 31 dropped at the sender;
    #         each of the 4 local experts takes ceil(0.25 * 64 / 4) = 4 rows: expert 0 keeps 4 of
    #         the 33, 29 dropped there.
    # ragged: no sender limit; expert 0's 4 slots bind, 60 dropped, all receiver-side.
    config, params, bias = _forced(1, [0])
    mesh = Mesh(np.asarray(jax.devices()[:1]), ("expert",))
    ep = ExpertParallel(mesh, transport=transport, capacity_factor_send=0.5, capacity_factor_recv=0.25)
    m = _stats(config, params, bias, ep)
    sender, receiver = (31, 29) if transport == "pooled" else (0, 60)
    routed = B * S * config.top_k
    assert float(m["drop_rate_sender"]) == pytest.approx(sender / routed)
    assert float(m["drop_rate_receiver"]) == pytest.approx(receiver / routed)
    assert float(m["drop_rate"]) == pytest.approx((sender + receiver) / routed)
    np.testing.assert_allclose(m["layer_drop_rate"], [(sender + receiver) / routed] * config.n_layers)


def test_the_peak_is_a_listed_datasheet_figure_or_a_measured_or_configured_one():
    cpu = jax.devices("cpu")
    measured = peak_flops(cpu)
    assert measured.source.startswith("measured") and math.isfinite(measured.flops_per_s) and measured.flops_per_s > 1e8
    assert peak_flops(cpu, configured=2.5e11) == type(measured)(2.5e11, "configured")
    with pytest.raises(ValueError, match="configured peak"):
        peak_flops(cpu, configured=float("nan"))

    class FakeChip:
        device_kind, process_index = "NVIDIA H200", 0

    listed = peak_flops([FakeChip()] * 8)
    assert listed.flops_per_s == 8 * PEAK_FLOPS_PER_CHIP["NVIDIA H200"][0] and "nvidia.com" in listed.source
