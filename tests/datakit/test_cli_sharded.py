"""`marin datakit run` materialises the DataKit graph: the result the in-memory reference
decides (tests/assets/shard_corpus.expected_final, over the dedup oracle) on a multi-shard
corpus, shard partitions fanned out over --workers, and a rerun into the same prefix served
from the store.

One module fixture: a corpus whose duplicates, near duplicates and contamination cross shard
boundaries (two inputs, a few hundred bytes per shard), a small quality model, one eval set.
"""

from __future__ import annotations

import json
import random

import pytest

from marin_assets.cli import main
from marin_assets.datakit.normalize import NormalizeConfig, normalize
from marin_assets.datakit.quality import QualityModelConfig, train_quality_model
from marin_assets.datakit.shards import list_shards, read_table
from tests.support.text_corpus import prose

SHARD_BYTES = 1500


def spam(seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(
        rng.choice(["FREE", "$$$", "CLICK", "NOW", "winner", "cheap", "!!!", "http://x.biz", "offer"]) for _ in range(40)
    )


def _write(path, records) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return str(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sharded_cli")
    for name, texts in (("high", [prose(1000 + i) for i in range(40)]), ("low", [spam(1000 + i) for i in range(40)])):
        normalize(
            _write(tmp / f"{name}.jsonl", [{"text": t} for t in texts]), str(tmp / "qn" / name), NormalizeConfig(source=name)
        )
    train_quality_model(
        list_shards(str(tmp / "qn" / "high")),
        list_shards(str(tmp / "qn" / "low")),
        str(tmp / "qmodel"),
        QualityModelConfig(num_features=1 << 12, holdout_fraction=0.0),
    )
    eval_text = " ".join(f"evalword{i}" for i in range(30)) + " what is the capital of the answer."
    near = prose(5).split()
    near[3], near[40] = "zqa", "zqb"
    a = [{"text": prose(i)} for i in range(20)] + [{"text": spam(i)} for i in range(3)]
    a += [{"text": prose(900) + "\n" + eval_text}, {"text": ""}, "{broken"]
    a += [{"text": prose(2)}, {"text": " ".join(near)}]  # an exact and a near copy, shards after their originals
    b = [{"text": prose(100 + i)} for i in range(8)] + [{"text": prose(7)}]  # a copy across inputs
    inputs = [_write(tmp / "a.jsonl", a), _write(tmp / "b.jsonl", b)]
    evals = [_write(tmp / "eval.jsonl", [{"id": "e1", "text": eval_text}])]
    argv = [
        "datakit",
        "run",
        *(x for p in inputs for x in ("--input", p)),
        "--eval",
        evals[0],
        "--prefix",
        str(tmp / "P"),
        "--quality-threshold",
        "0.5",
        "--quality-model",
        str(tmp / "qmodel"),
        "--tokenizer",
        "bytes",
        "--validation-fraction",
        "0.2",
        "--shard-bytes",
        str(SHARD_BYTES),
        "--workers",
        "2",
    ]
    return {"tmp": tmp, "argv": argv}


@pytest.fixture(scope="module")
def sharded(runs):
    """The CLI run, with its progress lines (no --json), captured once for the module."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(runs["argv"])
    return {"code": code, "summary": json.loads(out.getvalue()), "err": err.getvalue()}


@pytest.mark.slow  # the module's runs: the sharded graph on worker processes, then a rerun
def test_the_run_keeps_what_the_in_memory_reference_keeps(runs, sharded):
    from marin_assets.datakit.datasets import read_dataset
    from marin_assets.store import ArtifactStore
    from tests.assets.shard_corpus import expected_final

    summary = sharded["summary"]
    assert sharded["code"] == 0
    # The corpus exercises every reason, so the counts are not zeros.
    assert summary["removed"] == {"contaminated": 1, "exact_duplicate": 2, "fuzzy_duplicate": 1, "language": 0, "low_quality": 3}
    assert summary["quarantined"] == 2 and summary["docs_in"] == 28 + 9
    assert summary["docs_in"] == summary["docs_out"] + sum(summary["removed"].values()) + summary["quarantined"]
    store = ArtifactStore(summary["store"])
    shards = sorted(json.loads((runs["tmp"] / "P" / "summary.json").read_text())["shards"])
    expected = expected_final(store, shards, str(runs["tmp"] / "qmodel"), store.read_pointer("eval_ngrams", None).data_path, 0.5)
    dataset = read_dataset(summary["cache"])
    kept = sorted(i for s in dataset.shards for i in read_table(s.documents, columns=["id"]).column("id").to_pylist())
    assert kept == sorted(d["id"] for d in expected) and len(kept) == summary["docs_out"]
    # Bytes tokens: each kept document is its UTF-8 bytes and an EOS, split train / validation.
    assert sum(summary["tokens"].values()) == sum(len(d["text"].encode()) + 1 for d in expected)
    assert summary["tokens"]["validation"] > 0


@pytest.mark.slow  # the module's runs: the sharded graph on worker processes, then a rerun
def test_the_run_covers_several_shards_on_the_requested_workers(runs, sharded):
    record = json.loads((runs["tmp"] / "P" / "summary.json").read_text())
    shards = record["shards"]
    assert len(shards) >= 4 and {k.split("-")[0] for k in shards} == {"a", "b"}
    assert sum(c["docs_in"] for c in shards.values()) == sharded["summary"]["docs_in"]
    assert "computing" in sharded["err"] and "on 2 local worker(s)" in sharded["err"]  # progress on stderr
    assert record["summary"]["store"] == str(runs["tmp"] / "P" / "store")


@pytest.mark.slow  # the module's runs: the sharded graph on worker processes, then a rerun
def test_a_rerun_into_the_same_prefix_is_served_from_the_store(runs, sharded, capsys):
    store = runs["tmp"] / "P" / "store"
    before = sorted(str(p.relative_to(store)) for p in store.rglob("STATUS.json"))
    code = main([*runs["argv"], "--json"])
    out, err = capsys.readouterr()
    assert code == 0 and json.loads(out) == sharded["summary"]
    assert err == ""  # --json: no progress lines
    # No artifact version was added: every partition of every asset was a cache hit.
    assert sorted(str(p.relative_to(store)) for p in store.rglob("STATUS.json")) == before
    assert any(p.startswith("shards/final/") for p in before) and len(before) > 50
    # ... and no shard wave started a run: the one run is the index's (it registers the keys)
    assert len(json.loads((runs["tmp"] / "P" / "summary.json").read_text())["runs"]) == 1


def test_a_failed_wave_is_reported_with_the_users_error():
    """The driver's message names the step and the body's exception, not Dagster's wrapper."""
    import dagster as dg

    from assets.datakit.run import failure

    @dg.asset
    def broken() -> None:
        raise ValueError("raw file x.csv: cannot shard a 'csv' file")

    result = dg.materialize([broken], raise_on_error=False)
    assert not result.success
    assert failure(result) == "broken failed: ValueError: raw file x.csv: cannot shard a 'csv' file"
