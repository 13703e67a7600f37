"""Asset jobs and their run tags."""

from __future__ import annotations

import dagster as dg

DEMO_TAGS = {"marin/accelerator": "cpu", "marin/priority": "interactive"}

# The DataKit's unpartitioned front in one run: the sources, the fixed inputs (quality model,
# eval n-grams, tokenizer) and the shard index, whose run registers the shard partitions. The
# rest of the graph is partitioned four ways (shards, buckets, bands, none), which no single
# Dagster run covers: a backfill of the `datakit` group (or `make demo`, one run per wave)
# materialises it. The multiprocess executor runs the independent sources on the cores we have.
datakit_sources_job = dg.define_asset_job(
    name="datakit_sources",
    selection=dg.AssetSelection.assets("shards/index", "quality_model", "eval_ngrams", "tokenizer").upstream(),
    executor_def=dg.multiprocess_executor.configured(
        # forkserver with the code location's imports preloaded (dagster, scipy, our
        # modules; no jax, which must not be forked): each step forks in milliseconds
        # instead of re-importing ~5 s of CPU, which dominates a run of cache hits.
        {
            "max_concurrent": 2,
            "start_method": {
                "forkserver": {
                    "preload_modules": ["dagster", "marin_assets.orchestration", "assets.datakit", "assets.training", "sensors"]
                }
            },
        }
    ),
    tags=DEMO_TAGS,
    description="The DataKit's sources, fixed inputs and shard index (a backfill of the datakit group does the rest).",
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
scaling_job = dg.define_asset_job(
    "scaling",
    selection=dg.AssetSelection.groups("scaling"),
    description="The IsoFLOP ladder: its data, sweep runs, fit, prediction and check.",
)

# Every experiment record's assets (experiments/*.yaml): the corpus, run partitions,
# analyses and reports; `marin experiment screen` runs the same steps from the CLI.
experiments_job = dg.define_asset_job(
    "experiments",
    selection=dg.AssetSelection.groups("experiments"),
    description="Experiment records: runs, effective-speedup analysis, reports.",
)

all_jobs = [datakit_sources_job, train_phase_job, eval_job, scaling_job, experiments_job]
