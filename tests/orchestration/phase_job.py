"""A train/demo phase job for fault tests: real byte-level datasets (stand-ins for the
DataKit's), the real `mixture` and `train/demo` assets, and a local backend whose first
attempt dies mid-run.

``phase_job`` is reconstructable (Dagster re-executions load it by name); the store prefix
comes from $MARIN_PREFIX, as in a deployment.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import dagster as dg

from assets.datakit.datasets import mixture_asset
from assets.training import train_phase
from jobs import train_phase_job
from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource
from marin_assets.orchestration.training_backends import LocalTrainingBackend, TrainSpec
from marin_assets.phases.plan import PhaseSpec
from tests.support.configs import PHASE_BASE
from tests.support.datasets import byte_datasets, mixture_run_config

# No time-based checkpoint, however slow the machine: a retry resumes from the step-4 checkpoint.
BASE = dict(PHASE_BASE, checkpoint_every_seconds=3600.0)
TOKENS_PER_STEP = 4 * 32
CRASH_AT_STEP = 6


# Two real byte-level datasets from Python's own text (two shards each: reads cross shard ends).
byte_caches = byte_datasets(
    {
        "sotu": ([json.__doc__] * 6, []),
        "shakespeare": ([dataclasses.__doc__ or "", Path(dataclasses.__file__).read_text()[:20000]], []),
    },
    shards_per_source=2,
)
mixture = mixture_asset(["sotu", "shakespeare"])

# The mixture asset's config for these datasets (its default names a third source).
MIXTURE_CONFIG = mixture_run_config({"sotu": 1.0, "shakespeare": 1.0})


def phase_spec(name: str, steps: int, mixture_weights: dict | None = None) -> PhaseSpec:
    return PhaseSpec(
        name=name,
        warm_start_from=None,
        schedule="wsd",
        mixture=mixture_weights or {"sotu": 0.5, "shakespeare": 0.5},
        batch_size=4,
        hardware="cpu",
        token_budget=steps * TOKENS_PER_STEP,
        peak_lr=3e-3,
    )


def phase_run_config(phase: dict) -> dict:
    return {"ops": {"train__demo": {"config": {"phase": phase, "base": BASE, "warm_start_version": ""}}}}


class DiesOnceBackend(LocalTrainingBackend):
    """The local backend, except that a run's first attempt (no parent run) dies at
    ``crash_at_step`` the way a killed worker does: an exception out of the training loop,
    after the step-4 checkpoint and before the final one."""

    crash_at_step: int = CRASH_AT_STEP

    def run(self, context, spec: TrainSpec):
        if context.run.parent_run_id is not None:
            return super().run(context, spec)
        from marin_assets.train.loop import train

        def die(row: dict) -> None:
            if row["step"] >= self.crash_at_step:
                raise RuntimeError(f"simulated worker death at step {row['step']}")

        train(spec.config, spec.caches, spec.out_dir, resume=spec.resume, warm_start=spec.warm_start, log_fn=die)
        raise AssertionError("the phase finished before the simulated death")


def resources(backend) -> dict:
    store = ArtifactStoreResource()  # $MARIN_PREFIX
    return {"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store), "training_backend": backend}


def phase_job() -> dg.JobDefinition:
    """train/demo alone, with the train_phase job's tags (dagster/max_retries among them)."""
    job = dg.define_asset_job("phase", selection=[train_phase], tags=train_phase_job.tags, executor_def=dg.in_process_executor)
    defs = dg.Definitions(assets=[*byte_caches, mixture, train_phase], jobs=[job], resources=resources(DiesOnceBackend()))
    return defs.resolve_job_def("phase")
