"""`marin datakit run`: the DataKit graph over a user's files, through the CLI as a user runs it."""

import contextlib
import io
import json
import os

import pytest

from marin_assets.cli import main

BYTES = ["--tokenizer", "bytes"]  # fast to load; the default (olmo) is exercised in tests/train/test_cli_datakit.py


def _write(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))


def _partly_copied(item: str, copied: int, filler_words: str) -> str:
    """A paragraph holding the first `copied` words of `item` and 32 - copied other words:
    its 13-gram overlap with the item is (copied - 12) / 20."""
    return " ".join(item.split()[:copied] + filler_words.split()[: 32 - copied])


def _run(args, capsys):
    code = main(["datakit", "run", *args, "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def _dataset(summary):
    from marin_assets.datakit.datasets import read_dataset

    return read_dataset(summary["cache"])


def _rows(summary, split):
    """Every token row of one split, shard by shard, read with Levanter's own reader."""
    from marin_assets.datakit.levanter_cache import open_cache

    rows = []
    for shard in _dataset(summary).shards:
        cache = open_cache(shard.split(split))
        rows += [r["input_ids"].tolist() for r in cache.get_batch_sync(list(range(len(cache))))] if len(cache) else []
    return rows


def _texts(summary):
    from marin_assets.datakit.shards import read_table

    return sorted(t for s in _dataset(summary).shards for t in read_table(s.documents).column("text").to_pylist())


def test_datakit_run_prints_one_json_line_with_the_invariant(tmp_path, capsys, prose):
    item = prose(7)
    near_45 = f"{prose(60)}\n{_partly_copied(item, 21, prose(70))}\n{prose(61)}"  # overlap 0.45: kept
    near_55 = f"{prose(62)}\n{_partly_copied(item, 23, prose(71))}\n{prose(63)}"  # overlap 0.55: removed
    docs = [{"text": prose(i)} for i in range(12)] + [{"text": prose(3)}, "not json", {"text": near_45}, {"text": near_55}]
    _write(tmp_path / "in.jsonl", docs)
    _write(tmp_path / "eval.jsonl", [{"text": item}])
    code, summary, _ = _run(
        [
            "--input",
            str(tmp_path / "in.jsonl"),
            "--eval",
            str(tmp_path / "eval.jsonl"),
            "--prefix",
            str(tmp_path / "out"),
            "--validation-fraction",
            "0.2",
            *BYTES,
        ],
        capsys,
    )
    assert code == 0
    assert sorted(summary) == [
        "cache",
        "docs_in",
        "docs_out",
        "languages",
        "pii_masked",
        "quarantine_reasons",
        "quarantined",
        "removed",
        "shards",
        "skipped_files",
        "store",
        "tokenizer",
        "tokens",
        "vocab_size",
    ]
    assert summary["docs_in"] == 16 and summary["quarantined"] == 1
    assert summary["removed"] == {"contaminated": 2, "exact_duplicate": 1, "fuzzy_duplicate": 0, "language": 0, "low_quality": 0}
    assert summary["languages"] == {}  # no --languages: lingua does not run
    assert summary["pii_masked"] == {"email": 0, "ip": 0, "phone": 0}
    assert summary["docs_in"] == summary["docs_out"] + sum(summary["removed"].values()) + summary["quarantined"]
    assert summary["docs_out"] == 12 and summary["vocab_size"] == 257 and summary["tokenizer"] == "bytes"
    final = _texts(summary)
    assert near_45 in final and near_55 not in final and item not in final
    # The reported token counts are the shard caches' own (Levanter's reader), each row a document + EOS.
    assert summary["cache"] == str(tmp_path / "out" / "cache")
    for split in ("train", "validation"):
        assert sum(len(r) for r in _rows(summary, split)) == summary["tokens"][split]
    assert len(_rows(summary, "train")) + len(_rows(summary, "validation")) == 12
    assert sorted(os.listdir(tmp_path / "out" / "cache")) == ["dataset.json", "tokenizer.json"]


def test_missing_input_is_a_clear_error(tmp_path, capsys):
    code = main(["datakit", "run", "--input", str(tmp_path / "nope"), "--prefix", str(tmp_path / "out"), "--json"])
    assert code == 1
    assert "does not exist" in capsys.readouterr().err


def test_input_with_only_bad_records_still_accounts_for_everything(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text('{bad\n{"text": ""}\n{"text": "nul \\u0000"}\n')
    code, summary, err = _run(["--input", str(tmp_path / "in"), "--prefix", str(tmp_path / "out"), *BYTES], capsys)
    assert code == 1 and "no documents left (3 read, 3 quarantined" in err  # nothing useful: non-zero
    assert summary["docs_in"] == 3 and summary["quarantined"] == 3 and summary["docs_out"] == 0
    assert summary["quarantine_reasons"] == {"empty_text": 1, "malformed_json": 1, "nul_bytes": 1}
    assert summary["tokens"] == {"train": 0, "validation": 0}


def _pathless(summary):
    return {k: v for k, v in summary.items() if k not in ("cache", "store")}


@pytest.mark.slow
def test_rerun_into_a_reused_prefix_equals_a_fresh_prefix(tmp_path, capsys, prose):
    # Run 1 (two inputs) leaves its shards in P/store; run 2 reads other documents that overlap
    # run 1's. Run 1's shards must not join run 2's dedup: run 2's graph never reads them.
    _write(tmp_path / "a.jsonl", [{"text": prose(i)} for i in range(12)])
    _write(tmp_path / "c.jsonl", [{"text": prose(100 + i)} for i in range(5)])
    _write(tmp_path / "b.jsonl", [{"text": prose(i)} for i in range(6, 18)] + [{"text": prose(7)}])
    common = ["--validation-fraction", "0.3", *BYTES]
    code, first, _ = _run(
        ["--input", str(tmp_path / "a.jsonl"), "--input", str(tmp_path / "c.jsonl"), "--prefix", str(tmp_path / "P"), *common],
        capsys,
    )
    assert code == 0 and first["docs_out"] == 17
    code, reused, _ = _run(["--input", str(tmp_path / "b.jsonl"), "--prefix", str(tmp_path / "P"), *common], capsys)
    assert code == 0
    code, fresh, _ = _run(["--input", str(tmp_path / "b.jsonl"), "--prefix", str(tmp_path / "F"), *common], capsys)
    assert code == 0
    assert reused["docs_in"] == 13 and reused["removed"]["exact_duplicate"] == 1 and reused["docs_out"] == 12
    assert _pathless(reused) == _pathless(fresh)
    assert _texts(reused) == _texts(fresh) and _rows(reused, "train") == _rows(fresh, "train")
    assert (
        sorted(os.listdir(tmp_path / "P"))
        == sorted(os.listdir(tmp_path / "F"))
        == [".datakit.lease", "cache", "run.json", "store", "summary.json"]
    )


@pytest.fixture(scope="module")
def four_docs(tmp_path_factory):
    """Two runs over one small input into one prefix, P, that already holds a user's files, under
    a relative --prefix: the runs three tests below read (each test's own run cost ~10 s).
    {"tmp": the folder, "summary": the first run's summary}."""
    from tests.support.text_corpus import prose

    tmp = tmp_path_factory.mktemp("four_docs")
    _write(tmp / "a.jsonl", [{"text": prose(i, 120)} for i in range(4)])
    (tmp / "P" / "cache").mkdir(parents=True)
    (tmp / "P" / "cache" / "important.txt").write_text("keep me")
    (tmp / "P" / "notes.md").write_text("mine")
    summaries, cwd = [], os.getcwd()
    os.chdir(tmp)  # the relative paths below resolve here (a module fixture has no monkeypatch)
    try:
        for _ in range(2):
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                code = main(["datakit", "run", "--input", "a.jsonl", "--prefix", "P", *BYTES, "--json"])
            assert code == 0
            summaries.append(json.loads(out.getvalue()))
    finally:
        os.chdir(cwd)
    return {"tmp": tmp, "summary": summaries[0]}


@pytest.mark.slow
def test_files_a_user_keeps_under_the_prefix_are_left_alone(four_docs):
    # A run writes only store/, cache/dataset.json, cache/tokenizer.json and summary.json: it
    # deletes nothing, so a user's file next to them survives two runs (a probe lost cache/important.txt).
    assert (four_docs["tmp"] / "P" / "cache" / "important.txt").read_text() == "keep me"
    assert (four_docs["tmp"] / "P" / "notes.md").read_text() == "mine"


def test_a_second_run_into_a_busy_prefix_is_refused_and_reports_nothing(tmp_path, capsys, prose):
    # Another run holds the prefix's lease: this one must neither wait silently, nor mix its
    # shards with the other's, nor print the other's result.
    from marin_assets.store.fsutil import filesystem
    from marin_assets.store.lease import Lease

    _write(tmp_path / "a.jsonl", [{"text": prose(i)} for i in range(4)])
    fs, root = filesystem(str(tmp_path / "P"))
    other = Lease(fs, f"{root}/.datakit.lease", heartbeat_thread=False)
    assert other.acquire()
    try:
        code, summary, err = _run(["--input", str(tmp_path / "a.jsonl"), "--prefix", str(tmp_path / "P"), *BYTES], capsys)
    finally:
        other.release()
    assert code == 1 and summary is None
    assert f"another marin datakit run is working on {tmp_path / 'P'}" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "P" / "cache").exists() and not (tmp_path / "P" / "summary.json").exists()


def test_paths_inside_what_a_run_writes_are_refused(four_docs, capsys):
    tmp_path = four_docs["tmp"]  # P holds a finished run
    before = (tmp_path / "P" / "cache" / "dataset.json").read_bytes()
    code, _, err = _run(
        [
            "--input",
            str(tmp_path / "a.jsonl"),
            "--prefix",
            str(tmp_path / "P"),
            "--tokenizer",
            str(tmp_path / "P" / "cache" / "tokenizer.json"),
        ],
        capsys,
    )
    assert code == 1 and "tokenizer" in err and "lies inside" in err
    code, _, err = _run(["--input", str(tmp_path / "P" / "store"), "--prefix", str(tmp_path / "P")], capsys)
    assert code == 1 and "input" in err and "lies inside" in err
    code, _, err = _run(["--input", str(tmp_path), "--prefix", str(tmp_path / "P")], capsys)
    assert code == 1 and "is inside input" in err
    assert (tmp_path / "P" / "cache" / "dataset.json").read_bytes() == before  # nothing was touched


BAD_FLAGS = [
    (["--validation-fraction", "nan"], "--validation-fraction", "finite"),
    (["--validation-fraction", "inf"], "--validation-fraction", "finite"),
    (["--validation-fraction", "1"], "--validation-fraction", "[0, 1)"),
    (["--validation-fraction", "-0.01"], "--validation-fraction", "[0, 1)"),
    (["--quality-threshold", "nan"], "--quality-threshold", "finite"),
    (["--quality-threshold=-inf"], "--quality-threshold", "finite"),
    (["--quality-threshold", "1.5"], "--quality-threshold", "[0, 1]"),
    (["--decontam-threshold", "0"], "--decontam-threshold", "(0, 1]"),
    (["--min-validation-docs", "-1"], "--min-validation-docs", "[0,"),
    (["--max-doc-bytes", "0"], "--max-doc-bytes", "[1,"),
    (["--max-doc-bytes", "-5"], "--max-doc-bytes", "[1,"),
    (["--workers", "0"], "--workers", "[1,"),
    (["--shard-bytes", "0"], "--shard-bytes", "[1,"),
    (["--extractor", "readability"], "--extractor", "resiliparse or trafilatura, got 'readability'"),
    (["--languages", "en,xx"], "--languages", "no language with ISO 639-1 code 'xx'"),
    (["--languages", "all,en"], "--languages", "'all' keeps every language"),
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
    (["--tokenizer", "MISSING"], "does not exist"),
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
    lines += [
        '{"text": "x", "n": ' + "9" * 5000 + "}",
        "[" * 200_000,
        '{"text": "y", "id": "\\ud800"}',
        '{"text": "z", "id": {"a": 1}}',
    ]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    code, summary, _ = _run(["--input", str(tmp_path / "in.jsonl"), "--prefix", str(tmp_path / "P"), *BYTES], capsys)
    assert code == 0
    assert summary["docs_in"] == 7 and summary["docs_out"] == 3 and summary["quarantined"] == 4
    assert summary["quarantine_reasons"] == {"invalid_field": 1, "invalid_utf8": 1, "malformed_json": 2}


def test_hostile_input_folders_are_read_safely_and_every_skip_is_counted(tmp_path, capsys, prose):
    # Probes: a FIFO hung the run, a directory symlink or a symlink loop crashed it, a link out
    # of the folder was read silently, a non-UTF-8 name refused the whole run naming no file, a
    # newline in a name forged a log line, a BOM cost the first record.
    root = tmp_path / "in"
    (tmp_path / "outside").mkdir()
    root.mkdir()
    (tmp_path / "outside" / "secret.jsonl").write_text(json.dumps({"text": "secret"}) + "\n")
    (root / "a.jsonl").write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps({"text": prose(i)}) + "\n" for i in range(3)).encode())
    os.symlink(tmp_path / "outside" / "secret.jsonl", root / "out.jsonl")
    os.symlink(tmp_path / "outside", root / "dir_link")
    os.symlink("loop_b", root / "loop_a")
    os.symlink("loop_a", root / "loop_b")
    os.mkfifo(root / "fifo.jsonl")
    (root / "line\nbreak.jsonl").write_text(json.dumps({"text": prose(9)}) + "\n")
    with open(os.path.join(os.fsencode(root), b"\xff.jsonl"), "w") as f:
        f.write(json.dumps({"text": prose(10)}) + "\n")
    code, summary, err = _run(["--input", str(root), "--prefix", str(tmp_path / "P"), *BYTES], capsys)
    assert code == 0, err
    assert summary["docs_in"] == 3 and summary["docs_out"] == 3  # a.jsonl only, its first record kept despite the BOM
    assert "secret" not in _texts(summary)
    skipped = summary["skipped_files"]
    assert set(skipped) == {
        "in/out.jsonl",
        "in/dir_link",
        "in/loop_a",
        "in/loop_b",
        "in/fifo.jsonl",
        "in/line\\nbreak.jsonl",
        "in/\\udcff.jsonl",
    }
    assert "outside the input" in skipped["in/out.jsonl"] and "FIFO" in skipped["in/fifo.jsonl"]
    assert "not valid UTF-8" in skipped["in/\\udcff.jsonl"] and "control characters" in skipped["in/line\\nbreak.jsonl"]
    assert all("\n" not in k for k in skipped)


@pytest.mark.slow
def test_a_small_input_still_gets_a_validation_document(tmp_path, capsys, prose):
    # 12 documents at --validation-fraction 0.01: the id-hash slice picks none of them, so the
    # validation split would be empty and `marin train` would have no held-out loss. The shard
    # holds out its smallest id instead (--min-validation-docs, default 1); 0 means none.
    from marin_assets.datakit.tokenize import is_validation

    _write(tmp_path / "in.jsonl", [{"text": prose(i)} for i in range(12)])
    code, summary, _ = _run(
        ["--input", str(tmp_path / "in.jsonl"), "--prefix", str(tmp_path / "P"), "--validation-fraction", "0.01", *BYTES], capsys
    )
    from marin_assets.datakit.shards import read_table

    ids = [i for s in _dataset(summary).shards for i in read_table(s.documents).column("id").to_pylist()]
    assert code == 0 and len(ids) == 12 and not any(is_validation(i, 0.01) for i in ids)  # the premise
    assert (len(_rows(summary, "validation")), len(_rows(summary, "train"))) == (1, 11)
    assert summary["tokens"]["validation"] > 0 and summary["tokens"]["train"] > summary["tokens"]["validation"]
    code, none, _ = _run(
        [
            "--input",
            str(tmp_path / "in.jsonl"),
            "--prefix",
            str(tmp_path / "Z"),
            "--validation-fraction",
            "0.01",
            "--min-validation-docs",
            "0",
            *BYTES,
        ],
        capsys,
    )
    assert code == 0 and none["tokens"]["validation"] == 0 and none["tokens"]["train"] == sum(summary["tokens"].values())


def test_summary_paths_are_absolute_under_a_relative_prefix(four_docs):
    # Each path in the summary feeds the next command from any directory (the runs: --prefix P).
    summary, tmp_path = four_docs["summary"], four_docs["tmp"]
    assert summary["cache"] == str(tmp_path / "P" / "cache") and summary["store"] == str(tmp_path / "P" / "store")


@pytest.mark.slow
def test_with_dagster_home_set_the_runs_are_recorded_there_with_their_lineage(tmp_path, capsys, prose, monkeypatch):
    # The run's assets appear in that instance (runs, materializations of every shard), on shard
    # partitions of its own, and run_location rebuilds the graph the UI draws their lineage from.
    import dagster as dg

    from assets.datakit.run_location import definitions_for
    from assets.partitions import datakit_shards

    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with dg.DagsterInstance.get() as instance:
        instance.add_dynamic_partitions(datakit_shards.name, ["sotu-demo-00000"])  # the demo's, in the same instance
    _write(tmp_path / "in.jsonl", [{"text": prose(i)} for i in range(6)])
    code, summary, _ = _run(["--input", str(tmp_path / "in.jsonl"), "--prefix", str(tmp_path / "P"), *BYTES], capsys)
    assert code == 0
    recorded = json.loads((tmp_path / "P" / "summary.json").read_text())["runs"]
    with dg.DagsterInstance.get() as instance:
        assert {r.run_id for r in instance.get_runs()} == set(recorded) and len(recorded) >= 2
        tokenized = instance.get_materialized_partitions(dg.AssetKey(["shards", "tokenized"]))
        assert tokenized == {"in-in-00000"} and instance.get_latest_materialization_event(dg.AssetKey(["datasets", "in"]))
        assert instance.get_dynamic_partitions(datakit_shards.name) == ["sotu-demo-00000"]  # left alone
    graph = definitions_for(str(tmp_path / "P")).resolve_asset_graph()
    upstream = graph.get(dg.AssetKey(["datasets", "in"])).parent_keys
    assert dg.AssetKey(["shards", "tokenized"]) in upstream
    assert dg.AssetKey(["sources", "in"]) in graph.get(dg.AssetKey(["shards", "index"])).parent_keys


def test_a_dagster_home_that_does_not_exist_yet_is_made(tmp_path, monkeypatch):
    # `make` exports DAGSTER_HOME=./.dagster_home before anything made it; Dagster alone refuses
    # such a folder, and the CLI run died before it printed its summary.
    from assets.datakit.run import recording_instance

    home = tmp_path / "not" / "yet"
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with recording_instance() as instance:
        assert not instance.is_ephemeral and home.is_dir()
    monkeypatch.delenv("DAGSTER_HOME")
    with recording_instance() as instance:
        assert instance.is_ephemeral


@pytest.mark.slow
def test_a_copied_prefix_reads_only_itself_and_a_rerun_recomputes_a_damaged_shard(tmp_path, capsys, prose, monkeypatch):
    # Before: P/cache/dataset.json held absolute shard paths (under a relative --prefix too) and the store's
    # LATEST.json pointers absolute version paths, so `cp -r P Q` gave a Q that read P; and a shard chunk
    # deleted after the run was trained on as zeros while a rerun said "up to date".
    import shutil

    from marin_assets.train.data.token_caches import open_source

    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "in.jsonl", [{"text": prose(i)} for i in range(8)])
    args = ["--input", "in.jsonl", "--validation-fraction", "0.2", *BYTES]
    code, summary, _ = _run([*args, "--prefix", "P"], capsys)
    assert code == 0
    rows = _rows(summary, "train")
    index = json.loads((tmp_path / "P" / "cache" / "dataset.json").read_text())
    assert all(s["path"].startswith("../store/shards/tokenized/") for s in index["shards"])
    shutil.copytree(tmp_path / "P", tmp_path / "Q")
    (tmp_path / "P").rename(tmp_path / "gone")  # anything still pointing into P now fails
    (chunk,) = (tmp_path / "Q" / "store" / "shards" / "tokenized").glob("*/*/data/train/input_ids/data/c/0")
    chunk.unlink()
    with pytest.raises(ValueError, match=r"^dataset shard .*train/input_ids/data/c/0: missing"):
        open_source("Q/cache").train.read([0], 4)
    code, again, err = _run([*args, "--prefix", "Q"], capsys)
    assert code == 0, err
    assert again["tokens"] == summary["tokens"] and chunk.exists() and _rows(again, "train") == rows
    stream = open_source("Q/cache").train
    assert stream.read([0], stream.num_tokens).tolist() == [[t for r in rows for t in r]]
    mentions = [str(p) for p in (tmp_path / "Q").rglob("*.json") if str(tmp_path / "P") + "/" in p.read_text()]
    assert mentions == []
