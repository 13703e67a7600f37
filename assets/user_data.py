"""normalized/user: users' own files, one dynamic partition per file.

The new-file sensor (sensors/new_files.py) registers each file as a partition and passes
its sha256 as versioned config, so a file edited in place gets a new version instead of
a stale cache hit; the body re-checks the hash before reading.
"""

from __future__ import annotations

import os

import dagster as dg

from marin_assets.datakit.normalize import NormalizeConfig as LibNormalizeConfig
from marin_assets.datakit.normalize import normalize
from marin_assets.store.fsutil import sha256_file
from marin_assets.orchestration import StageConfig, StageContext, versioned, versioned_asset

user_files = dg.DynamicPartitionsDefinition(name="user_files")


class UserFileConfig(StageConfig):
    directory: str = ""  # where the file lives: not versioned (a machine-specific path)
    sha256: str = versioned("", description="content hash of the file, set by the sensor")
    shard_docs: int = versioned(2000)


@versioned_asset(key="normalized/user", code_version="1", config_cls=UserFileConfig, partitions_def=user_files, group_name="user_data")
def normalized_user(ctx: StageContext, config: UserFileConfig):
    """A user's file (.jsonl, .jsonl.gz, .jsonl.zst, .parquet, .txt) normalized to Parquet."""
    path = os.path.join(config.directory, ctx.partition_key)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"user file {path} (partition {ctx.partition_key!r}) does not exist")
    actual = sha256_file(path)
    if config.sha256 and actual != config.sha256:
        raise ValueError(f"user file {path} changed since the sensor saw it (sha256 {actual[:12]} != {config.sha256[:12]}); the next tick picks it up")
    return normalize([path], ctx.out_dir, LibNormalizeConfig(source="user", shard_docs=config.shard_docs))


user_assets = [normalized_user]
