"""The executor's half of ``switch_architecture``: a phase whose spec names a ``transplant`` mapping
starts from its warm start's weights carried into its own model (marin_assets/train/checkpoints/transplant.py).

    warm = transplanted_warm_start(warm, train_config, spec.transplant, scratch)
    train(train_config, caches, scratch, resume=True, warm_start=warm)
    drop_transplanted(scratch)

The transplanted checkpoint is written next to the trainer's own checkpoints in the phase's scratch
dir, which survives a killed attempt: a retry reuses it (once the phase saved a checkpoint of its own
the trainer resumes from that and never reads it). It is removed before the scratch dir becomes the
artifact, so a switched phase's artifact holds what every phase's does.
"""

from __future__ import annotations

import os

from marin_assets.store.fsutil import child, filesystem

TRANSPLANTED = "transplanted"  # the scratch dir's sub-folder holding the carried-over checkpoint


def transplanted_warm_start(warm_start: str, config, mapping: str, scratch_dir: str) -> str:
    """The folder under ``scratch_dir`` holding ``warm_start``'s newest checkpoint carried by ``mapping`` into
    ``config``'s model (a TrainConfig), written unless an earlier attempt already wrote it in full."""
    from marin_assets.train.checkpoints import checkpoint as ckpt  # deferred (import cost): jax
    from marin_assets.train.checkpoints.transplant import transplant  # deferred (import cost): jax, optax

    work = os.fspath(child(scratch_dir, TRANSPLANTED))
    if ckpt.latest_valid(child(work, "checkpoints")) is not None:
        return work
    fs, path = filesystem(work)
    if fs.exists(path):  # an attempt killed mid-write: transplant refuses a folder with checkpoints in it
        fs.rm(path, recursive=True)
    transplant(warm_start, config, mapping, work)
    return work


def drop_transplanted(scratch_dir: str) -> None:
    """Remove the carried-over checkpoint from a phase's scratch dir (the phase trained from it)."""
    fs, path = filesystem(os.fspath(child(scratch_dir, TRANSPLANTED)))
    if fs.exists(path):
        fs.rm(path, recursive=True)
