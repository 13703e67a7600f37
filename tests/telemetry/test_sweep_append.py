"""A sweep point's training steps and its validation loss land in the telemetry store."""

from types import SimpleNamespace

import pytest

from marin_assets.scaling.sweep import partition_key, run_sweep_point
from marin_assets.telemetry import TelemetryStore
from tests.support.byte_tokens import VOCAB_SIZE
from tests.support.caches import stdlib_module_docs, stdlib_paragraphs, write_cache

CONFIG = SimpleNamespace(
    vocab_size=VOCAB_SIZE,
    seq_len=32,
    head_dim=8,
    aspect_ratio=128.0,
    batch_sizes=[4],
    min_steps=10,
    tolerance=0.04,
    lr_base=1e-2,
    lr_ref_width=1024,
    decay_fraction=0.2,
    skip_sigma=0.0,
    seed=0,
    validation_windows=4,
)


@pytest.mark.slow
def test_sweep_point_appends_steps_and_validation_loss(tmp_path, monkeypatch):
    monkeypatch.setenv("MARIN_PREFIX", str(tmp_path / "prefix"))
    train_cache, val_cache = tmp_path / "license", tmp_path / "docs"
    write_cache(train_cache, stdlib_paragraphs())
    write_cache(val_cache, stdlib_module_docs())
    counts = run_sweep_point(
        3e7, 8, CONFIG, {"license": str(train_cache)}, {"docs": str(val_cache)}, str(tmp_path / "out"), log=lambda _: None
    )
    run = f"sweep-{partition_key(3e7, 8)}"
    store = TelemetryStore(str(tmp_path / "prefix" / "telemetry"))
    assert store.runs() == [run]
    loss = store.query(run=run, metric="loss", latest=True)
    assert loss["step"].to_list() == list(range(1, counts["steps"] + 1))
    assert loss["value"][-1] == pytest.approx(counts["train_loss"])
    val = store.query(run=run, metric=["validation_loss", "validation_loss.docs", "flops"])
    got = {m: (s, v) for m, s, v in val.select("metric", "step", "value").iter_rows()}
    assert got == {
        "validation_loss": (counts["steps"], pytest.approx(counts["validation_loss"])),
        "validation_loss.docs": (counts["steps"], pytest.approx(counts["validation_loss"])),
        "flops": (counts["steps"], pytest.approx(counts["flops"])),
    }


def test_a_source_name_that_cannot_be_a_metric_fails_before_training(tmp_path):
    with pytest.raises(ValueError, match="validation source.*'validation_loss.a b'"):
        run_sweep_point(3e7, 8, CONFIG, {"x": str(tmp_path)}, {"a b": str(tmp_path)}, str(tmp_path / "out"), log=lambda _: None)
