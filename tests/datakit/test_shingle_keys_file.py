"""The shingle keys file fuzzy_map writes and fuzzy_verify reads: any rows back as written,
local (memory-mapped) and through fsspec; an unfinished or damaged file and a row it lacks
are refused by name; the map's keys are the definition's (minhash.shingle_keys)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marin_assets.datakit.fuzzy_dedup import fuzzy_map, shingle_keys_path
from marin_assets.datakit.minhash import shingle_keys
from marin_assets.datakit.shards import write_table
from marin_assets.datakit.shingle_keys_file import ShingleKeysWriter, read_shingle_keys

key_sets = st.lists(st.sets(st.integers(0, 2**32 - 1), max_size=20).map(sorted), min_size=1, max_size=12)


def _write(path: str, rows: list[list[int]], order: list[int], batch: int) -> None:
    """rows[r] added in `order`, `batch` rows to an add (each add's keys concatenated)."""
    with ShingleKeysWriter(path, len(rows)) as writer:
        for at in range(0, len(order), batch):
            picked = order[at : at + batch]
            sizes = [len(rows[r]) for r in picked]
            keys = np.array([k for r in picked for k in rows[r]], np.uint32)
            writer.add(np.array(picked, np.int64), keys, np.cumsum([0, *sizes[:-1]]).astype(np.int64))


@settings(max_examples=60, deadline=None)
@given(rows=key_sets, data=st.data(), where=st.sampled_from(["local", "memory"]))
def test_any_rows_read_back_as_written(tmp_path_factory, rows, data, where):
    order = data.draw(st.permutations(range(len(rows))))
    written = data.draw(st.lists(st.sampled_from(order), unique=True)) if data.draw(st.booleans()) else order
    asked = data.draw(st.lists(st.integers(0, len(rows) - 1), max_size=8))
    root = str(tmp_path_factory.mktemp("keys")) if where == "local" else f"memory://keys-{id(rows)}"
    path = f"{root}/s.bin"
    _write(path, rows, list(written), data.draw(st.integers(1, 4)))
    got = read_shingle_keys(path, asked)
    assert sorted(got) == sorted(set(asked))
    for r in asked:  # a row never added has no keys
        assert got[r].dtype == np.uint32 and got[r].tolist() == (rows[r] if r in written else [])


def test_an_unfinished_file_a_damaged_one_and_a_missing_row_are_refused(tmp_path):
    path = str(tmp_path / "s.bin")
    with pytest.raises(RuntimeError, match="killed"), ShingleKeysWriter(path, 2) as writer:
        writer.add(np.array([0]), np.array([3, 9], np.uint32), np.array([0]))
        raise RuntimeError("killed mid-map")
    with pytest.raises(ValueError, match=r"s\.bin is not a complete shingle keys file"):
        read_shingle_keys(path, [0])
    (tmp_path / "empty.bin").write_bytes(b"")  # a map killed before its first batch
    with pytest.raises(ValueError, match=r"empty\.bin is not a complete shingle keys file"):
        read_shingle_keys(str(tmp_path / "empty.bin"), [0])
    _write(path, [[3, 9], [1]], [0, 1], 2)
    assert read_shingle_keys(path, [1])[1].tolist() == [1]
    with pytest.raises(ValueError, match=r"s\.bin has keys of 2 rows, not of row 2"):
        read_shingle_keys(path, [0, 2])
    data = open(path, "rb").read()
    (tmp_path / "short.bin").write_bytes(data[:4] + data[-16:])  # the index cut off
    with pytest.raises(ValueError, match=r"short\.bin: its index of 2 rows does not fit"):
        read_shingle_keys(str(tmp_path / "short.bin"), [0])


def test_the_map_keeps_each_documents_shingle_keys(tmp_path):
    texts = ["The quick brown fox jumps over the lazy dog.", "!!! ...", "Über naïve café — déjà vu.", "ab", ""]
    texts += [f"document {i} " * (i + 3) for i in range(40)]
    shard = str(tmp_path / "s.parquet")
    write_table(pa.table({"id": [f"d{i}" for i in range(len(texts))], "text": texts}), shard)
    counts = fuzzy_map("s", shard, str(tmp_path / "map"))
    assert counts == {"docs": len(texts), "empty": 2}
    got = read_shingle_keys(shingle_keys_path(str(tmp_path / "map"), "s"), range(len(texts)))
    for row, text in enumerate(texts):
        assert np.array_equal(got[row], shingle_keys(text)), row
    assert got[1].size == 0 and got[4].size == 0 and got[0].size == len(set(got[0].tolist())) > 30
