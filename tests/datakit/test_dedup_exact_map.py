"""The exact-dedup map side: vectorised bucketing and splitting give the per-row answers."""

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from marin_assets.datakit.dedup_exact import ExactDedupConfig, _split_by_bucket, bucket_of, buckets_of, exact_map
from marin_assets.datakit.normalize import doc_id
from marin_assets.datakit.shards import read_row_group, write_table

hexish = st.text(alphabet=st.sampled_from("0123456789abcdefABCDEF"), min_size=8, max_size=40)
odd = st.sampled_from(["0x12abcdef", "12_34_5678", " 1234567a", "+1234567", "ffffffff", "00000000é", "FFFFFFFF00"])


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.one_of(hexish, hexish, odd), max_size=30), num_buckets=st.integers(1, 70000), offset=st.integers(0, 3))
def test_buckets_of_equals_bucket_of_row_by_row(ids, num_buckets, offset):
    array = pa.array(["00000000"] * offset + ids, pa.string()).slice(offset)  # a sliced array: offsets start mid-buffer
    assert buckets_of(array, num_buckets).tolist() == [bucket_of(i, num_buckets) for i in ids]


def test_buckets_of_large_string_and_real_ids():
    ids = [doc_id(f"text {i}") for i in range(500)]
    for kind in (pa.string(), pa.large_string()):
        assert buckets_of(pa.array(ids, kind), 16).tolist() == [bucket_of(i, 16) for i in ids]


def test_split_keeps_table_order_inside_each_bucket():
    import numpy as np

    table = pa.table({"v": list(range(12))})
    buckets = np.array([3, 1, 3, 0, 1, 3, 0, 0, 1, 3, 3, 1])
    parts = _split_by_bucket(table, buckets)
    assert [name for name, _ in parts] == ["bucket-00000", "bucket-00001", "bucket-00003"]
    assert [t.column("v").to_pylist() for _, t in parts] == [[3, 6, 7], [1, 4, 8, 11], [0, 2, 5, 9, 10]]


def test_exact_map_row_groups_hold_each_bucket_in_row_order(tmp_path):
    texts = [f"doc {i % 40}" for i in range(300)]
    table = pa.table({"id": [doc_id(t) for t in texts], "source": ["s"] * 300, "source_id": [str(i) for i in range(300)]})
    shard = str(tmp_path / "part-00000-of-00001.parquet")
    write_table(table, shard)
    counts = exact_map("k", shard, str(tmp_path / "map"), ExactDedupConfig(num_buckets=7))
    assert counts == {"docs": 300}
    seen = []
    for b in range(7):
        part = read_row_group(str(tmp_path / "map" / "docs" / "k.parquet"), f"bucket-{b:05d}")
        expected = [r for r in range(300) if bucket_of(table.column("id")[r].as_py(), 7) == b]
        assert (part.column("row").to_pylist() if part is not None else []) == expected
        seen += expected
    assert sorted(seen) == list(range(300))


def test_an_exact_map_step_does_not_import_pandas(tmp_path):
    import subprocess
    import sys

    texts = [f"doc {i % 5}" for i in range(20)]
    write_table(pa.table({"id": [doc_id(t) for t in texts], "source": ["s"] * 20, "source_id": [str(i) for i in range(20)]}),
                str(tmp_path / "shard.parquet"))  # fmt: skip
    code = (
        "import sys\n"
        "from marin_assets.datakit.dedup_exact import ExactDedupConfig, exact_map\n"
        f"print(exact_map('k', {str(tmp_path / 'shard.parquet')!r}, {str(tmp_path / 'map')!r}, ExactDedupConfig())['docs'],"
        " 'pandas' in sys.modules)\n"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split() == [
        "20",
        "False",
    ]


def _reduce_all(tmp_path, shards: dict[str, list[tuple[str, str]]], label: str) -> list[str]:
    """exact_map every shard ({key: [(text, source_id)]}) and exact_reduce every bucket; the reduce roots."""
    from marin_assets.datakit.dedup_exact import exact_reduce

    config = ExactDedupConfig(num_buckets=4)
    map_root = str(tmp_path / label / "map")
    for key, docs in shards.items():
        path = str(tmp_path / label / f"{key}.parquet")
        write_table(
            pa.table({"id": [doc_id(t) for t, _ in docs], "source": ["s"] * len(docs), "source_id": [i for _, i in docs]}), path
        )
        exact_map(key, path, map_root, config)
    roots = [str(tmp_path / label / f"reduce-{b}") for b in range(4)]
    for b, root in enumerate(roots):
        exact_reduce(b, [map_root], root, config)
    return roots


def test_duplicates_digest_changes_only_for_the_shards_whose_duplicate_rows_change(tmp_path):
    from marin_assets.datakit.dedup_exact import duplicates_digest

    base = {"s-00000": [("alpha", "a1"), ("beta", "a2")], "s-00001": [("gamma", "b1"), ("alpha", "b2")]}
    before = _reduce_all(tmp_path, base, "before")
    # s-00002 copies beta (a later source_id: it is the duplicate) and brings gamma with an
    # EARLIER source_id than s-00001's copy, which becomes the duplicate.
    after = _reduce_all(tmp_path, {**base, "s-00002": [("beta", "c1"), ("gamma", "a0")]}, "after")
    digest = {
        label: {k: duplicates_digest(k, roots) for k in ("s-00000", "s-00001", "s-00002")}
        for label, roots in (("before", before), ("after", after))
    }
    assert digest["before"]["s-00000"] == digest["after"]["s-00000"]  # its rows and their fate unchanged
    assert digest["before"]["s-00001"] != digest["after"]["s-00001"]  # its gamma is now a duplicate
    assert digest["before"]["s-00002"] == digest["before"]["s-00000"] != digest["after"]["s-00002"]  # no rows vs one duplicate


def _bucket_files(root) -> dict[str, bytes]:
    from pathlib import Path

    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(Path(root).rglob("*")) if p.is_file()}


