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
        # forkserver with dagster preloaded: each step forks in milliseconds instead of
        # re-importing dagster (~3 s of CPU), which dominates a run of cache hits.
        {"max_concurrent": 2, "start_method": {"forkserver": {"preload_modules": ["dagster", "marin_assets.orchestration"]}}}
    ),
    tags=DEMO_TAGS,
    description="The demo asset graph on the embedded default (local files, SQLite, CPU).",
)

all_jobs = [demo_job]
