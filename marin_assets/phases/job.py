"""One phase -> one training job: what a backend runs for the phase the controller chose.

    data = phase_mixture(values["mixture"], schedule)  # its own mix, else the mixture asset's schedule
    spec = phase_spec(values, data)                    # the phase as the controller sent it
    job = phase_job(spec, base_config(base, vocab), data, datasets, out_dir=scratch, run="demo",
                    attempt=0, warm_start=warm_dir, budget_file=None)
    backend.run(job)

The train asset (assets/training.py) reads the mixture asset and the warm start's artifact, calls
these, and reports what the backend did; everything a phase's job is made of is decided here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from marin_assets.datakit.mixture import Mixture
from marin_assets.phases.plan import PhaseSpec, phase_telemetry_run, phase_train_config
from marin_assets.phases.switch import transplanted_warm_start
from marin_assets.train.budget import load_budget
from marin_assets.train.config import TrainConfig, config_from_dict
from marin_assets.train.spec import TrainSpec

TOKENIZER_VOCAB = 0  # a base config's model.vocab_size that means "the tokenizer's" (the mixture's datasets')


def phase_mixture(own: Mapping[str, float] | None, schedule: Mixture) -> Mixture:
    """What a phase trains on: its own mix when it has one, else the mixture asset's ``schedule``."""
    return Mixture.constant(own) if own is not None else schedule


def phase_spec(values: Mapping[str, Any], schedule: Mixture | None = None) -> PhaseSpec:
    """The PhaseSpec of a phase's config values (``PhaseSpec``'s fields); a phase without a mix of its
    own (``mixture`` None) records the weights of ``schedule``'s first stage (the trainer gets the whole
    schedule: ``phase_mixture``). PhaseSpec checks the values."""
    values = dict(values)
    if values.get("mixture") is None:
        if schedule is None:
            raise ValueError(f"phase {values.get('name')} names no mixture and none was given (the mixture asset's)")
        values["mixture"] = schedule.weights_at(0)
    return PhaseSpec(**values)


def base_config(base: Mapping[str, Any], vocab_size: int) -> TrainConfig:
    """The TrainConfig every phase starts from, from its nested-dict spelling; a model vocabulary of
    ``TOKENIZER_VOCAB`` becomes the tokenizer's ``vocab_size``."""
    model = {k: v for k, v in (base.get("model") or {}).items() if not (k == "vocab_size" and v == TOKENIZER_VOCAB)}
    return config_from_dict({**base, "model": model}, "base", vocab_size=vocab_size)


def phase_job(
    spec: PhaseSpec,
    base: TrainConfig,
    data_mixture: Mixture,
    datasets: Mapping[str, Mapping[str, Any]],
    *,
    out_dir: str,
    run: str,
    attempt: int = 0,
    warm_start: str | None = None,
    budget_file: str | None = None,
) -> TrainSpec:
    """The job of phase ``spec``: ``base`` made the phase's (steps, schedule, context, model changes),
    trained on ``data_mixture`` over the ``datasets`` it weights ({source: {"index", "train_tokens"}}),
    from ``warm_start`` (carried into the phase's architecture when the spec names a transplant) into
    ``out_dir``, its metrics live under the run's phase name. A retry (``attempt`` > 0, a roll-back's)
    draws fresh randomness; a named budget file is read now, so a missing one fails before any compute."""
    data_mixture.check_sources([s for s, d in datasets.items() if d["train_tokens"] > 0], where=f"phase {spec.name}'s mixture")
    config = phase_train_config(base, spec)
    config = dataclasses.replace(config, seed=config.seed + attempt, mixture=data_mixture)
    if spec.warm_start_from is not None and warm_start is None:
        raise ValueError(f"phase {spec.name} warm-starts from {spec.warm_start_from!r} but no warm start was given")
    if spec.transplant and warm_start is not None:  # switch_architecture: the warm start's weights in this model
        warm_start = transplanted_warm_start(warm_start, config, spec.transplant, out_dir)
    if budget_file:
        load_budget(budget_file)
    return TrainSpec(
        config,
        {s: datasets[s]["index"] for s in data_mixture.weighted},
        out_dir,
        resume=True,
        warm_start=warm_start,
        telemetry_run=phase_telemetry_run(run, spec.name),
        budget_file=budget_file or None,
    )
