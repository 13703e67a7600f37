"""fastText quality models: a user's .bin scores through score_quality, training keeps the more
accurate of ours and fastText (and says so), old model dirs still load, and the CLI takes a .bin."""

import json

import dagster as dg
import numpy as np
import pytest

from marin_assets.datakit.normalize import NormalizeConfig, normalize
from marin_assets.datakit.quality import (
    OURS,
    QualityModel,
    QualityModelConfig,
    QualityScoreConfig,
    _labelled,
    check_given_model,
    load_quality_model,
    score_quality,
    train_quality_model,
)
from marin_assets.datakit.quality_fasttext import FastTextConfig, FastTextQualityModel, import_fasttext_model, train_fasttext_file
from marin_assets.datakit.shards import list_shards, read_table
from tests.support.text_corpus import prose

SMALL = QualityModelConfig(num_features=1 << 12, holdout_fraction=0.25, max_iter=100)
TINY_FASTTEXT = FastTextConfig(bucket=1 << 12)
CRIPPLED_FASTTEXT = FastTextConfig(bucket=1 << 12, epoch=1, lr=1e-6)  # learns nothing: ours must win


def _spammy(i: int) -> str:
    return f"CLICK HERE!!! FREE $$$ offer {i} unsubscribe http://spam{i}.biz buy now!!! limited time act now"


def _prosy(i: int) -> str:
    return "The committee considered the report with care,\nand " + prose(i, 40)  # a newline: fastText refuses raw ones


