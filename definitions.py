"""The code location: every asset, job, sensor, schedule and resource of marin-assets.

Layering (tests/test_layering.py): marin_assets/ and kernels/ never import this layer;
sensors never import asset modules (the asset-driving sensors are built here, from the
asset definitions they drive); the demo driver (demo/) imports ``defs`` like user code.
"""

from __future__ import annotations

import dagster as dg

from assets.datakit import WATCHED_SOURCE, code_location_datakit
from assets.datakit.index import INDEX_KEY
from assets.evals import eval_assets, eval_phase
from assets.experiments import experiment_assets
from assets.export import export_assets
from assets.scaling import SCALING_GROUP, scaling_assets, scaling_checks
from assets.scaling_ladders import MOE_LADDER
from assets.train_base import TrainBaseConfig
from assets.training import DEMO_PLAN, train_phase, training_assets
from jobs import PHASE_RETRY_TAGS, all_jobs
from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource, training_backend_from_env
from sensors import LadderWatch, all_schedules, automation, ladder_band_check, phase_controller_sensor, user_shards_sensor

artifact_store = ArtifactStoreResource()

# The ladder watches the main run: the demo's ladder over the main run's MoE family (its sweep's runs,
# which the demo materialises before the main run) gives the expected trajectory at the main run's
# size; the ladder_band check judges each phase in its run and the controller acts on leaving the
# band (LadderWatchSettings.action; default: warn).
ladder_watch = LadderWatch(f"{SCALING_GROUP}/{MOE_LADDER.name}/sweep", MOE_LADDER.keys(), TrainBaseConfig().model.model_dump())
# The one DataKit: pinned demo sources + sources/user (the files of $MARIN_USER_DATA_DIR, empty
# when unset) through the sharded graph to a dataset per source and the mixture.
datakit_assets, datakit_checks = code_location_datakit()
_by_key = {a.key.to_user_string(): a for a in datakit_assets}
_after_index = [
    a
    for a in datakit_assets
    if a.key.to_user_string().startswith(("shards/", "datasets/", "mixture")) and a.key.to_user_string() != INDEX_KEY
]
# New files in the watched directory -> sources/user + shards/index -> a backfill of everything
# after the index (datasets and mixture included), so the next phase trains on them.
new_user_shards = user_shards_sensor(_by_key[f"sources/{WATCHED_SOURCE}"], _by_key[INDEX_KEY], _after_index)
# The demo run's controller: one use of the factory (a user's run is another plan + asset). It reads the
# newest dataset of each source at each decision, so a user's new files are data the next phase can take.
phase_controller = phase_controller_sensor(
    DEMO_PLAN,
    train_phase,
    also=[eval_phase],
    run_tags=PHASE_RETRY_TAGS,
    watch=ladder_watch,
    trainer_checks_budget=True,
    datasets={k.split("/", 1)[1]: k for k in _by_key if k.startswith("datasets/")},
)

defs = dg.Definitions(
    assets=[*datakit_assets, *training_assets, *eval_assets, *export_assets, *scaling_assets, *experiment_assets],
    asset_checks=[*datakit_checks, *scaling_checks, ladder_band_check(train_phase, ladder_watch, DEMO_PLAN.run)],
    jobs=all_jobs,
    sensors=[new_user_shards, phase_controller, automation],
    schedules=all_schedules,
    resources={
        "artifact_store": artifact_store,
        "artifact_io": ArtifactIOManager(artifact_store=artifact_store),
        # Where a train/<run> phase runs: $MARIN_TRAINING_BACKEND (local by default; README).
        "training_backend": training_backend_from_env(),
    },
)
