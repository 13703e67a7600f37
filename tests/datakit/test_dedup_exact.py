import pytest

from marin_assets.datakit.dedup_exact import ExactDedupConfig, exact_dedup, paragraph_spans
from marin_assets.datakit.normalize import NormalizeConfig, normalize
from marin_assets.datakit.shards import list_shards, read_table


def _dataset(tmp_path, name, records, shard_docs=4):
    src = tmp_path / f"{name}.jsonl"
    src.write_text("".join(__import__("json").dumps(r) + "\n" for r in records))
    out = tmp_path / "norm" / name
    normalize(str(src), str(out), NormalizeConfig(source=name, shard_docs=shard_docs))
    return list_shards(str(out))


def test_planted_exact_duplicates_all_removed_across_datasets(tmp_path, prose):
    uniques = [prose(i) for i in range(12)]
    # dataset b repeats a's docs 0..4 (some twice) and has its own; a repeats its doc 3.
    a = [{"text": t, "id": f"a{i}"} for i, t in enumerate(uniques[:8])] + [{"text": uniques[3], "id": "a9-copy"}]
    b = [{"text": uniques[i], "id": f"b{i}"} for i in (0, 1, 2, 4, 4)] + [{"text": t, "id": f"b{i}"} for i, t in enumerate(uniques[8:], 8)]
    datasets = {"a": _dataset(tmp_path, "a", a), "b": _dataset(tmp_path, "b", b)}
    counts = exact_dedup(datasets, str(tmp_path / "dedup"), ExactDedupConfig(num_buckets=3))
    assert counts["docs"] == 9 + 9 and counts["unique"] == 12 and counts["duplicates"] == 6

    kept_texts, kept = [], []
    for name, shards in datasets.items():
        for shard in shards:
            docs = read_table(shard).to_pylist()
            attrs = read_table(str(tmp_path / "dedup" / name / shard.rsplit("/", 1)[1])).to_pylist()
            assert [d["id"] for d in docs] == [a["id"] for a in attrs]  # co-partitioned, same row order
            assert [d["source_id"] for d in docs] == [a["source_id"] for a in attrs]
            for d, at in zip(docs, attrs):
                if not at["is_duplicate"]:
                    kept_texts.append(d["text"])
                    kept.append((d["source"], d["source_id"]))
    assert sorted(kept_texts) == sorted(uniques)  # every text survives exactly once
    # the survivor of each group is the copy with the lowest (source, source_id)
    assert ("a", "a3") in kept and ("a", "a9-copy") not in kept
    assert ("a", "a0") in kept and ("b", "b0") not in kept and ("b", "b8") in kept


def test_paragraph_mode_marks_repeated_paragraph_spans(tmp_path, prose):
    shared = prose(100, 30)
    first = f"{prose(1, 30)}\n\n{shared}\n\n{prose(2, 30)}"
    second = f"{prose(3, 30)}\n\n{shared}"
    shards = _dataset(tmp_path, "p", [{"text": first, "id": "1"}, {"text": second, "id": "2"}])
    counts = exact_dedup({"p": shards}, str(tmp_path / "dedup"), ExactDedupConfig(num_buckets=2, paragraphs=True))
    assert counts["duplicates"] == 0 and counts["duplicate_paragraphs"] == 1
    docs = read_table(shards[0]).to_pylist()
    attrs = read_table(str(tmp_path / "dedup" / "p" / shards[0].rsplit("/", 1)[1])).to_pylist()
    spans = {d["source_id"]: (d["text"], a["duplicate_spans"]) for d, a in zip(docs, attrs)}
    # the document with the larger id holds the later copy
    later = max(docs, key=lambda d: d["id"])["source_id"]
    earlier = min(docs, key=lambda d: d["id"])["source_id"]
    text, [span] = spans[later]
    assert text[span["start"] : span["end"]].strip() == shared
    assert spans[earlier][1] == []


def test_paragraph_spans_split_on_blank_lines():
    text = "one line\nstill one paragraph\n\n  \n\nsecond paragraph here"
    assert [p for _, _, p in paragraph_spans(text, 1)] == ["one line\nstill one paragraph", "second paragraph here"]
    assert [p for _, _, p in paragraph_spans(text, 22)] == ["one line\nstill one paragraph"]


def test_config_validation():
    with pytest.raises(ValueError, match="num_buckets"):
        ExactDedupConfig(num_buckets=0)


@pytest.mark.parametrize("in_memory_rows, leftovers", [(10_000, []), (0, ["_map", "_reduce"])])
def test_rerun_into_the_same_dir_ignores_the_earlier_runs_map_files(tmp_path, prose, in_memory_rows, leftovers):
    # Run 1's map files sit in the bucket directories the reduce reads whole; before the
    # reset they made run 2's documents "duplicates" of documents run 2 never saw.
    first = {"a": _dataset(tmp_path, "a", [{"text": prose(i)} for i in range(8)])}
    exact_dedup(first, str(tmp_path / "dedup"), ExactDedupConfig(num_buckets=2), in_memory_rows=0)
    second = {"b": _dataset(tmp_path, "b", [{"text": prose(i)} for i in range(4, 12)])}
    reused = exact_dedup(second, str(tmp_path / "dedup"), ExactDedupConfig(num_buckets=2), in_memory_rows=in_memory_rows)
    fresh = exact_dedup(second, str(tmp_path / "fresh"), ExactDedupConfig(num_buckets=2), in_memory_rows=in_memory_rows)
    assert reused == fresh and reused["duplicates"] == 0 and reused["docs"] == 8
    # the in-memory shuffle leaves no _map/_reduce (run 1's are gone), the file shuffle its own
    assert sorted(p.name for p in (tmp_path / "dedup").iterdir()) == ["_counts.json", *leftovers, "b"]
