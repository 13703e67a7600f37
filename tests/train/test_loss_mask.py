"""A chat source's loss mask from the cache to the loss: the loader reads it beside the ids, the train step
and the held-out loss count the masked targets only."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marin_assets.datakit.chat import ChatConfig, tokenize_chat
from marin_assets.train.config import replace
from marin_assets.train.data.batches import DataPosition, MaskedRows, MixedLoader
from marin_assets.train.data.heldout import validation_loss
from marin_assets.train.data.token_caches import TokenStream, open_source
from marin_assets.train.loop import default_model, train
from marin_assets.train.metrics import read_metrics
from marin_assets.train.optimizers import make_optimizer
from marin_assets.train.state import init_state
from tests.support.plays import FOLIO_PLAY, MODERN_PLAY


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("chat")
    plays = [(f"keeper{i}", MODERN_PLAY, False) for i in range(3)] + [("folio", FOLIO_PLAY, True)]
    tokenize_chat(plays, "bytes", str(out), ChatConfig(turns=2))
    return out


def _full(stream: TokenStream, field=None) -> np.ndarray:
    return stream.read([0], stream.num_tokens, field)[0]


def test_loader_reads_each_rows_mask_at_its_tokens(chat_dir, caches):
    chat = open_source(chat_dir)
    assert chat.train.masked and chat.validation.masked
    loader = MixedLoader({"chat": chat, "license": caches["license"]}, seq_len=32, batch_size=8, seed=3)
    assert loader.masked
    ids, mask = _full(chat.train), _full(chat.train, "loss_mask")
    position, chat_rows = DataPosition(), 0
    for _ in range(4):
        batch, ok, position = loader.next_batch(position)
        assert isinstance(batch, MaskedRows) and ok and batch.tokens.shape == batch.loss_mask.shape == (8, 32)
        for tokens, row_mask in zip(batch.tokens, batch.loss_mask, strict=True):
            starts = [s for s in range(0, len(ids) - 31, 32) if np.array_equal(ids[s : s + 32], tokens)]
            if starts:  # a chat row: its mask is the cache's at the same tokens
                chat_rows += 1
                assert np.array_equal(row_mask, mask[starts[0] : starts[0] + 32])
            else:  # a license row counts every target
                assert row_mask.min() == 1
    assert chat_rows > 0 and 0 < mask.mean() < 1
    # A loader with no masked source gives the plain token array, as before.
    plain, _, _ = MixedLoader({"license": caches["license"]}, 32, 8).next_batch(DataPosition())
    assert isinstance(plain, np.ndarray) and plain.shape == (8, 32)


def test_train_step_counts_only_the_reply_targets(chat_dir, tiny_config, tmp_path):
    """The first step's loss is the model's loss at the initial parameters on the loader's first batch with
    *its* mask: the model here adds the mask's sum to its loss, so the logged loss shows which mask it got."""
    moe = default_model()

    def mask_counting(params, tokens, config, bias, loss_mask=None, ep=None):
        loss, aux = moe.loss_fn(params, tokens, config, bias, loss_mask, ep)
        return loss + (-1.0 if loss_mask is None else jnp.sum(loss_mask)), aux  # a constant: the gradients are the model's

    config = replace(tiny_config, num_steps=1, mixture={"chat": 1.0})
    result = train(config, {"chat": chat_dir}, tmp_path / "sft", model=dataclasses.replace(moe, loss_fn=mask_counting))
    logged = read_metrics(result.metrics_path)[0]["loss"]
    params_shape = jax.eval_shape(lambda: moe.init_params(config.model, jax.random.PRNGKey(0)))
    state = init_state(config, make_optimizer(config.optimizer, params_shape), moe)
    batch, _, _ = MixedLoader(
        {"chat": open_source(chat_dir)}, config.seq_len, config.batch_size, seed=config.data_seed, mixture={"chat": 1.0}
    ).next_batch(DataPosition())
    masked, _ = moe.loss_fn(state.params, batch.tokens, config.model, state.router_bias, batch.loss_mask)
    mask_sum = int(batch.loss_mask.sum())
    assert 0 < mask_sum < batch.loss_mask.size
    # The jitted step (its expert-parallel layer) and this eager call differ in float rounding (1.8e-5 measured).
    assert logged - mask_sum == pytest.approx(float(masked), rel=1e-4)


def test_held_out_loss_of_a_chat_source_is_over_the_replies(chat_dir, tiny_config):
    model = default_model()
    params_shape = jax.eval_shape(lambda: model.init_params(tiny_config.model, jax.random.PRNGKey(0)))
    state = init_state(tiny_config, make_optimizer(tiny_config.optimizer, params_shape), model)
    held = open_source(chat_dir).validation
    bs = tiny_config.batch_size
    n = held.num_tokens // tiny_config.seq_len
    n = n if n < bs else min(n // bs, 8) * bs  # held_out_batches: whole batches, at most 8
    assert n >= bs
    tokens = held.read([i * tiny_config.seq_len for i in range(n)], tiny_config.seq_len)
    mask = held.read([i * tiny_config.seq_len for i in range(n)], tiny_config.seq_len, "loss_mask")
    _, aux = model.loss_fn(state.params, tokens, tiny_config.model, state.router_bias, mask)
    got = validation_loss(tiny_config, model, state, {"chat": held})
    assert got == pytest.approx(float(aux["ce_loss"]), rel=1e-4)
