"""normalized/<name>: Parquet shards (id = xxh3-128 of the text, rows in input order), with a
quarantine of bad records counted per reason."""

from __future__ import annotations

import dagster as dg

from marin_assets.datakit.normalize import NormalizeConfig as LibNormalizeConfig
from marin_assets.datakit.normalize import normalize
from marin_assets.datakit.sources import SOURCES
from marin_assets.orchestration import StageConfig, StageContext, versioned, versioned_asset
from marin_assets.orchestration.automation import rerun_on_change
from marin_assets.store import ArtifactRef


class NormalizeConfig(StageConfig):
    shard_docs: int = versioned(2000, description="documents per Parquet shard")
    shard_bytes: int = versioned(256 * 1024 * 1024, description="bytes of text per shard (MARIN: ~256 MiB)")


def normalized_asset(name: str) -> dg.AssetsDefinition:
    @versioned_asset(
        key=f"normalized/{name}",
        code_version="2",
        config_cls=NormalizeConfig,
        ins={"raw": f"sources/{name}"},
        group_name="datakit",
        automation_condition=rerun_on_change(),
    )
    def _normalized(ctx: StageContext, config: NormalizeConfig, raw: ArtifactRef):
        lib_config = LibNormalizeConfig(source=name, shard_docs=config.shard_docs, shard_bytes=config.shard_bytes)
        return normalize([raw.data_path], ctx.out_dir, lib_config)

    return _normalized


normalized_assets = [normalized_asset(name) for name in SOURCES]
