"""Shared by the training-backend tests: a tiny spec and a one-asset materialisation."""

import dagster as dg

from marin_assets.orchestration.training_backends import TrainingBackend, TrainSpec
from marin_assets.train.config import config_from_dict
from tests.support.configs import BACKEND_TRAIN


def tiny_spec(out_dir, caches="/data/cache", **kw) -> TrainSpec:
    return TrainSpec(config_from_dict(BACKEND_TRAIN, "tiny"), caches, str(out_dir), **kw)


def materialize_with(backend: TrainingBackend, spec: TrainSpec, *, tags=None, raise_on_error=True, instance=None):
    """Materialise one asset whose body hands ``spec`` to ``backend`` (as the train asset will)."""

    @dg.asset(name="phase")
    def phase(context: dg.AssetExecutionContext, training_backend: TrainingBackend):
        outcome = training_backend.run(context, spec)
        return dg.MaterializeResult(metadata=outcome.metadata())

    return dg.materialize(
        [phase], resources={"training_backend": backend}, tags=tags or {}, raise_on_error=raise_on_error, instance=instance
    )


def step_error_text(result) -> str:
    """The failed step's error and its causes, as one string."""
    failure = result.failure_data_for_node("phase")
    assert failure is not None, "the step did not fail"
    err, parts = failure.error, []
    while err is not None:
        parts.append(err.message)
        err = err.cause
    return "\n".join(parts)
