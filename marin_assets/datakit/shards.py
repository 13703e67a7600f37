"""Shard naming and Parquet I/O shared by every DataKit stage (all through fsspec)."""

from __future__ import annotations

import contextlib
import functools
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

SHARD_RE = re.compile(r"part-(\d{5})-of-(\d{5})\.parquet")  # matched whole against a basename
# A shard key names a shard in map/reduce layouts and removal lists (it becomes a file name):
# letters, digits, "._=-", not starting with a dot, at most 200 characters.
SHARD_KEY_RE = re.compile(r"[A-Za-z0-9_=-][A-Za-z0-9._=-]{0,199}")


def shard_name(index: int, total: int) -> str:
    return f"part-{index:05d}-of-{total:05d}.parquet"


def check_shard_key(key: str) -> str:
    """`key` if it is a valid shard key (a full match, so no "/", no newline); else ValueError."""
    if not isinstance(key, str) or not SHARD_KEY_RE.fullmatch(key):
        raise ValueError(f"invalid shard key {key!r}: expected {SHARD_KEY_RE.pattern}")
    return key


def join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *parts])


def basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def list_shards(directory: str) -> list[str]:
    """The part-*-of-*.parquet files directly inside `directory`, sorted, as openable paths."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(directory)
    if not fs.exists(root):
        return []
    names = sorted(p for p in fs.ls(root, detail=False) if SHARD_RE.fullmatch(basename(p)))
    local = (fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]) in ("file", "local")
    return names if local else [fs.unstrip_protocol(p) for p in names]


def local_path(path: str) -> str | None:
    """The OS path of a local file URL (plain path or file://), else None.

    Local files are handed to Arrow as paths: its native I/O reads a Parquet footer and row
    group in ~0.9 ms where the same read through an fsspec file object takes ~1.5 ms, which
    adds up over the many small files of a shuffle.
    """
    if "://" not in path:
        return path
    return path[len("file://") :] if path.startswith("file://") else None


COMPRESS_MIN_BYTES = 256 * 1024


def codec(nbytes: int) -> str:
    """zstd for tables worth compressing. Below COMPRESS_MIN_BYTES it is left off: zstd's
    per-column setup (~0.35 ms a file) is most of the cost of writing the thousands of tiny
    files a shuffle makes (band keys, candidate pairs) and saves a few hundred bytes each."""
    return "zstd" if nbytes >= COMPRESS_MIN_BYTES else "none"


def list_dir(directory: str, prefix: str = "", suffix: str = "") -> list[str]:
    """The entries of `directory` whose names start with `prefix` and end with `suffix`,
    sorted, as openable paths; [] if it does not exist."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(directory)
    if not fs.exists(root):
        return []
    return [
        fs.unstrip_protocol(p) for p in sorted(fs.ls(root, detail=False)) if basename(p).startswith(prefix) and p.endswith(suffix)
    ]


def write_table(table, path: str, row_group_size: int | None = None, compression: str | None = None) -> None:
    """`table` as one Parquet file at `path` (compression: codec() of its size unless given)."""
    import fsspec
    import pyarrow.parquet as pq

    compression = compression or codec(table.nbytes)

    fs, p = fsspec.core.url_to_fs(path)
    fs.makedirs(p.rsplit("/", 1)[0], exist_ok=True)
    native = local_path(path)
    if native is not None:
        pq.write_table(table, native, compression=compression, row_group_size=row_group_size)
        return
    with fs.open(p, "wb") as f:
        pq.write_table(table, f, compression=compression, row_group_size=row_group_size)


@contextlib.contextmanager
def parquet_file(path: str):
    """A pyarrow ParquetFile over `path`: a local file opened by Arrow itself (no Python file
    object in the reads), anything else through fsspec."""
    import fsspec
    import pyarrow.parquet as pq

    native = local_path(path)
    if native is not None:
        yield pq.ParquetFile(native)
        return
    with fsspec.open(path, "rb") as f:
        yield pq.ParquetFile(f)


def read_table(path: str, columns: list[str] | None = None):
    # ParquetFile.read skips pq.read_table's dataset discovery, which dominates on the many
    # small bucket files of a shuffle.
    with parquet_file(path) as pf:
        return pf.read(columns=columns)


ROW_GROUPS_KEY = b"datakit.row_groups"


def write_row_groups(parts, path: str) -> None:
    """Write [(name, table), ...] (same schema) as one Parquet file, one row group per part.

    The names are stored in the schema metadata, so `read_row_group` fetches one part
    without reading the others: a shuffle writes one file per map task instead of one per
    (map task, bucket), and each reduce reads only its row group of every file.
    """
    import contextlib
    import json

    import fsspec
    import pyarrow.parquet as pq

    parts = [(name, t) for name, t in parts if t.num_rows]
    if not parts:
        raise ValueError(f"write_row_groups({path}): nothing to write")
    names = [name for name, _ in parts]
    if len(set(names)) != len(names):
        raise ValueError(f"write_row_groups({path}): repeated part names")
    schema = parts[0][1].schema.with_metadata({ROW_GROUPS_KEY: json.dumps(names).encode()})
    # zstd's setup is per column chunk, so a file of many small row groups (a bucket's rows of
    # each shard) pays it per part: judge the codec by the average part (on a bucket of 65
    # parts of ~50 rows, writing took 19 ms with zstd and 8.6 ms without; reading 8.7 vs 3.1).
    compression = codec(sum(t.nbytes for _, t in parts) // len(parts))
    fs, p = fsspec.core.url_to_fs(path)
    fs.makedirs(p.rsplit("/", 1)[0], exist_ok=True)
    native = local_path(path)
    with (
        fs.open(p, "wb") if native is None else contextlib.nullcontext(native) as f,
        pq.ParquetWriter(f, schema, compression=compression) as writer,
    ):
        for _, t in parts:
            writer.write_table(t.replace_schema_metadata(schema.metadata), row_group_size=t.num_rows)


DOC_ROW_GROUP = 8192  # documents per row group of a shard that others read rows of (the verify)


def read_rows(path: str, rows, columns: list[str] | None = None):
    """Rows `rows` (ints, any order) of a Parquet file, in that order, reading only the row
    groups that hold them: a verify needs a few documents of each partner shard, not the
    whole shard (at 1 GiB shards, a GiB per partner). ValueError names a row out of range."""
    import numpy as np

    rows = np.asarray(rows, dtype=np.int64)
    with parquet_file(path) as pf:
        starts = np.cumsum([0] + [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)])
        if rows.size and (rows.min() < 0 or rows.max() >= starts[-1]):
            bad = int(rows.min()) if rows.min() < 0 else int(rows.max())
            raise ValueError(f"row {bad} of {path}, which has {int(starts[-1])} rows")
        group_of = np.searchsorted(starts, rows, side="right") - 1
        groups = np.unique(group_of)
        table = pf.read_row_groups(groups.tolist(), columns=columns)
    # where each wanted row sits in the concatenation of the groups read
    sizes = starts[groups + 1] - starts[groups]
    offset = np.zeros(len(starts), np.int64)
    offset[groups] = np.cumsum(sizes) - sizes
    return table.take(arrow_array(rows - starts[group_of] + offset[group_of], np.int64))


def read_row_group(path: str, name: str, columns: list[str] | None = None):
    """The part `name` of a file written by write_row_groups, or None if it has no such part."""
    import json

    with parquet_file(path) as pf:
        meta = pf.schema_arrow.metadata or {}
        if ROW_GROUPS_KEY not in meta:
            raise ValueError(f"{path} was not written by write_row_groups (no {ROW_GROUPS_KEY.decode()} metadata)")
        names = json.loads(meta[ROW_GROUPS_KEY])
        if name not in names:
            return None
        table = pf.read_row_group(names.index(name), columns=columns)
    return table.replace_schema_metadata(None)


def read_parts(path: str, name_column: str, columns: list[str] | None = None):
    """Every part of a file written by write_row_groups, with each row's part name in `name_column`."""
    import json

    import pyarrow as pa

    with parquet_file(path) as pf:
        names = json.loads((pf.schema_arrow.metadata or {}).get(ROW_GROUPS_KEY, b"null"))
        if names is None:
            raise ValueError(f"{path} was not written by write_row_groups (no {ROW_GROUPS_KEY.decode()} metadata)")
        table = pf.read(columns=columns).replace_schema_metadata(None)
        sizes = [pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups)]
    labels = pa.array([name for name, n in zip(names, sizes) for _ in range(n)], pa.string())
    return table.append_column(name_column, labels)


