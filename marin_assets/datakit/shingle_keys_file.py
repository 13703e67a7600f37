"""One shard's shingle keys on disk: what fuzzy_map computed for the signatures, kept so that
fuzzy_verify compares documents without cleaning and hashing their text again (that was
~40% of the verify's time, and a shard's keys were hashed once per shard that verifies a
pair with it).

Layout (little-endian), the index last so that a map writes it a batch at a time:

    keys     uint32 x total   each row's sorted unique shingle keys (minhash.shingle_keys)
    starts   uint64 x rows    where row r's keys begin, counted in keys
    counts   uint32 x rows    how many keys row r has (0: empty after cleaning)
    rows     uint64
    magic    8 bytes          FILE_MAGIC

A reader takes only the rows it asks for: a local file is memory-mapped, any other is read
by ranges through fsspec. About 4 bytes per character of text (0.7 keys a character).
"""

from __future__ import annotations

import os

import numpy as np

from marin_assets.datakit.shards import local_path

FILE_MAGIC = b"MKSHKEY1"
_TAIL = 16  # rows (uint64) + magic


class ShingleKeysWriter:
    """Writes the keys file of a shard of `rows` rows at `path`; `add` runs in any row order,
    each row at most once; `close` writes the index (rows never added have no keys)."""

    def __init__(self, path: str, rows: int) -> None:
        import fsspec

        fs, p = fsspec.core.url_to_fs(path)
        fs.makedirs(p.rsplit("/", 1)[0], exist_ok=True)
        self._file = fs.open(p, "wb")
        self._starts = np.zeros(rows, np.uint64)
        self._counts = np.zeros(rows, np.uint32)
        self._written = 0

    def add(self, rows: np.ndarray, keys: np.ndarray, starts: np.ndarray) -> None:
        """Row rows[d]'s keys are keys[starts[d]:starts[d + 1]] (the last up to keys.size)."""
        ends = np.r_[starts[1:], keys.size]
        self._starts[rows] = self._written + starts
        self._counts[rows] = ends - starts
        self._file.write(np.ascontiguousarray(keys, dtype="<u4").tobytes())
        self._written += int(keys.size)

    def close(self) -> None:
        index = [self._starts.astype("<u8"), self._counts.astype("<u4"), np.array([self._starts.size], "<u8")]
        for part in index:
            self._file.write(part.tobytes())
        self._file.write(FILE_MAGIC)
        self._file.close()

    def __enter__(self) -> ShingleKeysWriter:
        return self

    def __exit__(self, kind, *_) -> None:
        if kind is None:
            self.close()
        else:
            self._file.close()  # no index: a reader refuses the file (bad magic)


def read_shingle_keys(path: str, rows) -> dict[int, np.ndarray]:
    """{row: its sorted unique uint32 keys} of the given rows of the keys file at `path`.
    ValueError names the file if it is not a complete keys file or lacks a row."""
    rows = sorted({int(r) for r in rows})
    native = local_path(path)
    if native is not None:
        if os.path.getsize(native) < _TAIL:  # np.memmap refuses an empty file without naming it
            _index(path, 0, lambda lo, hi: b"", rows)
        data = np.memmap(native, dtype=np.uint8, mode="r")
        starts, counts, keys_bytes = _index(path, len(data), lambda lo, hi: data[lo:hi].tobytes(), rows)
        keys = data[:keys_bytes].view("<u4")
        return {r: np.asarray(keys[int(starts[r]) : int(starts[r]) + int(counts[r])]) for r in rows}
    import fsspec

    fs, p = fsspec.core.url_to_fs(path)
    with fs.open(p, "rb") as f:

        def read(lo: int, hi: int) -> bytes:
            f.seek(lo)
            return f.read(hi - lo)

        starts, counts, _ = _index(path, fs.size(p), read, rows)
        return {r: np.frombuffer(read(int(starts[r]) * 4, int(starts[r] + counts[r]) * 4), "<u4") for r in rows}


def _index(path: str, size: int, read, rows: list[int]) -> tuple[np.ndarray, np.ndarray, int]:
    """(starts, counts, bytes of keys) of the file at `path` (`size` bytes; read(lo, hi)
    gives its bytes lo to hi)."""
    tail = read(size - _TAIL, size) if size >= _TAIL else b""
    if tail[8:] != FILE_MAGIC:
        raise ValueError(f"{path} is not a complete shingle keys file (no index at its end: a map that did not finish?)")
    count = int(np.frombuffer(tail[:8], "<u8")[0])
    index_at = size - _TAIL - 12 * count
    if index_at < 0 or index_at % 4:
        raise ValueError(f"{path}: its index of {count} rows does not fit the file ({size} bytes)")
    index = read(index_at, size - _TAIL)
    starts = np.frombuffer(index[: 8 * count], "<u8")
    counts = np.frombuffer(index[8 * count :], "<u4")
    if rows and (rows[0] < 0 or rows[-1] >= count):
        raise ValueError(f"{path} has keys of {count} rows, not of row {rows[-1] if rows[-1] >= count else rows[0]}")
    if count and int((starts + counts).max()) * 4 > index_at:
        raise ValueError(f"{path}: a row's keys run past the keys ({index_at} bytes): a damaged file")
    return starts, counts, index_at