def _shards(tmp, name, texts):
    (tmp / f"{name}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    normalize(str(tmp / f"{name}.jsonl"), str(tmp / "n" / name), NormalizeConfig(source=name))
    return list_shards(str(tmp / "n" / name))


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("labelled")
    return _shards(tmp, "high", [_prosy(i) for i in range(60)]), _shards(tmp, "low", [_spammy(i) for i in range(60)])


@pytest.fixture(scope="module")
def users_bin(tmp_path_factory):
    """A fastText classifier as a user brings it: their labels, not ours."""
    tmp = tmp_path_factory.mktemp("users_bin")
    lines = [f"__label__keep {_prosy(i).replace(chr(10), ' ')}" for i in range(40)]
    lines += [f"__label__drop {_spammy(i)}" for i in range(40)]
    (tmp / "train.txt").write_text("\n".join(lines[i] for i in np.random.RandomState(0).permutation(len(lines))) + "\n")
    train_fasttext_file(str(tmp / "train.txt"), str(tmp / "users.bin"), TINY_FASTTEXT)
    return str(tmp / "users.bin")


def test_a_users_fasttext_bin_scores_through_score_quality(tmp_path, users_bin):
    assert import_fasttext_model(users_bin, "__label__keep", str(tmp_path / "keep"))["labels"] == 2
    model = load_quality_model(str(tmp_path / "keep"))
    assert isinstance(model, FastTextQualityModel)
    mixed = _shards(tmp_path, "mixed", [_prosy(500 + i) for i in range(5)] + [_spammy(500 + i) for i in range(5)])
    counts = score_quality(mixed, str(tmp_path / "keep"), str(tmp_path / "q"), QualityScoreConfig(threshold=0.5))
    texts = read_table(mixed[0]).column("text").to_pylist()
    attrs = read_table(str(tmp_path / "q" / mixed[0].rsplit("/", 1)[1])).to_pylist()
    np.testing.assert_array_equal([a["quality"] for a in attrs], model.predict(texts))
    assert [a["low_quality"] for a in attrs] == [t.startswith("CLICK") for t in texts]
    assert counts["low_quality"] == 5
    # The label picks the probability: P(drop) is the rest of P(keep) (fastText adds 1e-5 to each).
    import_fasttext_model(users_bin, "__label__drop", str(tmp_path / "drop"))
    np.testing.assert_allclose(load_quality_model(str(tmp_path / "drop")).predict(texts) + model.predict(texts), 1.0, atol=1e-4)


def test_a_label_the_model_lacks_is_a_clear_error(tmp_path, users_bin):
    with pytest.raises(ValueError, match=r"users\.bin has no label '__label__hq'; its labels: __label__(keep|drop), __label__"):
        import_fasttext_model(users_bin, "__label__hq", str(tmp_path / "m"))
    with pytest.raises(ValueError, match="one token without whitespace"):
        import_fasttext_model(users_bin, "__label__a b", str(tmp_path / "m"))


def test_a_file_that_is_not_a_fasttext_model_is_refused(tmp_path):
    (tmp_path / "junk.bin").write_bytes(b"\x00" * 64)
    for check in (
        lambda: check_given_model(str(tmp_path / "junk.bin"), None),
        lambda: import_fasttext_model(str(tmp_path / "junk.bin"), "__label__hq", str(tmp_path / "m")),
    ):
        with pytest.raises(ValueError, match=r"junk\.bin is not a fastText model file"):
            check()
    with pytest.raises(FileNotFoundError, match="neither a fastText model file nor a dir with quality_model.json"):
        check_given_model(str(tmp_path / "missing"), None)


@pytest.mark.parametrize("fasttext,kept", [(TINY_FASTTEXT, "fasttext"), (CRIPPLED_FASTTEXT, OURS)], ids=["tie", "ours_better"])
def test_training_keeps_the_more_accurate_and_reports_both(tmp_path, labelled, fasttext, kept):
    high, low = labelled
    counts = train_quality_model(high, low, str(tmp_path / "m"), SMALL, fasttext)
    ours, theirs = counts["ours_holdout_accuracy"], counts["fasttext_holdout_accuracy"]
    assert counts["kind"] == kept == (OURS if ours > theirs else "fasttext")
    prefix = "ours" if kept == OURS else "fasttext"
    for key in ("train_accuracy", "holdout_accuracy", "holdout_auc"):
        assert counts[key] == counts[f"{prefix}_{key}"]
    assert counts["holdout_docs"] > 10 and counts["holdout_accuracy"] >= 0.95 and counts["holdout_auc"] >= 0.95
    assert json.loads((tmp_path / "m" / "quality_model.json").read_text())["kind"] == kept
    # The saved model is the one measured: it reproduces the reported held-out accuracy.
    texts, y, hold = _labelled(high, low, SMALL.holdout_fraction)
    p = load_quality_model(str(tmp_path / "m")).predict([t for t, h in zip(texts, hold, strict=True) if h])
    assert float(((p >= 0.5) == (y[hold] == 1)).mean()) == counts["holdout_accuracy"]


def test_training_is_deterministic(tmp_path, labelled):
    high, low = labelled
    first = train_quality_model(high, low, str(tmp_path / "a"), SMALL, TINY_FASTTEXT)
    second = train_quality_model(high, low, str(tmp_path / "b"), SMALL, TINY_FASTTEXT)
    assert first == second and first["kind"] == "fasttext"
    assert (tmp_path / "a" / "model.bin").read_bytes() == (tmp_path / "b" / "model.bin").read_bytes()
    texts = [_prosy(900), _spammy(900)]
    np.testing.assert_array_equal(
        load_quality_model(str(tmp_path / "a")).predict(texts), load_quality_model(str(tmp_path / "b")).predict(texts)
    )


def test_a_dir_without_a_kind_still_loads_as_ours(tmp_path):
    model = QualityModel(np.linspace(-1, 1, 1 << 12).astype(np.float32), 0.25, SMALL)
    model.save(str(tmp_path / "m"))
    meta = json.loads((tmp_path / "m" / "quality_model.json").read_text())
    assert meta.pop("kind") == OURS
    (tmp_path / "m" / "quality_model.json").write_text(json.dumps(meta))  # as written before kinds existed
    loaded = load_quality_model(str(tmp_path / "m"))
    texts = [_prosy(1), _spammy(1)]
    assert isinstance(loaded, QualityModel)
    np.testing.assert_array_equal(loaded.predict(texts), model.predict(texts))


def test_the_given_quality_model_asset_imports_a_bin(tmp_path, users_bin):
    from assets.datakit.inputs import given_quality_model
    from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource

    asset = given_quality_model(users_bin, "__label__keep")
    store = ArtifactStoreResource(prefix=str(tmp_path / "prefix"))
    result = dg.materialize(
        [asset],
        resources={"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)},
        instance=dg.DagsterInstance.ephemeral(),
    )
    assert result.success
    model_dir = store.store.read_pointer("quality_model", None).data_path
    with open(f"{model_dir}/quality_model.json") as f:
        assert json.load(f)["label"] == "__label__keep"
    assert load_quality_model(model_dir).predict([_prosy(7)])[0] > 0.5
    # Versioned by the file's bytes and the label: another label is another model.
    versions = {
        given_quality_model(users_bin, label).code_versions_by_key[dg.AssetKey("quality_model")]
        for label in ("__label__keep", "__label__drop")
    }
    assert len(versions) == 2


def test_the_cli_takes_a_bin_and_a_label(tmp_path, capsys, users_bin):
    from marin_assets.cli import main
    from marin_assets.datakit.run_spec import RunSpec, check_run_inputs

    with pytest.raises(SystemExit):
        main(["datakit", "run", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "--quality-model PATH" in shown and "fastText classifier .bin" in shown and "--quality-label LABEL" in shown
    (tmp_path / "in.jsonl").write_text(json.dumps({"text": "a real document"}) + "\n")
    spec = dict(inputs=(str(tmp_path / "in.jsonl"),), evals=(), prefix=str(tmp_path / "P"))
    check_run_inputs(RunSpec(**spec, quality_model=users_bin, quality_label="__label__keep"))
    with pytest.raises(ValueError, match="quality_label: a fastText label is one token"):
        RunSpec(**spec, quality_model=users_bin, quality_label="two words")
    model_dir = tmp_path / "dir"
    model_dir.mkdir()
    (model_dir / "quality_model.json").write_text("{}")
    with pytest.raises(ValueError, match="goes with a fastText model file"):
        check_run_inputs(RunSpec(**spec, quality_model=str(model_dir), quality_label="__label__keep"))
    code = main(["datakit", "run", "--input", spec["inputs"][0], "--prefix", spec["prefix"], "--quality-label", "__label__x"])
    assert code == 1 and "needs a fastText --quality-model" in capsys.readouterr().err
