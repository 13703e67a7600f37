import jax
import pytest

from marin_assets.model import ModelConfig, active_matmul_params, count_params, flops_per_token, init_params


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"n_heads": 6, "n_kv_heads": 4}, "divisible by n_kv_heads"),
        ({"top_k": 5, "n_routed_experts": 4}, "top_k"),
        ({"d_model": 65}, "head_dim"),
        ({"balancing": "aux_loss"}, "balancing"),
        ({"grouped_matmul": "pallas"}, "grouped_matmul"),
        ({"capacity_factor_recv": 0.0}, "capacity"),
        ({"vocab_size": 0}, "vocab_size"),
    ],
)
def test_invalid_configs_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**kwargs)


@pytest.mark.parametrize(
    "config",
    [
        ModelConfig(),
        ModelConfig(n_routed_experts=0),
        ModelConfig(latent_dim=16, n_shared_experts=2, head_dim=8),
        ModelConfig(n_shared_experts=0, n_routed_experts=8, top_k=3),
    ],
)
def test_count_params_matches_initialised_tree(config):
    params = jax.eval_shape(lambda: init_params(config, jax.random.PRNGKey(0)))  # shapes only: no arrays made
    total, active = count_params(config)
    assert total == sum(x.size for x in jax.tree.leaves(params))
    if config.is_moe:
        per_expert = 3 * config.routed_dim * config.expert_d_ff * config.n_layers
        assert total - active == (config.n_routed_experts - config.top_k) * per_expert
    else:
        assert total == active


def test_flops_per_token_dense_by_hand():
    c = ModelConfig(vocab_size=100, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=64, n_routed_experts=0)
    hd = 8
    per_layer = 32 * 4 * hd + 2 * 32 * 2 * hd + 4 * hd * 32 + 3 * 32 * 64
    n = 3 * per_layer + 32 * 100
    assert active_matmul_params(c) == n
    assert flops_per_token(c, 128) == 6 * n + 12 * 3 * 128 * 4 * hd
    with pytest.raises(ValueError):
        flops_per_token(c, 0)
