"""Document masking from the caches to the train step: the loader's segment ids start after each EOS and
at each shuffle-block join, a source without a recorded EOS id is refused by name, and the step trains
with the segment ids it was handed."""

import json
import shutil

import jax
import numpy as np
import pytest

from marin_assets.train.config import replace
from marin_assets.train.data.batches import DataPosition, MaskedRows, MixedLoader, segment_ids
from marin_assets.train.data.token_caches import open_source
from marin_assets.train.loop import default_model, train
from marin_assets.train.metrics import read_metrics
from marin_assets.train.optimizers import make_optimizer
from marin_assets.train.state import init_state

EOS = 32  # a stand-in EOS id: the byte caches' space, frequent enough to end several "documents" a row


def test_segment_ids_follow_eos_and_block_joins():
    tokens = np.array([[5, 32, 7, 7, 32, 32, 3, 4], [1, 2, 3, 4, 5, 6, 7, 8]])
    # row 0 starts at offset 0 (no join inside a block of 8), row 1 at 6: a join at column 2
    assert segment_ids(tokens, np.array([0, 6]), 8, EOS).tolist() == [[0, 0, 1, 1, 1, 2, 3, 3], [0, 0, 1, 1, 1, 1, 1, 1]]


@pytest.mark.parametrize("block", [None, 16])
def test_loader_segments_each_row_at_its_documents(caches, block):
    loader = MixedLoader(
        {"license": caches["license"], "docs": caches["docs"]},
        seq_len=32,
        batch_size=8,
        seed=3,
        block_tokens=block,
        eos_ids={"license": EOS, "docs": EOS},
    )
    batch, ok, _ = loader.next_batch(DataPosition())
    assert ok and isinstance(batch, MaskedRows) and batch.loss_mask.min() == 1
    new = np.diff(batch.segment_ids, axis=1) == 1
    assert np.all(np.diff(batch.segment_ids, axis=1) >= 0) and batch.segment_ids[:, 0].max() == 0
    joins = np.zeros_like(new)
    if block:
        joins[:, block - 1] = True  # rows start at block boundaries here: one join per row, at column 16
    assert np.array_equal(new, (batch.tokens[:, :-1] == EOS) | joins)
    assert new.sum() > 8  # documents do end inside these rows
    with pytest.raises(ValueError, match=r"missing for \['docs'\]"):
        MixedLoader({"license": caches["license"], "docs": caches["docs"]}, 32, 8, eos_ids={"license": EOS})


@pytest.fixture(scope="module")
def datakit_like(caches, tmp_path_factory):
    """A DataKit cache folder (train/ + stats.json recording the tokenizer's EOS id)."""
    root = tmp_path_factory.mktemp("eos")
    shutil.copytree(caches["license"], root / "train")
    (root / "stats.json").write_text(json.dumps({"tokenizer": {"eos_id": EOS, "sha256": "bytes"}}))
    return root


def test_train_step_gets_the_segment_ids(datakit_like, caches, tiny_config, tmp_path):
    config = replace(tiny_config, num_steps=1, document_masking=True, mixture={"train": 1.0})
    assert open_source(datakit_like).eos_id == EOS
    result = train(config, {"train": datakit_like}, tmp_path / "run")
    logged = read_metrics(result.metrics_path)[0]["loss"]
    model = default_model()
    params_shape = jax.eval_shape(lambda: model.init_params(config.model, jax.random.PRNGKey(0)))
    state = init_state(config, make_optimizer(config.optimizer, params_shape), model)
    batch, _, _ = MixedLoader(
        {"train": open_source(datakit_like)}, config.seq_len, config.batch_size, seed=config.data_seed, eos_ids={"train": EOS}
    ).next_batch(DataPosition())
    masked, _ = model.loss_fn(
        state.params, batch.tokens, config.model, state.router_bias, batch.loss_mask, segment_ids=batch.segment_ids
    )
    crossing, _ = model.loss_fn(state.params, batch.tokens, config.model, state.router_bias)
    # The jitted step (its expert-parallel layer) and this eager call differ in float rounding (~1e-5).
    assert logged == pytest.approx(float(masked), rel=1e-4)
    assert abs(float(masked) - float(crossing)) > 1e-4 * abs(float(masked))
    with pytest.raises(ValueError, match=r"no EOS id recorded for source\(s\) 'train'"):
        train(config, {"train": caches["license"]}, tmp_path / "refused")


def test_the_held_out_loss_masks_the_documents_as_the_run_trains(caches, tiny_config, tmp_path):
    """A document-masked run's held-out loss is the cross-entropy with each validation window's documents masked:
    what ``validation_loss`` gives with the source's EOS id, not what it gives without."""
    from marin_assets.train.checkpoints.necromancy import open_checkpoint
    from marin_assets.train.data.heldout import validation_loss

    root = tmp_path / "eos"
    shutil.copytree(caches["license"], root / "train")
    shutil.copytree(caches["docs"], root / "validation")
    (root / "stats.json").write_text(json.dumps({"tokenizer": {"eos_id": EOS, "sha256": "bytes"}}))
    config = replace(tiny_config, num_steps=2, checkpoint_every_steps=2, document_masking=True, mixture={"train": 1.0})
    result = train(config, {"train": root}, tmp_path / "run")
    model = default_model()
    _, _, _, _, state = open_checkpoint(result.checkpoint_dir, model)
    held = {"train": root / "validation"}
    masked = validation_loss(config, model, state, held, eos_ids={"train": EOS})
    crossing = validation_loss(config, model, state, held)
    assert result.validation_loss == pytest.approx(masked, rel=1e-5)
    assert abs(masked - crossing) > 1e-4 * masked
