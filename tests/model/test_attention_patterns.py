"""Document masking and sliding-window layers in the model: a packed document computes what it
computes alone, the kernels agree inside the model, and a window pattern changes what a layer sees."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marin_assets.model import ModelConfig, forward, init_params, loss_fn
from marin_assets.model.layers import document_positions
from tests.support.configs import TINY_MODEL

LENGTHS = (20, 12)  # two documents packed into one row of 32
TOL = 1e-5


def _config(**changes) -> ModelConfig:
    return ModelConfig(**dict(TINY_MODEL, n_layers=2, init_std=0.5, rope_per_document=True) | changes)


def _docs(config: ModelConfig) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(1, config.vocab_size, n).astype(np.int32) for n in LENGTHS]


def _run(config, params, tokens, segment_ids=None, loss_mask=None):
    bias = jnp.zeros((config.n_layers, config.n_routed_experts))
    logits = jax.jit(lambda p, t, s: forward(p, t, config, bias, segment_ids=s)[0])(params, tokens, segment_ids)
    _, aux = jax.jit(lambda p, t, s, m: loss_fn(p, t, config, bias, m, segment_ids=s))(params, tokens, segment_ids, loss_mask)
    return np.asarray(logits), float(aux["ce_loss"])


@pytest.mark.parametrize(
    "impl, experts",
    [("reference", 0), ("blockwise", 0), ("xla", 0), ("blockwise", 4)],
    ids=["dense-reference", "dense-blockwise", "dense-xla", "moe-blockwise"],
)
def test_two_packed_documents_compute_what_each_computes_alone(impl, experts):
    config = _config(attention_impl=impl, n_routed_experts=experts)
    params = init_params(config, jax.random.PRNGKey(0))
    docs = _docs(config)
    packed = np.concatenate(docs)[None]
    segments = np.repeat([0, 1], LENGTHS)[None].astype(np.int32)
    mask = np.ones_like(packed)
    mask[0, LENGTHS[0]] = 0  # the second document's first token is no target of the first's last
    logits, ce = _run(config, params, packed, segments, mask)
    alone = [_run(config, params, doc[None], None, np.ones((1, len(doc)), np.int32)) for doc in docs]
    np.testing.assert_allclose(logits[0, : LENGTHS[0]], alone[0][0][0], atol=TOL, rtol=TOL)
    np.testing.assert_allclose(logits[0, LENGTHS[0] :], alone[1][0][0], atol=TOL, rtol=TOL)
    targets = [n - 1 for n in LENGTHS]
    assert ce == pytest.approx(sum(t * a[1] for t, a in zip(targets, alone)) / sum(targets), abs=TOL)
    # and without the segment ids the second document reads the first: different logits
    crossed, _ = _run(config, params, packed, None, mask)
    assert np.abs(crossed[0, LENGTHS[0] :] - logits[0, LENGTHS[0] :]).max() > 1e-3


def test_document_positions_restart_per_segment():
    segments = jnp.asarray([[0, 0, 0, 1, 1, 2], [5, 5, 5, 5, 5, 5]])
    assert document_positions(segments).tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]]


def test_a_window_pattern_runs_the_same_under_every_kernel():
    """Window 4 on layer 0, layer 1 global: the kernels that read a traced window (reference, blockwise)
    and the library kernel switched per layer (xla) agree; the pattern changes the logits."""
    base = dict(n_routed_experts=0, sliding_window=4, global_attention_every=2, rope_per_document=False)
    tokens = np.random.default_rng(1).integers(0, 256, (2, 32)).astype(np.int32)
    logits = {}
    for impl in ("reference", "blockwise", "xla"):
        config = _config(**base, attention_impl=impl)
        logits[impl] = _run(config, init_params(config, jax.random.PRNGKey(0)), tokens)[0]
    for impl in ("blockwise", "xla"):
        np.testing.assert_allclose(logits[impl], logits["reference"], atol=TOL, rtol=TOL)
    everywhere_global = _config(**dict(base, sliding_window=None, global_attention_every=None))
    full = _run(everywhere_global, init_params(everywhere_global, jax.random.PRNGKey(0)), tokens)[0]
    np.testing.assert_allclose(full[:, :4], logits["reference"][:, :4], atol=TOL, rtol=TOL)  # inside the window
    assert np.abs(full[:, 4:] - logits["reference"][:, 4:]).max() > 1e-3


def test_pattern_and_kernel_choices_are_checked():
    assert _config(n_layers=8, sliding_window=16, global_attention_every=4).layer_windows == (16, 16, 16, None) * 2
    assert _config(sliding_window=16).layer_windows == (16, 16)
    with pytest.raises(ValueError, match="attention_impl must be one of"):
        _config(attention_impl="flash")
    with pytest.raises(ValueError, match="global_attention_every needs a sliding_window"):
        _config(global_attention_every=4)
    with pytest.raises(ValueError, match="sliding_window"):
        _config(sliding_window=0)