def makedirs(path: str) -> None:
    import fsspec

    fs, p = fsspec.core.url_to_fs(path)
    fs.makedirs(p, exist_ok=True)


def copy_file(src: str, dest: str) -> None:
    """Copy one file between any fsspec URLs, 1 MiB at a time (never held whole), making dest's folder."""
    import fsspec

    fs_in, p_in = fsspec.core.url_to_fs(src)
    fs_out, p_out = fsspec.core.url_to_fs(dest)
    fs_out.makedirs(p_out.rsplit("/", 1)[0], exist_ok=True)
    with fs_in.open(p_in, "rb") as fin, fs_out.open(p_out, "wb") as fout:
        for chunk in iter(lambda: fin.read(1 << 20), b""):
            fout.write(chunk)


def write_json(obj, path: str) -> None:
    import json

    import fsspec

    fs, p = fsspec.core.url_to_fs(path)
    fs.makedirs(p.rsplit("/", 1)[0], exist_ok=True)
    text = json.dumps(obj, indent=2, sort_keys=True)  # one write: json.dump writes every token
    with fs.open(p, "w") as f:
        f.write(text)


# pa.array() on numpy and Array.to_numpy() import pandas (about a second of every step
# process that never needs it); these keep the map, reduce and verify steps pandas-free.
def numpy_view(column, dtype) -> np.ndarray:
    """A primitive Arrow column (no nulls) of type `dtype` as numpy, read from its buffer."""
    import numpy as np
    import pyarrow as pa

    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if arr.type != pa.from_numpy_dtype(np.dtype(dtype)) or arr.null_count:
        raise ValueError(f"expected a {np.dtype(dtype)} column without nulls, got {arr.type} with {arr.null_count} nulls")
    if len(arr) == 0:
        return np.zeros(0, dtype)
    return np.frombuffer(arr.buffers()[1], dtype=dtype)[arr.offset : arr.offset + len(arr)]


