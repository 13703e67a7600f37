"""shards/index: every source's raw files split into shard files, one partition per shard.

A factory over the sources it reads ({source name: upstream asset key}), so that a test or
a user's corpus feeds the same graph as the demo's sources/<name> (which need the npm and
pip registries). The body registers the shard keys as datakit_shards partitions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import dagster as dg

from assets.datakit.common import GROUP, REDUCE_TAGS
from assets.datakit.configs import ShardIndexConfig
from marin_assets.datakit.shard_index import split_source
from marin_assets.datakit.shards import check_shard_key, join, write_json
from marin_assets.orchestration import StageContext, versioned_asset
from marin_assets.store import ArtifactRef

INDEX_KEY = "shards/index"
INDEX_FILE = "index.json"


def _index_entries(index: ArtifactRef) -> dict[str, dict]:
    """{shard key: entry} of an index artifact, as its index.json holds them."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(join(index.data_path, INDEX_FILE))
    return json.loads(fs.cat_file(path))


def index_entry(index: ArtifactRef, shard: str) -> dict:
    """{file, sha256, source, bytes, lines} of one shard, with `file` an openable path."""
    entries = _index_entries(index)
    if shard not in entries:
        raise KeyError(f"shard {shard!r} is not in {INDEX_KEY} version {index.version[:16]} ({len(entries)} shards)")
    return {**entries[shard], "file": join(index.data_path, entries[shard]["file"])}


def index_sources(index: ArtifactRef) -> dict[str, str]:
    """{shard key: its source} of an index artifact, sorted by key."""
    entries = _index_entries(index)
    return {key: entries[key]["source"] for key in sorted(entries)}


def index_keys(index: ArtifactRef) -> list[str]:
    """Every shard key of an index artifact, sorted."""
    return sorted(_index_entries(index))


def register_shards(instance: dg.DagsterInstance, keys: list[str], shards: dg.DynamicPartitionsDefinition) -> tuple[int, int]:
    """Make the ``shards`` partitions exactly `keys` (the index is their one authority):
    add the new ones, delete those the index no longer lists; return (added, deleted).

    A removed raw file (or one that shrank by a shard) otherwise stays a partition: a
    backfill over every partition fails on it (the index has no such shard), and the reduces,
    which read every partition, would still dedup against its old map output. The index asset
    calls it after every run, computed or a cache hit (versioned_asset's on_ref), so a fresh
    instance over an existing store gets the partitions too.
    """
    name = shards.name or ""  # a dynamic partitions definition always has one
    have = instance.get_dynamic_partitions(name)  # one query, not one per key
    wanted, registered = {check_shard_key(k) for k in keys}, set(have)
    new = [k for k in keys if k not in registered]
    stale = [k for k in have if k not in wanted]
    if new:
        instance.add_dynamic_partitions(name, new)
    for key in stale:
        instance.delete_dynamic_partition(name, key)
    return len(new), len(stale)


def make_index(sources: Mapping[str, str], shards: dg.DynamicPartitionsDefinition) -> dg.AssetsDefinition:
    """shards/index over `sources` ({source name: asset key whose data holds its raw files}),
    registering its keys as the ``shards`` partitions."""
    for name in sources:
        check_shard_key(name)
    ins = {f"src_{i}": key for i, key in enumerate(sources.values())}
    names = dict(zip(ins, sources))

    def register(ref: ArtifactRef, context: dg.AssetExecutionContext) -> None:
        added, deleted = register_shards(context.instance, index_keys(ref), shards)
        context.log.info(
            f"{INDEX_KEY}: {added} new {shards.name} partitions registered"
            + (f", {deleted} no longer in the index deleted" if deleted else "")
        )

    @versioned_asset(
        key=INDEX_KEY, code_version="2", config_cls=ShardIndexConfig, ins=ins, group_name=GROUP, tags=REDUCE_TAGS, on_ref=register
    )
    def shard_index(ctx: StageContext, config: ShardIndexConfig, **raw: ArtifactRef):
        """Raw source files split into shards of at most shard_bytes; index.json lists them."""
        entries: dict[str, dict] = {}
        for label, ref in raw.items():
            raw_files = [p for p in ref.files() if not p.rsplit("/", 1)[-1].startswith(("_", "."))]
            entries.update(split_source(names[label], raw_files, ctx.out_dir, config.shard_bytes, root=ref.data_path))
        if not entries:
            raise ValueError(f"{INDEX_KEY}: the sources {sorted(sources)} hold no raw files")
        write_json(entries, join(ctx.out_dir, INDEX_FILE))
        ctx.log(f"{len(entries)} shards")
        return {
            "shards": len(entries),
            "bytes": sum(e["bytes"] for e in entries.values()),
            "per_source": {n: sum(e["source"] == n for e in entries.values()) for n in sources},
        }

    return shard_index
