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


def tokenize_by_source(docs_root: str, sources: Sequence[str], tokenizer_path: str, out_dir: str,
                       validation_fraction: float, log=print) -> dict:
    """Tokenize ``docs_root/<source>/`` into one Levanter cache per source,
    ``out_dir/<source>/{train,validation}``; return {"tokens": {source: {split: n}}, "train_tokens": n}."""
    from marin_assets.datakit.shards import list_shards
    from marin_assets.datakit.tokenize import TokenizeConfig, tokenize

    stats = {}
    for source in sources:
        s = tokenize(list_shards(join(docs_root, source)), tokenizer_path, join(out_dir, source),
                     TokenizeConfig(validation_fraction=validation_fraction))
        stats[source] = {split: s[split]["tokens"] for split in ("train", "validation")}
        log(f"tokenized {source}: {s['train']['documents']} train docs, {stats[source]}")
    return {"tokens": stats, "train_tokens": sum(v["train"] for v in stats.values())}
