"""Split a document set into one shard directory per ``source`` (for per-source caches)."""

from __future__ import annotations

from collections.abc import Sequence

from marin_assets.datakit.shards import join, read_table, reset_dir, shard_name, write_table


def split_by_source(shard_paths: Sequence[str], out_dir: str, shard_docs: int = 10_000) -> dict[str, int]:
    """Write ``out_dir/<source>/part-*.parquet`` (rows keep their id order); return docs per source."""
    import pyarrow as pa
    import pyarrow.compute as pc

    tables = [read_table(p, columns=["id", "text", "source"]) for p in shard_paths]
    reset_dir(out_dir)
    if not tables:
        return {}
    table = pa.concat_tables(tables)
    counts: dict[str, int] = {}
    for source in sorted(set(table.column("source").to_pylist())):
        part = table.filter(pc.equal(table.column("source"), source))
        part = part.take(pc.sort_indices(part, [("id", "ascending")]))
        n_shards = max(1, -(-part.num_rows // shard_docs))
        for i in range(n_shards):
            write_table(part.slice(i * shard_docs, shard_docs), join(out_dir, source, shard_name(i, n_shards)))
        counts[source] = part.num_rows
    return counts