def arrow_array(values, dtype):
    """A pyarrow Array over a numpy array's buffer (pandas-free)."""
    import numpy as np
    import pyarrow as pa

    values = np.ascontiguousarray(values, dtype=dtype)
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), [None, pa.py_buffer(values)])


def arrow_int64(values):
    return arrow_array(values, "int64")


def read_committed_json(path: str):
    """The JSON of a file inside a committed artifact, read once per process.

    A committed version directory never changes, so planning a range of 10,000 shard
    partitions that each consult the same 16 (or 26) reduce files reads each file once. A
    local file is also keyed by its mtime and size, so a library caller that rewrites a
    scratch directory in place is not served the old content. Do not mutate the result."""
    info = _local_stat(path)
    return _read_json_once(path, None if info is None else (info.st_mtime_ns, info.st_size))


def _local_stat(path: str):
    """os.stat of a local path (None if it does not exist), or None for a remote one: what
    keys the per-process caches of committed files, so a local rewrite is seen."""
    import os

    import fsspec
    from fsspec.implementations.local import LocalFileSystem

    fs, p = fsspec.core.url_to_fs(path)
    if not isinstance(fs, LocalFileSystem):
        return None
    try:
        return os.stat(p)
    except FileNotFoundError:
        return None


@functools.lru_cache(maxsize=1 << 16)
def _read_json_once(path: str, stamp):
    import json

    import fsspec

    fs, p = fsspec.core.url_to_fs(path)
    return json.loads(fs.cat_file(p))


def list_committed_dir(directory: str, prefix: str = "", suffix: str = "") -> tuple[str, ...]:
    """list_dir of a directory inside a committed artifact, listed once per process (and,
    locally, again only if its mtime changes): planning 10,000 shard partitions that each
    consult the same 26 band-range directories lists each once, not once per partition."""
    info = _local_stat(directory)
    return _list_once(directory, prefix, suffix, None if info is None else info.st_mtime_ns)


@functools.lru_cache(maxsize=1 << 16)
def _list_once(directory: str, prefix: str, suffix: str, stamp) -> tuple[str, ...]:
    return tuple(list_dir(directory, prefix, suffix))


def reset_dir(directory: str) -> None:
    """Make `directory` exist and be empty: a stage that owns a directory starts from a clean one.

    Anything an earlier run left there (shards of another shard count, map/reduce buckets,
    attribute files of inputs that no longer exist) would otherwise join this run's output.
    """
    import fsspec

    fs, root = fsspec.core.url_to_fs(directory)
    if fs.exists(root):
        if not fs.isdir(root):
            raise NotADirectoryError(f"output path {directory} exists and is not a directory")
        for p in fs.ls(root, detail=False):
            fs.rm(p, recursive=True)
    fs.makedirs(root, exist_ok=True)
