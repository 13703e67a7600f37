import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marin_assets.train import checkpoint as ckpt
from marin_assets.train.config import replace
from marin_assets.train.data import DataPosition, MixedLoader
from marin_assets.train.loop import default_model, train
from marin_assets.train.metrics import read_metrics


def losses(path):
    return [(r["step"], r["loss"], r["lr"], r["grad_norm"], r["skipped"]) for r in read_metrics(path)]


def test_killed_and_resumed_run_is_bit_exact(caches, tiny_config, tmp_path):
    straight = train(tiny_config, caches, tmp_path / "straight")
    assert straight.final_step == 12 and straight.loss_curve_png.exists()
    # abandon the loop at step 10 (checkpoints at 4 and 8 committed, steps 9-10 logged or not)
    train(tiny_config, caches, tmp_path / "killed", stop_at_step=10)
    assert ckpt.latest_valid(tmp_path / "killed" / "checkpoints").name == "step-000000008"
    resumed = train(tiny_config, caches, tmp_path / "killed", resume=True)
    assert resumed.final_step == 12
    assert losses(resumed.metrics_path) == losses(straight.metrics_path)  # exact ==, every step
    a, _ = ckpt.load(straight.checkpoint_dir)
    b, _ = ckpt.load(resumed.checkpoint_dir)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert resumed.data_position == straight.data_position
    first = losses(straight.metrics_path)
    assert first[-1][1] < first[0][1]  # it learns


def test_nan_loss_steps_are_skipped_counted_and_training_continues(caches, tiny_config, tmp_path):
    moe = default_model()

    def poisoned(params, tokens, config, bias):
        loss, aux = moe.loss_fn(params, tokens, config, bias)
        return jnp.where(jnp.sum(tokens) % 4 == 0, jnp.nan, loss), aux

    result = train(tiny_config, caches, tmp_path / "nan", model=dataclasses.replace(moe, loss_fn=poisoned))
    # which batches are poisoned, replayed from the loader
    loader = MixedLoader(caches, tiny_config.seq_len, tiny_config.batch_size)
    pos, expected = DataPosition(), []
    for step in range(1, 13):
        tokens, _, pos = loader.next_batch(pos)
        if int(tokens.astype(np.int64).sum()) % 4 == 0:
            expected.append(step)
    assert expected, "fixture data should poison at least one batch"
    rows = read_metrics(result.metrics_path)
    assert [r["step"] for r in rows if r["skipped"]] == expected
    assert result.counts["skipped_nonfinite"] == len(expected)
    assert all(np.isfinite(r["loss"]) for r in rows if not r["skipped"])
    assert result.final_step == 12


def test_warm_start_keeps_data_position_and_restarts_schedule(caches, tiny_config, tmp_path):
    first = train(replace(tiny_config, num_steps=6, phase="kestrel"), caches, tmp_path / "kestrel")
    cooldown = replace(tiny_config, num_steps=4, phase="jellyfish", mixture={"docs": 1.0},
                       optimizer={"weight_decay": 0.0},
                       schedule={"kind": "linear_decay", "warmup_steps": 0, "decay_steps": 0, "total_steps": 4,
                                 "start_fraction": 0.5})
    second = train(cooldown, caches, tmp_path / "jellyfish", warm_start=tmp_path / "kestrel")
    rows = read_metrics(second.metrics_path)
    assert [r["step"] for r in rows] == [7, 8, 9, 10]
    assert rows[0]["lr"] == pytest.approx(0.5 * 3e-3) and rows[-1]["lr"] == pytest.approx(0.05 * 3e-3)
    assert rows[0]["phase"] == "jellyfish" and second.phase_start_step == 6
    assert second.data_position["batches"] == 10
    assert second.data_position["consumed"]["license"] == first.data_position["consumed"]["license"]
    assert second.data_position["consumed"]["docs"] == first.data_position["consumed"]["docs"] + 16
    assert second.tokens == 10 * 4 * 32


def test_config_that_cannot_fit_fails_before_compute(caches, tiny_config, tmp_path, monkeypatch):
    monkeypatch.setattr(jax, "device_count", lambda: 3)
    with pytest.raises(ValueError, match="not divisible by the 3"):
        train(tiny_config, caches, tmp_path / "a")
    monkeypatch.undo()
    big = replace(tiny_config, seq_len=32, model={"max_seq_len": 1 << 20})
    big = replace(big, seq_len=1 << 19)
    with pytest.raises(ValueError, match="fewer than one sequence"):
        train(big, caches, tmp_path / "b")
    with pytest.raises(ValueError, match="exceeds model.max_seq_len"):
        replace(tiny_config, seq_len=64)
    assert not (tmp_path / "a" / "checkpoints").exists()
