"""normalized/user: users' own files, one dynamic partition per file.

The new-file sensor (sensors/new_files.py) registers each file as a partition and passes
its sha256 as versioned config, so a file edited in place gets a new version instead of
a stale cache hit; the body re-checks the hash before reading, and refuses a file whose
real path (through a symlink) leaves the directory.
"""

from __future__ import annotations

import os

from assets.partitions import user_files
from marin_assets.datakit.normalize import NormalizeConfig as LibNormalizeConfig
from marin_assets.datakit.normalize import normalize
from marin_assets.orchestration import StageConfig, StageContext, versioned, versioned_asset
from marin_assets.store.fsutil import real_path_inside, sha256_file


class UserFileConfig(StageConfig):
    directory: str = ""  # where the file lives: not versioned (a machine-specific path)
    sha256: str = versioned("", description="content hash of the file, set by the sensor")
    shard_docs: int = versioned(2000)


@versioned_asset(key="normalized/user", code_version="2", config_cls=UserFileConfig, partitions_def=user_files, group_name="user_data")
def normalized_user(ctx: StageContext, config: UserFileConfig):
    """A user's file (.jsonl, .jsonl.gz, .jsonl.zst, .parquet, .txt) normalized to Parquet."""
    try:
        path = real_path_inside(config.directory, ctx.partition_key)
    except ValueError as err:
        raise ValueError(f"user file partition {ctx.partition_key!r} refused: {err}") from None
    if not os.path.isfile(path):
        raise FileNotFoundError(f"user file {path} (partition {ctx.partition_key!r}) does not exist")
    actual = sha256_file(path)
    if config.sha256 and actual != config.sha256:
        raise ValueError(f"user file {path} changed since the sensor saw it (sha256 {actual[:12]} != {config.sha256[:12]}); the next tick picks it up")
    return normalize([path], ctx.out_dir, LibNormalizeConfig(source="user", shard_docs=config.shard_docs))


user_assets = [normalized_user]
