import math

import numpy as np
import pytest

from marin_assets.datakit.normalize import NormalizeConfig, normalize
from marin_assets.datakit.quality import (
    QualityModelConfig,
    QualityScoreConfig,
    compression_ratio,
    load_quality_model,
    score_quality,
    train_quality_model,
)
from marin_assets.datakit.shards import list_shards, read_table

SMALL = QualityModelConfig(num_features=1 << 12, holdout_fraction=0.25, max_iter=100)


def _spammy(i: int) -> str:
    return f"CLICK HERE!!! FREE $$$ offer {i} unsubscribe http://spam{i}.biz buy now!!! limited time act now"


def _prosy(i: int, prose) -> str:
    return "The committee considered the report with care, and " + prose(i, 40)


def _shards(tmp_path, name, texts, write_jsonl):
    write_jsonl(tmp_path / f"{name}.jsonl", [{"text": t} for t in texts])
    normalize(str(tmp_path / f"{name}.jsonl"), str(tmp_path / "n" / name), NormalizeConfig(source=name))
    return list_shards(str(tmp_path / "n" / name))


@pytest.fixture
def trained(tmp_path, prose, write_jsonl):
    high = _shards(tmp_path, "high", [_prosy(i, prose) for i in range(60)], write_jsonl)
    low = _shards(tmp_path, "low", [_spammy(i) for i in range(60)], write_jsonl)
    counts = train_quality_model(high, low, str(tmp_path / "model"), SMALL)
    return counts, str(tmp_path / "model")


def test_classifier_separates_held_out_documents(trained):
    counts, _ = trained
    assert counts["high_docs"] == 60 and counts["low_docs"] == 60
    assert counts["holdout_docs"] > 10
    assert counts["holdout_accuracy"] >= 0.95


def test_model_roundtrip_and_scores(trained, prose):
    _, model_dir = trained
    model = load_quality_model(model_dir)
    texts = [_prosy(1000, prose), _spammy(1000)]
    p = model.predict(texts)
    assert p[0] > 0.5 > p[1]
    again = load_quality_model(model_dir).predict(texts)
    np.testing.assert_array_equal(p, again)


def test_score_attributes_and_threshold(tmp_path, trained, prose, write_jsonl):
    _, model_dir = trained
    mixed = _shards(
        tmp_path, "mixed", [_prosy(500 + i, prose) for i in range(5)] + [_spammy(500 + i) for i in range(5)], write_jsonl
    )
    keep_all = score_quality(mixed, model_dir, str(tmp_path / "q0"), QualityScoreConfig(threshold=0.0))
    texts = [t for shard in mixed for t in read_table(shard).column("text").to_pylist()]
    expected_mean = float(np.mean(load_quality_model(model_dir).predict(texts)))
    assert 0.2 < expected_mean < 0.8  # half prose, half spam: a mean near either end would mean one class only
    assert keep_all == {"docs": 10, "low_quality": 0, "mean_quality": pytest.approx(expected_mean, rel=1e-5)}
    counts = score_quality(mixed, model_dir, str(tmp_path / "q"), QualityScoreConfig(threshold=0.5))
    assert counts["low_quality"] == 5
    docs = read_table(mixed[0]).to_pylist()
    attrs = read_table(str(tmp_path / "q" / mixed[0].rsplit("/", 1)[1])).to_pylist()
    for d, a in zip(docs, attrs):
        assert a["id"] == d["id"]
        assert a["low_quality"] == d["text"].startswith("CLICK")
        assert a["compression_ratio"] == pytest.approx(compression_ratio(d["text"]), rel=1e-6)


def test_no_model_means_compression_ratio_only(tmp_path, write_jsonl):
    shards = _shards(tmp_path, "x", ["abc " * 100, "unique words here"], write_jsonl)
    counts = score_quality(shards, None, str(tmp_path / "q"), QualityScoreConfig())
    assert counts["low_quality"] == 0
    attrs = read_table(str(tmp_path / "q" / shards[0].rsplit("/", 1)[1])).to_pylist()
    assert all(math.isnan(a["quality"]) for a in attrs)
    with pytest.raises(ValueError, match="needs a trained quality model"):
        score_quality(shards, None, str(tmp_path / "q2"), QualityScoreConfig(threshold=0.3))


def test_compression_ratio_is_high_for_repetition(prose):
    assert compression_ratio("buy now " * 200) > 10 * compression_ratio(prose(1, 200)) / 3
    assert compression_ratio("") == 0.0


def test_configs_validate():
    with pytest.raises(ValueError, match="threshold"):
        QualityScoreConfig(threshold=1.5)
    with pytest.raises(ValueError, match="num_features"):
        QualityModelConfig(num_features=2)
