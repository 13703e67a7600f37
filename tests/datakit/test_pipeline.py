import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marin_assets.datakit.normalize import NormalizeConfig, normalize
from marin_assets.datakit.pipeline import ConfigFieldError, PipelineConfig, RunSpec, dataset_names, run_pipeline
from marin_assets.datakit.quality import QualityModelConfig, train_quality_model
from marin_assets.datakit.shards import list_shards, read_table
from marin_assets.datakit.tokenize import open_cache


def spammy(i):
    return f"CLICK HERE!!! FREE $$$ offer {i} unsubscribe http://spam{i}.biz buy now!!! limited time act now"


def _prose(seed, words=120):
    from text_corpus import prose

    return prose(seed, words)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pipe")
    # a small quality model: prose-like = high, spam-like = low
    for name, texts in (("high", [_prose(1000 + i, 60) for i in range(40)]), ("low", [spammy(1000 + i) for i in range(40)])):
        (tmp / f"{name}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        normalize(str(tmp / f"{name}.jsonl"), str(tmp / "qn" / name), NormalizeConfig(source=name))
    train_quality_model(list_shards(str(tmp / "qn" / "high")), list_shards(str(tmp / "qn" / "low")), str(tmp / "qmodel"),
                        QualityModelConfig(num_features=1 << 12, max_iter=100))  # fmt: skip

    uniques = [_prose(i) for i in range(30)]
    eval_text = _prose(999, 40)
    near = uniques[1].rsplit(" ", 3)[0] + " kan los mith."  # last words changed: Jaccard well above 0.8
    a = [{"text": t} for t in uniques[:20]]
    a += [{"text": uniques[0]}, {"text": uniques[2]}]  # 2 exact duplicates
    a += [{"text": near}]  # 1 near duplicate
    a += [{"text": f"{_prose(500)}\n\n{eval_text}\n\n{_prose(501)}"}]  # 1 contaminated
    a += [{"text": spammy(i)} for i in range(3)]  # 3 low quality
    a += ["{broken", json.dumps({"text": ""})]  # 2 quarantined
    (tmp / "in_a").mkdir()
    (tmp / "in_a" / "docs.jsonl").write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in a))
    (tmp / "in_a" / "blob.txt").write_bytes(bytes(range(256)) * 40)  # 1 quarantined (binary)
    (tmp / "in_b").mkdir()
    b = [{"text": t} for t in uniques[20:]] + [{"text": uniques[5]}]  # 1 more exact duplicate, across inputs
    (tmp / "in_b" / "more.jsonl").write_text("".join(json.dumps(r) + "\n" for r in b))
    (tmp / "eval.jsonl").write_text(json.dumps({"id": "q1", "text": eval_text}) + "\n")

    config = PipelineConfig(quality_threshold=0.5, quality_model=str(tmp / "qmodel"), vocab_size=300,
                            validation_fraction=0.2, shard_docs=7)  # fmt: skip
    stages = []
    summary = run_pipeline([str(tmp / "in_a"), str(tmp / "in_b")], [str(tmp / "eval.jsonl")], str(tmp / "out"), config,
                           on_stage=lambda s, c: stages.append(s))  # fmt: skip
    return summary, stages, uniques, tmp


def test_counts_per_reason_and_invariant(planted):
    summary, stages, _, _ = planted
    assert summary["docs_in"] == 30 + 11  # in_a: 29 lines + 1 binary file; in_b: 11 lines
    assert summary["quarantined"] == 3
    assert summary["quarantine_reasons"] == {"binary_file": 1, "empty_text": 1, "malformed_json": 1}
    assert summary["removed"] == {"low_quality": 3, "exact_duplicate": 3, "fuzzy_duplicate": 1, "contaminated": 1}
    assert summary["docs_out"] == 30
    assert summary["docs_in"] == summary["docs_out"] + sum(summary["removed"].values()) + summary["quarantined"]
    assert stages == ["normalize", "quality", "exact_dedup", "fuzzy_dedup", "decontaminate", "tokenizer", "tokenize"]