@settings(max_examples=25, deadline=None)
@given(
    shards=st.lists(
        st.lists(
            st.tuples(
                st.sampled_from(["alpha", "beta", "gamma", "delta", "eps"]), st.sampled_from(["a0", "a1", "b0", "b1", "c0"])
            ),
            min_size=1,
            max_size=6,
        ),
        min_size=2,
        max_size=5,
    ),
    earlier=st.sets(st.integers(0, 4), min_size=1),
)
def test_a_reduce_that_reuses_earlier_marks_writes_what_a_full_reduce_writes(shards, earlier):
    """New shards may sort anywhere and their copies may displace an earlier canonical copy."""
    import tempfile

    from marin_assets.datakit.dedup_exact import exact_reduce

    config = ExactDedupConfig(num_buckets=3)
    keys = [f"s-{i:05d}" for i in range(len(shards))]
    old = [k for i, k in enumerate(keys) if i in earlier and i < len(keys) - 1] or keys[:1]
    with tempfile.TemporaryDirectory() as tmp:
        roots = {}
        for key, docs in zip(keys, shards):
            path = f"{tmp}/{key}.parquet"
            write_table(
                pa.table({"id": [doc_id(t) for t, _ in docs], "source": ["s"] * len(docs), "source_id": [i for _, i in docs]}),
                path,
            )
            exact_map(key, path, f"{tmp}/map-{key}", config)
            roots[key] = f"{tmp}/map-{key}"
        for b in range(3):
            exact_reduce(b, [roots[k] for k in keys], f"{tmp}/full-{b}", config)
            exact_reduce(b, [roots[k] for k in old], f"{tmp}/old-{b}", config)
            exact_reduce(b, [roots[k] for k in keys if k not in old], f"{tmp}/reused-{b}", config, reuse=f"{tmp}/old-{b}")
            assert _bucket_files(f"{tmp}/reused-{b}") == _bucket_files(f"{tmp}/full-{b}")


def test_row_group_files_are_compressed_by_their_average_part(tmp_path):
    # Many small parts: zstd's per-column-chunk setup would cost more than it saves, so they
    # go uncompressed even when the file as a whole is big; big parts are compressed.
    import pyarrow as pa
    import pyarrow.parquet as pq

    from marin_assets.datakit.shards import COMPRESS_MIN_BYTES, write_row_groups

    def part(i: int, rows: int):
        return f"p{i}", pa.table({"text": pa.array([f"{i}-{r}-" + "x" * 200 for r in range(rows)])})

    small = [part(i, 20) for i in range(200)]  # ~4 KB each, ~900 KB in all
    big = [part(i, 2000) for i in range(2)]  # ~420 KB each
    assert sum(t.nbytes for _, t in small) > COMPRESS_MIN_BYTES
    for name, parts, codec in (("small", small, "UNCOMPRESSED"), ("big", big, "ZSTD")):
        write_row_groups(parts, str(tmp_path / f"{name}.parquet"))
        meta = pq.ParquetFile(tmp_path / f"{name}.parquet").metadata
        assert meta.num_row_groups == len(parts)
        assert {meta.row_group(g).column(0).compression for g in range(meta.num_row_groups)} == {codec}
        assert read_row_group(str(tmp_path / f"{name}.parquet"), "p1") == parts[1][1]
