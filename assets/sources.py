"""sources/<name>: pinned registry artifacts, sha256-verified and unpacked to raw shards."""

from __future__ import annotations

import dagster as dg

from marin_assets.datakit.sources import SOURCES, materialize_source
from marin_assets.orchestration import StageConfig, StageContext, versioned, versioned_asset
from marin_assets.orchestration.automation import rerun_on_change


class SourceConfig(StageConfig):
    docs_per_shard: int = versioned(1000, description="raw documents per JSONL shard")


def source_asset(name: str) -> dg.AssetsDefinition:
    spec = SOURCES[name]

    @versioned_asset(
        key=f"sources/{name}",
        code_version=f"1-{spec.package}@{spec.version}-{spec.sha256[:12]}",
        config_cls=SourceConfig,
        group_name="datakit",
        description=f"{spec.description} ({spec.registry}: {spec.package}=={spec.version})",
        automation_condition=rerun_on_change(),
    )
    def _source(ctx: StageContext, config: SourceConfig):
        return materialize_source(name, ctx.out_dir, docs_per_shard=config.docs_per_shard)

    return _source


source_assets = [source_asset(name) for name in SOURCES]
