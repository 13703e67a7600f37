"""The code location: every asset, job, sensor, schedule and resource of marin-assets."""

from __future__ import annotations

import dagster as dg

from assets.normalized import normalized_assets
from assets.sources import source_assets
from jobs import all_jobs
from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource

artifact_store = ArtifactStoreResource()

defs = dg.Definitions(
    assets=[*source_assets, *normalized_assets],
    jobs=all_jobs,
    resources={
        "artifact_store": artifact_store,
        "artifact_io": ArtifactIOManager(artifact_store=artifact_store),
    },
)
