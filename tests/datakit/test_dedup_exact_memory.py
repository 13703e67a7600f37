"""Exact dedup's keep rule row by row against the oracle, its group flags, the refusal of a
shard mapped twice, and its memory: a shard's removal list holds its own slice of every
bucket, however many shards there are."""

import random

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marin_assets.datakit.dedup_exact import ExactDedupConfig, _first_flags, exact_map, exact_reduce, exact_removals
from marin_assets.datakit.memory import peak_heap_bytes
from marin_assets.datakit.normalize import doc_id
from marin_assets.datakit.removals import read_removal_list
from marin_assets.datakit.shards import write_table
from tests.datakit.oracle import exact_duplicates
from tests.datakit.test_sharded_dedup import removal_places, run_exact


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


def _write_shards(root, shards: dict[str, list[tuple[str, str, str]]]) -> dict[str, str]:
    """{shard key: path} of shards of (text, source, source_id) rows in the given order."""
    paths = {}
    for key, rows in shards.items():
        paths[key] = str(root / f"{key}.parquet")
        write_table(pa.table({"id": pa.array([doc_id(t) for t, _, _ in rows], pa.string()),
                              "text": pa.array([t for t, _, _ in rows], pa.large_string()),
                              "source": pa.array([s for _, s, _ in rows], pa.string()),
                              "source_id": pa.array([sid for _, _, sid in rows], pa.string())}), paths[key])  # fmt: skip
    return paths


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shards=st.dictionaries(st.sampled_from(["a-00000", "a-00001", "b-00000", "c-00000", "c-00007"]),
                              st.lists(row, max_size=8), min_size=1),
       num_buckets=st.sampled_from([1, 3, 16]))  # fmt: skip
def test_the_keep_rule_row_by_row(tmp_path_factory, shards, num_buckets):
    """Of every text, the copy with the lowest (source, source_id, shard key, row) stays and
    each other copy is listed in its own shard, pointing at that copy: the oracle's answer."""
    root = tmp_path_factory.mktemp("exact")
    out = run_exact(_write_shards(root, shards), str(root / "work"), ExactDedupConfig(num_buckets=num_buckets))
    lists = {k: read_removal_list(v["list"]) for k, v in out.items()}
    docs = [{"id": doc_id(t), "text": t, "source": s, "source_id": sid, "key": key, "row": r}
            for key, rows in shards.items() for r, (t, s, sid) in enumerate(rows)]  # fmt: skip
    assert removal_places(lists) == exact_duplicates(docs)
    assert sum(v["removed"] for v in out.values()) == len(docs) - len({d["text"] for d in docs})


def test_a_shard_mapped_under_two_roots_is_refused(tmp_path):
    # Its rows would meet themselves in the reduce: each copy of itself, silently removed.
    paths = _write_shards(tmp_path / "in", {"a-00000": [("alpha beta gamma", "s", "1"), ("tau", "s", "2")]})
    config = ExactDedupConfig(num_buckets=1)
    for root in ("map1", "map2"):
        exact_map("a-00000", paths["a-00000"], str(tmp_path / root), config)
    with pytest.raises(ValueError, match=r"shard 'a-00000' has map output under two roots: .*map1.* and .*map2"):
        exact_reduce(0, [str(tmp_path / "map1"), str(tmp_path / "map2")], str(tmp_path / "reduce"), config)


DOCS_PER_SHARD = 600
SIZES = (8, 32)


def test_a_removal_list_holds_its_own_slice_whatever_the_number_of_shards(tmp_path):
    """exact_removals reads its shard's row group of each bucket file: its peak heap (numpy +
    Arrow, peak_heap_bytes) is the same at 8 and 32 shards. The control: a bucket's reduce
    holds that bucket of every shard, so 4x the shards cost it about 4x."""
    config = ExactDedupConfig(num_buckets=4)
    rng = random.Random(0)
    maps = []
    for s in range(max(SIZES)):  # a fifth of every shard copies one of 200 shared texts
        texts = [f"shared {rng.randrange(200)}" if rng.random() < 0.2 else f"doc {s} {i}" for i in range(DOCS_PER_SHARD)]
        rows = [(t, "x", f"{s}-{i}") for i, t in enumerate(texts)]
        key = f"s-{s:05d}"
        maps.append(str(tmp_path / "map" / key))
        exact_map(key, _write_shards(tmp_path / "in", {key: rows})[key], maps[-1], config)
    removals, reduces = {}, {}
    for n in SIZES:
        roots = [str(tmp_path / f"reduce-{n}" / str(b)) for b in range(4)]
        reduces[n] = max(peak_heap_bytes(lambda: exact_reduce(b, maps[:n], roots[b], config))[1] for b in range(4))
        exact_removals("s-00000", roots, str(tmp_path / "warm.jsonl"))  # first-call allocations (caches) not counted
        counts, removals[n] = peak_heap_bytes(lambda: exact_removals("s-00000", roots, str(tmp_path / f"list-{n}.jsonl")))
        assert counts["removed"] > 0
    print({"removals": removals, "reduces": reduces})  # the measured figures (-s)
    assert removals[32] <= 1.3 * removals[8], removals
    assert reduces[32] >= 2.5 * reduces[8], reduces
