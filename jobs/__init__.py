"""Asset jobs and their run tags."""

from __future__ import annotations

import dagster as dg

DEMO_TAGS = {"marin/accelerator": "cpu", "marin/priority": "interactive"}

# The whole demo graph in one run; the multiprocess executor runs independent branches
# (one per source) on the cores we have.
demo_job = dg.define_asset_job(
    name="demo",
    selection=dg.AssetSelection.groups("datakit"),
    executor_def=dg.multiprocess_executor.configured(
        # forkserver with the code location's imports preloaded (dagster, scipy, our
        # modules; no jax, which must not be forked): each step forks in milliseconds
        # instead of re-importing ~5 s of CPU, which dominates a run of cache hits.
        {"max_concurrent": 2, "start_method": {"forkserver": {"preload_modules": ["dagster", "marin_assets.orchestration", "assets.datakit", "assets.training", "sensors"]}}}
    ),
    tags=DEMO_TAGS,
    description="The demo asset graph on the embedded default (local files, SQLite, CPU).",
)

# A failed phase run is re-launched by the run-retry daemon (instance `run_retries`) up to
# this many times; the retry resumes from the newest committed checkpoint of the version.
PHASE_RETRY_TAGS = {"dagster/max_retries": "2"}

# One phase of the demo run (train + eval of one dynamic partition); the phase controller
# sensor requests it with the phase spec in its run config.
train_phase_job = dg.define_asset_job(
    name="train_phase",
    selection=dg.AssetSelection.groups("training"),
    tags={"marin/accelerator": "cpu", "marin/priority": "production", **PHASE_RETRY_TAGS},
    description="Train and evaluate one phase of the run (requested by the phase controller).",
)

eval_job = dg.define_asset_job(
    name="evaluate",
    selection=dg.AssetSelection.assets(["eval", "demo"]),
    tags={"marin/accelerator": "cpu", "marin/priority": "batch"},
    description="Re-run the evaluation of one phase checkpoint (a cache hit unless the eval changed).",
)

# Everything in the scaling group: the ladder's data, sweep partitions, fit, prediction (and its check).
scaling_job = dg.define_asset_job("scaling", selection=dg.AssetSelection.groups("scaling"),
                                  description="The IsoFLOP ladder: its data, sweep runs, fit, prediction and check.")

all_jobs = [demo_job, train_phase_job, eval_job, scaling_job]
