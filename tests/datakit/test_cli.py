import json

from marin_assets.cli import main


def _write(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))


def test_datakit_run_prints_one_json_line_with_the_invariant(tmp_path, capsys, prose):
    docs = [{"text": prose(i)} for i in range(12)] + [{"text": prose(3)}, "not json"]
    _write(tmp_path / "in.jsonl", docs)
    _write(tmp_path / "eval.jsonl", [{"text": prose(7)}])
    code = main(["datakit", "run", "--input", str(tmp_path / "in.jsonl"), "--eval", str(tmp_path / "eval.jsonl"),
                 "--prefix", str(tmp_path / "out"), "--vocab-size", "300", "--json"])  # fmt: skip
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    summary = json.loads(lines[0])
    assert summary["docs_in"] == 14 and summary["quarantined"] == 1
    assert summary["removed"]["exact_duplicate"] == 1 and summary["removed"]["contaminated"] == 1
    assert summary["docs_in"] == summary["docs_out"] + sum(summary["removed"].values()) + summary["quarantined"]
    assert summary["docs_out"] == 11
    assert summary["tokens"]["train"] + summary["tokens"]["validation"] > 0
    assert (tmp_path / "out" / "cache" / "train" / "shard_ledger.json").exists()
    assert summary["final_documents"].endswith("final_documents")


def test_missing_input_is_a_clear_error(tmp_path, capsys):
    code = main(["datakit", "run", "--input", str(tmp_path / "nope"), "--prefix", str(tmp_path / "out"), "--json"])
    assert code == 1
    assert "does not exist" in capsys.readouterr().err


def test_bad_threshold_is_rejected(tmp_path, capsys):
    code = main(["datakit", "run", "--input", str(tmp_path), "--prefix", str(tmp_path / "o"), "--quality-threshold", "2"])
    assert code == 2 and "quality_threshold" in capsys.readouterr().err


def test_input_with_only_bad_records_still_accounts_for_everything(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text('{bad\n{"text": ""}\n{"text": "nul \\u0000"}\n')
    code = main(["datakit", "run", "--input", str(tmp_path / "in"), "--prefix", str(tmp_path / "out"), "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert code == 0
    assert summary["docs_in"] == 3 and summary["quarantined"] == 3 and summary["docs_out"] == 0
    assert summary["quarantine_reasons"] == {"empty_text": 1, "malformed_json": 1, "nul_bytes": 1}
    assert summary["tokens"] == {"train": 0, "validation": 0}
