"""The in-process exact dedup shuffles in memory when the corpus fits: the same attribute
files (byte for byte) and counts as the file shuffle, and the keep rule row by row."""

import hashlib

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marin_assets.datakit.dedup_exact import ExactDedupConfig, _first_flags, exact_dedup
from marin_assets.datakit.normalize import doc_id
from marin_assets.datakit.shards import read_table, write_table


def _first_flags_by_row(values: list) -> list[bool]:
    """The definition: a row starts a group when it differs from the row before it."""
    return [i == 0 or v != values[i - 1] for i, v in enumerate(values)]


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.one_of(st.none(), st.sampled_from(["", "a", "ab", "b", "é"])), max_size=25),
       offset=st.integers(0, 3), split=st.integers(0, 25), large=st.booleans())  # fmt: skip
def test_first_flags_equals_the_row_by_row_definition(values, offset, split, large):
    kind = pa.large_string() if large else pa.string()
    array = pa.array(["x"] * offset + values, kind).slice(offset)  # offsets start mid-buffer
    chunked = pa.chunked_array([array.slice(0, split), array.slice(split)], kind)
    expected = _first_flags_by_row(values)
    assert _first_flags(array).tolist() == expected
    assert _first_flags(chunked).tolist() == expected


TEXTS = ["alpha beta gamma", "delta epsilon", "zeta eta theta iota", "kappa\n\nlambda mu nu xi omicron pi rho sigma", "tau"]
row = st.tuples(st.sampled_from(TEXTS), st.sampled_from(["s", "t"]), st.sampled_from(["1", "2", "10", "x"]))
corpus = st.dictionaries(st.sampled_from(["a", "b", "c"]), st.lists(st.lists(row, max_size=8), min_size=1, max_size=3), min_size=1)


def _write_corpus(root, datasets: dict) -> dict:
    """{dataset: [shard paths]}: shards of (id, text, source, source_id) rows in the given order."""
    paths = {}
    for name, shards in datasets.items():
        paths[name] = []
        for i, rows in enumerate(shards):
            table = pa.table({"id": pa.array([doc_id(t) for t, _, _ in rows], pa.string()),
                              "text": pa.array([t for t, _, _ in rows], pa.large_string()),
                              "source": pa.array([s for _, s, _ in rows], pa.string()),
                              "source_id": pa.array([sid for _, _, sid in rows], pa.string())})  # fmt: skip
            paths[name].append(str(root / name / f"part-{i:05d}-of-{len(shards):05d}.parquet"))
            write_table(table, paths[name][-1])
    return paths


def _files(root) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*.parquet"))
            if not p.relative_to(root).parts[0].startswith("_")}  # fmt: skip


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(datasets=corpus, num_buckets=st.sampled_from([1, 3, 16]), paragraphs=st.booleans())
def test_in_memory_shuffle_writes_what_the_file_shuffle_writes(tmp_path_factory, datasets, num_buckets, paragraphs):
    root = tmp_path_factory.mktemp("corpus")
    paths = _write_corpus(root / "in", datasets)
    config = ExactDedupConfig(num_buckets=num_buckets, paragraphs=paragraphs, min_paragraph_chars=5)
    in_memory = exact_dedup(paths, str(root / "memory"), config)
    through_files = exact_dedup(paths, str(root / "files"), config, in_memory_rows=0)
    assert in_memory == through_files
    has_rows = any(rows for shards in datasets.values() for rows in shards)
    assert (root / "files" / "_map").is_dir() == has_rows and not (root / "memory" / "_map").exists()
    assert _files(root / "memory") == _files(root / "files") and len(_files(root / "memory")) == sum(map(len, paths.values()))

    # The keep rule, row by row: of every text, the copy with the lowest (source, source_id, shard key, row) stays.
    rows = [(t, (s, sid, f"{name}--part-{i:05d}-of-{len(shards):05d}.parquet", r), (name, i, r))
            for name, shards in datasets.items() for i, shard in enumerate(shards) for r, (t, s, sid) in enumerate(shard)]  # fmt: skip
    kept = {min(order for t2, order, _ in rows if t2 == t) for t, _, _ in rows}
    for name, shard_paths in paths.items():
        for i, path in enumerate(shard_paths):
            flags = read_table(str(root / "memory" / name / path.rsplit("/", 1)[1])).column("is_duplicate").to_pylist()
            assert flags == [order not in kept for _, order, where in rows if where[:2] == (name, i)]
    assert in_memory["duplicates"] == len(rows) - len(kept) and in_memory["unique"] == len({t for t, _, _ in rows})


def test_two_shards_with_one_key_are_refused_in_memory(tmp_path):
    paths = _write_corpus(tmp_path / "x", {"a": [[("alpha beta gamma", "s", "1")]]})["a"]
    copy = tmp_path / "y" / "a" / paths[0].rsplit("/", 1)[1]
    copy.parent.mkdir(parents=True)
    copy.write_bytes(open(paths[0], "rb").read())
    with pytest.raises(ValueError, match=r"shards share the key 'a--part-00000-of-00001.parquet'"):
        exact_dedup({"a": [paths[0], str(copy)]}, str(tmp_path / "dedup"), ExactDedupConfig())


@pytest.mark.parametrize("paragraphs", [False, True])
def test_the_shuffle_leaves_memory_past_in_memory_rows(tmp_path, paragraphs):
    rows = [("alpha beta gamma", "s", "1"), ("kappa\n\nlambda mu nu xi omicron pi rho sigma", "s", "2")]
    paths = _write_corpus(tmp_path / "in", {"a": [rows, rows[:1]]})
    config = ExactDedupConfig(paragraphs=paragraphs, min_paragraph_chars=5)
    map_rows = 3 + (4 if paragraphs else 0)  # 3 documents; paragraphs: "alpha.." twice, "kappa", "lambda.."
    results = {}
    for limit in (map_rows, map_rows - 1):
        results[limit] = exact_dedup(paths, str(tmp_path / str(limit)), config, in_memory_rows=limit)
        assert (tmp_path / str(limit) / "_map").exists() == (limit < map_rows)
    assert results[map_rows] == results[map_rows - 1] and results[map_rows]["duplicates"] == 1
    assert results[map_rows]["duplicate_paragraphs"] == (1 if paragraphs else 0)
    assert _files(tmp_path / str(map_rows)) == _files(tmp_path / str(map_rows - 1))