def test_final_documents_are_the_unique_clean_texts(planted):
    summary, _, uniques, _ = planted
    texts = []
    for shard in list_shards(summary["final_documents"]):
        table = read_table(shard)
        assert table.column_names == ["id", "text"]
        texts += table.column("text").to_pylist()
    # every unique document survives once; for the near-duplicate pair exactly one of the two does
    assert len(texts) == 30 and len(set(texts)) == 30
    assert set(uniques) - set(texts) <= {uniques[1]}


def test_cache_holds_every_final_document(planted):
    summary, _, _, _ = planted
    train, val = open_cache(summary["cache"] + "/train"), open_cache(summary["cache"] + "/validation")
    assert len(train) + len(val) == summary["docs_out"]
    tokens = sum(len(r["input_ids"]) for r in train.get_batch_sync(list(range(len(train)))))
    assert tokens == summary["tokens"]["train"]


def test_dataset_names_are_distinct():
    assert dataset_names(["/a/x.jsonl", "/b/x.jsonl.gz", "gs://c/y"]) == ["x", "x_2", "y"]


def test_apply_filters_rejects_misaligned_attributes(tmp_path):
    import pyarrow as pa

    from marin_assets.datakit.pipeline import _Filter, apply_filters
    from marin_assets.datakit.shards import write_table

    (tmp_path / "in.jsonl").write_text('{"text": "a"}\n{"text": "b"}\n')
    normalize(str(tmp_path / "in.jsonl"), str(tmp_path / "n"), NormalizeConfig(source="s"))
    [shard] = list_shards(str(tmp_path / "n"))
    ids = read_table(shard).column("id").to_pylist()
    write_table(pa.table({"id": ids[::-1], "flag": [True, False]}), str(tmp_path / "attrs" / shard.rsplit("/", 1)[1]))
    with pytest.raises(RuntimeError, match="not co-partitioned"):
        apply_filters({"s": [shard]}, [_Filter("x", lambda n: str(tmp_path / "attrs"), "flag")], str(tmp_path / "o"), 10)
    write_table(pa.table({"id": ids, "flag": [True, False]}), str(tmp_path / "attrs" / shard.rsplit("/", 1)[1]))
    counts = apply_filters({"s": [shard]}, [_Filter("x", lambda n: str(tmp_path / "attrs"), "flag")], str(tmp_path / "o"), 10)
    assert counts == {"docs_in": 2, "docs_out": 1, "removed": {"x": 1}}
    assert read_table(list_shards(str(tmp_path / "o"))[0]).column("id").to_pylist() == [ids[1]]


@settings(max_examples=100, deadline=None)
@given(inputs=st.lists(st.text(min_size=1, max_size=20), min_size=1, max_size=3), evals=st.lists(st.text(max_size=10), max_size=2),
       workers=st.integers(-3, 64), shard_bytes=st.integers(-3, 1 << 40), quiet=st.booleans(),
       threshold=st.floats(0, 1), tokenizer=st.none() | st.just("tok/tokenizer.json"))
def test_run_spec_round_trips_through_json_and_checks_its_counts(inputs, evals, workers, shard_bytes, quiet, threshold, tokenizer):
    """What the CLI hands the graph driver (one argv item) is what the driver runs."""
    config = PipelineConfig(quality_threshold=threshold, tokenizer=tokenizer)
    if workers < 1 or shard_bytes < 1:
        with pytest.raises(ConfigFieldError) as err:
            RunSpec(tuple(inputs), tuple(evals), "P", config, workers=workers, shard_bytes=shard_bytes)
        assert err.value.field == ("workers" if workers < 1 else "shard_bytes") and "[1," in err.value.reason
        return
    spec = RunSpec(tuple(inputs), tuple(evals), "P", config, workers=workers, shard_bytes=shard_bytes, quiet=quiet)
    assert RunSpec.from_json(spec.to_json()) == spec
