"""The code location: every asset, job, sensor, schedule and resource of marin-assets."""

from __future__ import annotations

import dagster as dg

from assets.datakit import datakit_assets, datakit_checks
from assets.normalized import normalized_assets
from assets.scaling import scaling_assets, scaling_checks
from assets.sources import source_assets
from assets.training import training_assets
from assets.user_data import user_assets
from jobs import all_jobs
from jobs.demo import DEMO_STEPS  # noqa: F401  (what `marin demo` runs after the data job)
from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource
from sensors import all_schedules, all_sensors

artifact_store = ArtifactStoreResource()

defs = dg.Definitions(
    assets=[*source_assets, *normalized_assets, *datakit_assets, *user_assets, *training_assets, *scaling_assets],
    asset_checks=[*datakit_checks, *scaling_checks],
    jobs=all_jobs,
    sensors=all_sensors,
    schedules=all_schedules,
    resources={
        "artifact_store": artifact_store,
        "artifact_io": ArtifactIOManager(artifact_store=artifact_store),
    },
)
