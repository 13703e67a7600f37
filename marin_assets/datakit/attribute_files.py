"""Reading normalized shards and writing co-partitioned attribute files.

A normalized shard is a Parquet file (``part-00000-of-000NN.parquet``) with columns
``id, text, source, source_id, metadata``. An attribute dataset has, for every input shard,
one Parquet file with the same basename holding ``id`` plus the attribute columns, so the
two join row for row without a shuffle. Everything goes through fsspec, so ``gs://``,
``s3://`` and ``memory://`` paths work exactly like local ones.
"""

from __future__ import annotations

import posixpath

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from marin_assets.datakit.shards import read_table


def read_columns(path: str, columns: list[str]) -> pa.Table:
    """Read only ``columns`` of one shard (column projection: never the whole file)."""
    try:
        # shards.read_table, not pq.read_table: its dataset layer imports pandas (about a
        # second of every step process that reads a shard and never needs pandas)
        table = read_table(path, columns=columns)
    except FileNotFoundError:
        raise FileNotFoundError(f"shard not found: {path}") from None
    except (pa.ArrowInvalid, OSError) as e:
        raise ValueError(f"cannot read shard {path}: {e}") from e
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise ValueError(f"shard {path} lacks column(s) {missing}")
    return table


def read_id_text(path: str) -> tuple[list[str], list[str]]:
    """The ``id`` and ``text`` columns of one shard as Python lists."""
    table = read_columns(path, ["id", "text"])
    ids = table.column("id").to_pylist()
    texts = table.column("text").to_pylist()
    for row, (doc_id, text) in enumerate(zip(ids, texts)):
        if doc_id is None or text is None:
            raise ValueError(f"shard {path} row {row}: null id or text")
    return ids, texts


def attribute_path(out_dir: str, shard_path: str) -> str:
    """Where the attribute file of ``shard_path`` lives: same basename, in ``out_dir``."""
    return posixpath.join(out_dir.rstrip("/"), posixpath.basename(shard_path))


def write_table(table: pa.Table, path: str) -> None:
    """Write one Parquet file through fsspec, creating the parent directory if needed."""
    fs, fs_path = fsspec.core.url_to_fs(path)
    parent = posixpath.dirname(fs_path)
    if parent:
        fs.makedirs(parent, exist_ok=True)
    with fs.open(fs_path, "wb") as f:
        pq.write_table(table, f)


def check_unique_basenames(shard_paths: list[str]) -> None:
    """Co-partitioned outputs are keyed by basename, so two inputs may not share one."""
    seen: dict[str, str] = {}
    for p in shard_paths:
        base = posixpath.basename(p)
        if base in seen:
            raise ValueError(f"shards {seen[base]} and {p} share the basename {base!r}")
        seen[base] = p
