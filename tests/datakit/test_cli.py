import json
import os

import pytest

from marin_assets.cli import main


def _write(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))


def _partly_copied(item: str, copied: int, filler_words: str) -> str:
    """A paragraph holding the first `copied` words of `item` and 32 - copied other words:
    its 13-gram overlap with the item is (copied - 12) / 20."""
    return " ".join(item.split()[:copied] + filler_words.split()[: 32 - copied])


def test_datakit_run_prints_one_json_line_with_the_invariant(tmp_path, capsys, prose):
    import pyarrow.parquet as pq

    from marin_assets.datakit.tokenize import open_cache

    item = prose(7)
    near_45 = f"{prose(60)}\n{_partly_copied(item, 21, prose(70))}\n{prose(61)}"  # overlap 0.45: kept
    near_55 = f"{prose(62)}\n{_partly_copied(item, 23, prose(71))}\n{prose(63)}"  # overlap 0.55: removed
    docs = [{"text": prose(i)} for i in range(12)] + [{"text": prose(3)}, "not json", {"text": near_45}, {"text": near_55}]
    _write(tmp_path / "in.jsonl", docs)
    _write(tmp_path / "eval.jsonl", [{"text": item}])
    code = main(["datakit", "run", "--input", str(tmp_path / "in.jsonl"), "--eval", str(tmp_path / "eval.jsonl"),
                 "--prefix", str(tmp_path / "out"), "--vocab-size", "300", "--validation-fraction", "0.2", "--json"])  # fmt: skip
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    summary = json.loads(lines[0])
    assert sorted(summary) == ["cache", "docs_in", "docs_out", "final_documents", "quarantine_reasons", "quarantined",
                               "removed", "tokenizer", "tokens"]  # fmt: skip
    assert summary["docs_in"] == 16 and summary["quarantined"] == 1
    assert summary["removed"] == {"contaminated": 2, "exact_duplicate": 1, "fuzzy_duplicate": 0, "low_quality": 0}
    assert summary["docs_in"] == summary["docs_out"] + sum(summary["removed"].values()) + summary["quarantined"]
    assert summary["docs_out"] == 12
    final = [t for s in sorted((tmp_path / "out" / "final_documents").glob("part-*.parquet"))
             for t in pq.read_table(s).column("text").to_pylist()]  # fmt: skip
    assert near_45 in final and near_55 not in final and item not in final
    # The reported token counts are the cache's: P/cache/{train,validation} open with Levanter's reader.
    assert summary["cache"] == str(tmp_path / "out" / "cache")
    for split in ("train", "validation"):
        cache = open_cache(f"{summary['cache']}/{split}")
        tokens = sum(len(r["input_ids"]) for r in cache.get_batch_sync(list(range(len(cache)))))
        assert tokens == summary["tokens"][split]
    assert len(open_cache(f"{summary['cache']}/train")) + len(open_cache(f"{summary['cache']}/validation")) == 12
    assert summary["final_documents"].endswith("final_documents")


def test_missing_input_is_a_clear_error(tmp_path, capsys):
    code = main(["datakit", "run", "--input", str(tmp_path / "nope"), "--prefix", str(tmp_path / "out"), "--json"])
    assert code == 1
    assert "does not exist" in capsys.readouterr().err


def test_bad_threshold_is_rejected(tmp_path, capsys):
    code = main(["datakit", "run", "--input", str(tmp_path), "--prefix", str(tmp_path / "o"), "--quality-threshold", "2"])
    assert code == 2 and "--quality-threshold" in capsys.readouterr().err


