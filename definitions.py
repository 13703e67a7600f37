"""The code location: every asset, job, sensor, schedule and resource of marin-assets.

Layering (tests/test_layering.py): marin_assets/ and kernels/ never import this layer;
sensors never import asset modules (the asset-driving sensors are built here, from the
asset definitions they drive); the demo driver (demo/) imports ``defs`` like user code.
"""

from __future__ import annotations

import dagster as dg

from assets.datakit import datakit_assets, datakit_checks
from assets.experiments import experiment_assets
from assets.normalized import normalized_assets
from assets.scaling import scaling_assets, scaling_checks
from assets.shards import shard_assets
from assets.shards.user_inputs import watched_source_asset
from assets.sources import source_assets
from assets.training import DEMO_PLAN, eval_phase, train_phase, training_assets
from assets.user_data import normalized_user, user_assets
from jobs import PHASE_RETRY_TAGS, all_jobs
from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource, training_backend_from_env
from sensors import all_schedules, automation, new_files_sensor, phase_controller_sensor, user_shards_sensor

artifact_store = ArtifactStoreResource()

# The demo run's controller: one use of the factory (a user's run is another plan + asset).
phase_controller = phase_controller_sensor(DEMO_PLAN, train_phase, also=[eval_phase], run_tags=PHASE_RETRY_TAGS)
new_user_files = new_files_sensor(normalized_user)
# sources/user: the files of $MARIN_USER_DATA_DIR (empty when unset), one of the sharded graph's
# sources; the sensor feeds new files through the graph, shard partitions included.
user_source = watched_source_asset("user")
shard_index, *shard_steps = shard_assets
new_user_shards = user_shards_sensor(user_source, shard_index, shard_steps)

defs = dg.Definitions(
    assets=[*source_assets, *normalized_assets, *datakit_assets, *user_assets, *training_assets, *scaling_assets,
            *experiment_assets, user_source, shard_index, *shard_steps],
    asset_checks=[*datakit_checks, *scaling_checks],
    jobs=all_jobs,
    sensors=[new_user_files, new_user_shards, phase_controller, automation],
    schedules=all_schedules,
    resources={
        "artifact_store": artifact_store,
        "artifact_io": ArtifactIOManager(artifact_store=artifact_store),
        # Where a train/<run> phase runs: $MARIN_TRAINING_BACKEND (local by default; README).
        "training_backend": training_backend_from_env(),
    },
)
