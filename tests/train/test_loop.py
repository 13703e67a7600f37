import dataclasses
import json
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marin_assets.train.checkpoints import checkpoint as ckpt
from marin_assets.train.config import replace
from marin_assets.train.data.batches import DataPosition, MixedLoader
from marin_assets.train.loop import default_model, train
from marin_assets.train.metrics import read_metrics
from tests.support.byte_tokens import VOCAB_SIZE
from tests.support.caches import stdlib_paragraphs, write_cache


def losses(path):
    return [(r["step"], r["loss"], r["lr"], r["grad_norm"], r["skipped"]) for r in read_metrics(path)]


@pytest.mark.slow
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

    def poisoned(params, tokens, config, bias, loss_mask=None, ep=None):
        loss, aux = moe.loss_fn(params, tokens, config, bias, loss_mask, ep)
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
    # An MoE run draws its drop rate and expert load too, the skipped steps' NaNs as gaps.
    assert (tmp_path / "nan" / "moe_telemetry.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_warm_start_keeps_data_position_and_restarts_schedule(caches, tiny_config, tmp_path):
    first = train(replace(tiny_config, num_steps=6, phase="kestrel"), caches, tmp_path / "kestrel")
    cooldown = replace(
        tiny_config,
        num_steps=4,
        phase="jellyfish",
        mixture={"docs": 1.0},
        optimizer={"weight_decay": 0.0},
        schedule={"kind": "linear_decay", "warmup_steps": 0, "decay_steps": 0, "total_steps": 4, "start_fraction": 0.5},
    )
    second = train(cooldown, caches, tmp_path / "jellyfish", warm_start=tmp_path / "kestrel")
    rows = read_metrics(second.metrics_path)
    assert [r["step"] for r in rows] == [7, 8, 9, 10]
    assert rows[0]["lr"] == pytest.approx(0.5 * 3e-3) and rows[-1]["lr"] == pytest.approx(0.05 * 3e-3)
    assert rows[0]["phase"] == "jellyfish" and second.phase_start_step == 6
    assert second.data_position["batches"] == 10
    assert second.data_position["consumed"]["license"] == first.data_position["consumed"]["license"]
    assert second.data_position["consumed"]["docs"] == first.data_position["consumed"]["docs"] + 16
    assert second.tokens == 10 * 4 * 32


def test_config_that_cannot_fit_fails_before_compute(caches, tiny_config, tmp_path):
    three = types.SimpleNamespace(shape={"data": 3, "sequence": 1, "expert": 1})  # check_fits reads only the shape
    with pytest.raises(ValueError, match=r"batch_size 4 is not divisible by the 3 batch shards"):
        train(tiny_config, caches, tmp_path / "a", mesh=three)
    assert not (tmp_path / "a").exists()
    big = replace(tiny_config, seq_len=32, model={"max_seq_len": 1 << 20})
    big = replace(big, seq_len=1 << 19)
    with pytest.raises(ValueError, match="fewer than one sequence"):
        train(big, caches, tmp_path / "b")
    with pytest.raises(ValueError, match="exceeds model.max_seq_len"):
        replace(tiny_config, seq_len=64)
    assert not (tmp_path / "a" / "checkpoints").exists()


def datakit_folder(root, vocab_size):
    """The shape `marin datakit run` writes under <prefix>/cache: train/, validation/, stats.json."""
    write_cache(root / "train", stdlib_paragraphs())
    # 120 bytes + EOS: three windows of 32, fewer than one batch of 4 -> one short batch
    write_cache(
        root / "validation",
        [
            "JSON (JavaScript Object Notation) is a lightweight data interchange "
            "format inspired by JavaScript object literal syntax."
        ],
    )
    (root / "stats.json").write_text(json.dumps({"vocab_size": vocab_size}))
    return root


def test_datakit_folder_trains_on_train_split_and_reports_held_out_loss(tiny_config, tmp_path):
    from marin_assets.train.data.token_caches import TokenCache

    folder = datakit_folder(tmp_path / "cache", vocab_size=VOCAB_SIZE)
    config = replace(tiny_config, num_steps=4)
    result = train(config, folder, tmp_path / "run")
    assert result.final_step == 4 and result.data_position["consumed"] == {"train": 16}
    # known answer: the loss of the final params on the validation split's first windows
    val = TokenCache(folder / "validation")
    assert val.num_tokens // 32 == 3
    tokens = val.read([0, 32, 64], 32).astype(np.int32)
    arrays, _ = ckpt.load(result.checkpoint_dir)
    moe = default_model()
    params = ckpt.restore_like(jax.eval_shape(lambda: moe.init_params(config.model, jax.random.PRNGKey(0))), arrays, "['params']")
    bias = ckpt.restore_like(moe.init_router_bias(config.model), arrays, "['router_bias']")
    expected = float(moe.loss_fn(params, jnp.asarray(tokens), config.model, bias)[1]["ce_loss"])
    assert result.validation_loss == pytest.approx(expected, rel=1e-5)
    assert json.loads((tmp_path / "run" / "train_result.json").read_text())["validation_loss"] == result.validation_loss
    # resuming the finished phase runs no step and still reports its held-out loss (an end hook)
    again = train(config, folder, tmp_path / "run")
    assert again.final_step == 4 and again.validation_loss == result.validation_loss
    assert [r["step"] for r in read_metrics(again.metrics_path)] == [1, 2, 3, 4]


def test_model_smaller_than_the_tokenizer_stops_before_step_one(tiny_config, tmp_path):
    folder = datakit_folder(tmp_path / "cache", vocab_size=4096)
    with pytest.raises(ValueError, match=rf"model.vocab_size is {VOCAB_SIZE} .* vocabulary of 4096"):
        train(tiny_config, folder, tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoints").exists()
    (folder / "stats.json").write_text(json.dumps({"vocab_size": VOCAB_SIZE}))  # equal is fine: the line is >
    from marin_assets.train.loop import check_vocab, open_sources

    check_vocab(tiny_config, open_sources(folder))


def test_a_phase_that_skips_most_steps_raises_with_counts(caches, tiny_config, tmp_path):
    from marin_assets.train.loop import TooManySkippedSteps

    moe = default_model()
    nan_loss = dataclasses.replace(moe, loss_fn=lambda p, t, c, b, *rest: (jnp.nan, moe.loss_fn(p, t, c, b, *rest)[1]))
    config = replace(tiny_config, num_steps=4)
    with pytest.raises(TooManySkippedSteps, match=r"skipped 4 of 4 steps .*'skipped_nonfinite': 4") as err:
        train(config, caches, tmp_path / "strict", model=nan_loss)
    assert err.value.result.final_step == 4 and err.value.result.checkpoint_dir is not None
    # the other side of the line: allowed to skip every step, it returns
    lenient = replace(config, guards={"max_skipped_fraction": 1.0})
    assert train(lenient, caches, tmp_path / "lenient", model=nan_loss).counts["skipped_nonfinite"] == 4


@pytest.mark.slow  # a run abandoned and resumed: two trainings
def test_a_work_dir_on_an_fsspec_filesystem_resumes_bit_exact(caches, tiny_config, tmp_path):
    """The whole work dir on fsspec's memory filesystem (as a pod writes gs://): checkpoints,
    metrics.jsonl, the loss curve and train_result.json; kill, resume, same run as on disk."""
    import fsspec

    from marin_assets.store.fsutil import filesystem, read_json

    out = "memory://loop-test/run"
    straight = train(tiny_config, caches, tmp_path / "straight")
    train(tiny_config, caches, out, stop_at_step=6)
    assert ckpt.latest_valid(f"{out}/checkpoints") == f"{out}/checkpoints/step-000000004"
    # what the killed attempt left: the rows it got to (5; 6 was still pending), as on disk
    assert [r["step"] for r in read_metrics(f"{out}/metrics.jsonl")] == [1, 2, 3, 4, 5]
    resumed = train(tiny_config, caches, out, resume=True)
    assert resumed.checkpoint_dir == f"{out}/checkpoints/step-000000012"
    assert resumed.metrics_path == f"{out}/metrics.jsonl"
    assert losses(resumed.metrics_path) == losses(straight.metrics_path)  # steps 5-6 dropped, redone
    a, _ = ckpt.load(straight.checkpoint_dir)
    b, _ = ckpt.load(resumed.checkpoint_dir)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    fs, _ = filesystem(out)
    assert resumed.loss_curve_png == f"{out}/loss_curve.png"
    assert fs.cat("/loop-test/run/loss_curve.png")[:8] == b"\x89PNG\r\n\x1a\n"
    summary = read_json(fs, "/loop-test/run/train_result.json")
    assert summary["final_step"] == 12 and summary["data_position"] == straight.data_position
    assert summary["telemetry_run"] == resumed.telemetry_run and resumed.telemetry_run.startswith("run-main-")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["straight"] and not Path("memory:").exists()  # not on disk
    fsspec.filesystem("memory").rm("/loop-test", recursive=True)