def test_input_with_only_bad_records_still_accounts_for_everything(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text('{bad\n{"text": ""}\n{"text": "nul \\u0000"}\n')
    code = main(["datakit", "run", "--input", str(tmp_path / "in"), "--prefix", str(tmp_path / "out"), "--json"])
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert code == 1 and "no documents left (3 read, 3 quarantined" in captured.err  # nothing useful: non-zero
    assert summary["docs_in"] == 3 and summary["quarantined"] == 3 and summary["docs_out"] == 0
    assert summary["quarantine_reasons"] == {"empty_text": 1, "malformed_json": 1, "nul_bytes": 1}
    assert summary["tokens"] == {"train": 0, "validation": 0}


def _run(args, capsys):
    code = main(["datakit", "run", *args, "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def _outputs(prefix):
    """What a run produced, path-free: final texts and the token rows of both cache splits."""
    from marin_assets.datakit.shards import list_shards, read_table
    from marin_assets.datakit.tokenize import open_cache

    texts = sorted(t for s in list_shards(str(prefix / "final_documents")) for t in read_table(s).column("text").to_pylist())
    rows = {}
    for split in ("train", "validation"):
        cache = open_cache(str(prefix / "cache" / split))
        rows[split] = [r["input_ids"].tolist() for r in cache.get_batch_sync(list(range(len(cache))))]
    return texts, rows


def _pathless(summary):
    return {k: v for k, v in summary.items() if k not in ("cache", "final_documents", "tokenizer")}


def test_rerun_into_a_reused_prefix_equals_a_fresh_prefix(tmp_path, capsys, prose):
    # Run 1 (two inputs, shard size 3) leaves map/reduce buckets, attributes and shards behind;
    # run 2 reads other documents that overlap run 1's. Before the fix, run 1's exact-dedup map
    # files joined run 2's reduce and every overlapping document was "an exact duplicate".
    _write(tmp_path / "a.jsonl", [{"text": prose(i)} for i in range(12)])
    _write(tmp_path / "c.jsonl", [{"text": prose(100 + i)} for i in range(5)])
    _write(tmp_path / "b.jsonl", [{"text": prose(i)} for i in range(6, 18)] + [{"text": prose(7)}])
    common = ["--vocab-size", "300", "--validation-fraction", "0.3"]
    code, first, _ = _run(["--input", str(tmp_path / "a.jsonl"), "--input", str(tmp_path / "c.jsonl"),
                           "--prefix", str(tmp_path / "P"), "--shard-docs", "3", *common], capsys)  # fmt: skip
    assert code == 0 and first["docs_out"] == 17
    code, reused, _ = _run(["--input", str(tmp_path / "b.jsonl"), "--prefix", str(tmp_path / "P"), *common], capsys)
    assert code == 0
    code, fresh, _ = _run(["--input", str(tmp_path / "b.jsonl"), "--prefix", str(tmp_path / "F"), *common], capsys)
    assert code == 0
    assert reused["docs_in"] == 13 and reused["removed"]["exact_duplicate"] == 1 and reused["docs_out"] == 12
    assert _pathless(reused) == _pathless(fresh)
    assert _outputs(tmp_path / "P") == _outputs(tmp_path / "F")
    # Nothing of run 1's output is left: the reused prefix holds what the fresh one does (run 1's
    # artifacts stay in P/store under their own versions, which run 2's graph never reads).
    assert sorted(os.listdir(tmp_path / "P")) == sorted(os.listdir(tmp_path / "F")) == [
        "cache", "final_documents", "store", "summary.json", "tokenizer"]  # fmt: skip
    # The same input twice into one prefix gives the same output again.
    code, again, _ = _run(["--input", str(tmp_path / "b.jsonl"), "--prefix", str(tmp_path / "P"), *common], capsys)
    assert code == 0 and _pathless(again) == _pathless(fresh) and _outputs(tmp_path / "P") == _outputs(tmp_path / "F")


def test_paths_inside_what_a_run_empties_are_refused(tmp_path, capsys, prose):
    _write(tmp_path / "a.jsonl", [{"text": prose(i)} for i in range(4)])
    code, _, _ = _run(["--input", str(tmp_path / "a.jsonl"), "--prefix", str(tmp_path / "P"), "--vocab-size", "300"], capsys)
    assert code == 0
    before = sorted(os.listdir(tmp_path / "P" / "final_documents"))
    # Reusing this prefix's own tokenizer or output as input would delete it before reading it.
    code, _, err = _run(["--input", str(tmp_path / "a.jsonl"), "--prefix", str(tmp_path / "P"),
                         "--tokenizer", str(tmp_path / "P" / "tokenizer" / "tokenizer.json")], capsys)  # fmt: skip
    assert code == 1 and "tokenizer" in err and "lies inside" in err
    code, _, err = _run(["--input", str(tmp_path / "P" / "final_documents"), "--prefix", str(tmp_path / "P")], capsys)
    assert code == 1 and "input" in err and "lies inside" in err
    code, _, err = _run(["--input", str(tmp_path / "P" / "store"), "--prefix", str(tmp_path / "P")], capsys)
    assert code == 1 and "input" in err and "lies inside" in err
    code, _, err = _run(["--input", str(tmp_path), "--prefix", str(tmp_path / "P")], capsys)
    assert code == 1 and "is inside input" in err
    assert sorted(os.listdir(tmp_path / "P" / "final_documents")) == before  # nothing was touched


BAD_FLAGS = [
    (["--validation-fraction", "nan"], "--validation-fraction", "finite"),
    (["--validation-fraction", "inf"], "--validation-fraction", "finite"),
    (["--validation-fraction", "1"], "--validation-fraction", "[0, 1)"),
    (["--validation-fraction", "-0.01"], "--validation-fraction", "[0, 1)"),
    (["--quality-threshold", "nan"], "--quality-threshold", "finite"),
    (["--quality-threshold=-inf"], "--quality-threshold", "finite"),
    (["--quality-threshold", "1.5"], "--quality-threshold", "[0, 1]"),
    (["--vocab-size", "10"], "--vocab-size", "[258,"),
    (["--shard-docs", "0"], "--shard-docs", "[1,"),
    (["--max-doc-bytes", "0"], "--max-doc-bytes", "[1,"),
    (["--max-doc-bytes", "-5"], "--max-doc-bytes", "[1,"),
    (["--workers", "0"], "--workers", "[1,"),
    (["--shard-bytes", "0"], "--shard-bytes", "[1,"),
]


@pytest.mark.parametrize("flag_args,flag,expected", BAD_FLAGS)
def test_every_flag_is_checked_before_any_work(tmp_path, capsys, flag_args, flag, expected):
    _write(tmp_path / "in.jsonl", [{"text": "a real document"}])  # a valid input: work could start
    code, summary, err = _run(["--input", str(tmp_path / "in.jsonl"), "--prefix", str(tmp_path / "P"), *flag_args], capsys)
    assert code == 2 and summary is None
    assert err.startswith(f"marin datakit run: {flag}: ") and expected in err
    assert not (tmp_path / "P").exists()  # not a single stage ran


def test_a_bad_worker_count_in_the_environment_is_reported_before_any_work(tmp_path, capsys, monkeypatch):
    _write(tmp_path / "in.jsonl", [{"text": "a real document"}])
    monkeypatch.setenv("MARIN_LOCAL_WORKERS", "two")
    code, summary, err = _run(["--input", str(tmp_path / "in.jsonl"), "--prefix", str(tmp_path / "P")], capsys)
    assert code == 2 and summary is None and "MARIN_LOCAL_WORKERS" in err and not (tmp_path / "P").exists()


@pytest.mark.parametrize("extra,message", [
    (["--input", "MISSING"], "input path does not exist"),
    (["--eval", "MISSING"], "neither a file nor a packaged set"),
    (["--tokenizer", "MISSING"], "tokenizer"),
    (["--quality-model", "MISSING"], "quality_model.json"),
])  # fmt: skip
def test_missing_paths_are_reported_before_any_work(tmp_path, capsys, extra, message):
    _write(tmp_path / "in.jsonl", [{"text": "a real document"}])
    extra = [str(tmp_path / "missing") if a == "MISSING" else a for a in extra]
    code, _, err = _run(["--input", str(tmp_path / "in.jsonl"), "--prefix", str(tmp_path / "P"), *extra], capsys)
    assert code == 1 and message in err and "missing" in err
    assert not (tmp_path / "P").exists()


def test_a_bad_eval_file_stops_the_run_before_normalization(tmp_path, capsys):
    _write(tmp_path / "in.jsonl", [{"text": "a real document"}])
    (tmp_path / "eval.jsonl").write_text('{"text": "fine eval item with enough words in it"}\n{broken\n')
    code, _, err = _run(["--input", str(tmp_path / "in.jsonl"), "--eval", str(tmp_path / "eval.jsonl"),
                         "--prefix", str(tmp_path / "P")], capsys)  # fmt: skip
    assert code == 1 and "line 2" in err
    assert not (tmp_path / "P").exists()  # checked before the graph driver started


def test_hostile_lines_cost_one_line_each_through_the_cli(tmp_path, capsys, prose):
    lines = [json.dumps({"text": prose(i)}) for i in range(3)]
    lines += ['{"text": "x", "n": ' + "9" * 5000 + "}", "[" * 200_000, '{"text": "y", "id": "\\ud800"}', '{"text": "z", "id": {"a": 1}}']
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    code, summary, _ = _run(["--input", str(tmp_path / "in.jsonl"), "--prefix", str(tmp_path / "P"), "--vocab-size", "300"], capsys)
    assert code == 0
    assert summary["docs_in"] == 7 and summary["docs_out"] == 3 and summary["quarantined"] == 4
    assert summary["quarantine_reasons"] == {"invalid_field": 1, "invalid_utf8": 1, "malformed_json": 2}


def test_a_small_input_still_gets_a_validation_document(tmp_path, capsys, prose):
    # 12 documents at the default --validation-fraction 0.01: the id-hash slice picks none of
    # them, so before the fix the validation split was empty and `marin train` had no
    # held-out loss. Now the smallest id is held out; --validation-fraction 0 still means none.
    from marin_assets.datakit.shards import list_shards, read_table
    from marin_assets.datakit.tokenize import is_validation, open_cache

    _write(tmp_path / "in.jsonl", [{"text": prose(i)} for i in range(12)])
    code, summary, _ = _run(["--input", str(tmp_path / "in.jsonl"), "--prefix", str(tmp_path / "P"),
                             "--vocab-size", "300"], capsys)  # fmt: skip
    ids = sorted(i for s in list_shards(str(tmp_path / "P" / "final_documents")) for i in read_table(s).column("id").to_pylist())
    assert code == 0 and len(ids) == 12 and not any(is_validation(i, 0.01) for i in ids)  # the premise
    assert len(open_cache(str(tmp_path / "P" / "cache" / "validation"))) == 1
    assert len(open_cache(str(tmp_path / "P" / "cache" / "train"))) == 11
    assert summary["tokens"]["validation"] > 0 and summary["tokens"]["train"] > summary["tokens"]["validation"]
    code, none, _ = _run(["--input", str(tmp_path / "in.jsonl"), "--prefix", str(tmp_path / "Z"), "--vocab-size", "300",
                          "--validation-fraction", "0"], capsys)  # fmt: skip
    assert code == 0 and none["tokens"]["validation"] == 0 and none["tokens"]["train"] == sum(summary["tokens"].values())


def test_summary_paths_are_absolute_under_a_relative_prefix(tmp_path, capsys, prose, monkeypatch):
    # Each path in the summary feeds the next command from any directory; the trained
    # tokenizer's used to be printed relative to --prefix while "cache" was absolute.
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "in.jsonl", [{"text": prose(i)} for i in range(4)])
    code, summary, _ = _run(["--input", "in.jsonl", "--prefix", "P", "--vocab-size", "300"], capsys)
    assert code == 0
    assert summary["cache"] == str(tmp_path / "P" / "cache")
    assert summary["final_documents"] == str(tmp_path / "P" / "final_documents")
    assert summary["tokenizer"] == str(tmp_path / "P" / "tokenizer" / "tokenizer.json")
