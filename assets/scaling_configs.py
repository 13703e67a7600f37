"""The scaling ladder assets' configs (generated from the library's knobs, marin_assets/knobs.py: one
declaration of each default) and what a ladder run reads of the mixture: its datasets and their versions."""

from __future__ import annotations

import dataclasses

from assets.datakit.datasets import dataset_versions, weighted_sources
from marin_assets.datakit.mixture import read_mixture_file
from marin_assets.orchestration import StageConfig, versioned
from marin_assets.orchestration.knob_configs import library_config, stage_config
from marin_assets.scaling.fits import IsoFlopConfig
from marin_assets.scaling.ladder import SweepSettings
from marin_assets.scaling.lr_sweep import LrSweepSettings
from marin_assets.store import ArtifactRef

DATA_KEY = "mixture"


_SWEEP_KNOBS = [
    "vocab_size",
    "seq_len",
    "batch_sizes",
    "min_steps",
    "tolerance",
    "recipe",
    "lr_base",
    "decay_fraction",
    "skip_sigma",
    "seed",
    "validation_windows",
]


# The configs are generated from the library's knobs (marin_assets/knobs.py): one declaration of each default.
# (A class over the generated one, so type checkers see a class.)
class SweepConfig(stage_config("SweepConfig", (SweepSettings, _SWEEP_KNOBS))):
    """One ladder run's settings (sweep, lr_sweep and target runs): knobs of marin_assets.scaling.ladder.SweepSettings."""


class _LrSweepRuns(StageConfig):
    sweep: SweepConfig = versioned(SweepConfig(), description="the ladder's run settings (its recipe among them)")


class LrSweepConfig(stage_config("LrSweepConfig", (LrSweepSettings, ["lr_factors", "edge_extensions"]), base=_LrSweepRuns)):
    """The ladder's run settings and the LR grid (knobs of marin_assets.scaling.lr_sweep.LrSweepSettings)."""


class _FitSelection(StageConfig):
    fit_budgets: list[str] = versioned([], description="budget labels (e.g. '1e11') to fit; [] = every budget the fit reads")


class FitConfig(stage_config("FitConfig", (IsoFlopConfig, ["huber_delta", "bucket_base", "bootstrap_n"]), base=_FitSelection)):
    """Which budgets to fit, and the knobs of marin_assets.scaling.fits.IsoFlopConfig (bootstrap_n also sets
    the resamples of the predictions' seed intervals)."""


class _PredictionFamily(StageConfig):
    sweep: SweepConfig = versioned(SweepConfig(), description="the run settings the predicted config is planned with")


class PredictionConfig(stage_config("PredictionConfig", (SweepSettings, ["max_width"]), base=_PredictionFamily)):
    """The ladder's run settings and SweepSettings.max_width, the widest member the prediction may pick."""


def ladder_data(mixture: ArtifactRef) -> tuple[dict[str, str], int]:
    """({source: dataset index} of the sources the mixture gives weight, the tokenizer's vocabulary)."""
    _, datasets = read_mixture_file(mixture.data_path)
    return {s: datasets[s]["index"] for s in weighted_sources(mixture)}, int(mixture.counts["vocab_size"])


def run_settings(config: SweepConfig, mixture: ArtifactRef) -> SweepSettings:
    """The library settings of a ladder run, the vocabulary filled from the datasets' tokenizer."""
    settings = library_config(config, SweepSettings)
    return settings if settings.vocab_size else dataclasses.replace(settings, vocab_size=ladder_data(mixture)[1])


def data_version(config, partition: str | None, inputs) -> dict[str, str]:
    """A ladder run reads the datasets the mixture weights (uniformly): their versions, not the
    schedule's weights or the other datasets', version it."""
    return dataset_versions(inputs["mixture"], weighted_sources(inputs["mixture"]))


def target_version(config, partition: str | None, inputs) -> dict[str, str]:
    """A target run is its frozen prediction (the config it runs) on the datasets."""
    return data_version(config, partition, inputs) | {"prediction": inputs["prediction"].version}
