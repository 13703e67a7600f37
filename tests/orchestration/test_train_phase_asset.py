"""The train/<run> phase asset: what it hands the training backend, what it makes of the
outcome, and which mixture it trains on (no JAX: a recording backend stands in)."""

import dataclasses

import dagster as dg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from assets.datakit.datasets import mixture_asset
from assets.partitions import demo_phases
from assets.training import train_phase
from marin_assets.datakit.mixture import Mixture
from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource
from marin_assets.orchestration.resources import training_backend_from_env
from marin_assets.orchestration.training_backends import (
    KubernetesTrainingBackend,
    LocalTrainingBackend,
    ProcessesTrainingBackend,
    TrainingBackend,
    TrainOutcome,
    TrainSpec,
)
from tests.orchestration.phase_job import phase_run_config, phase_spec
from tests.support.datasets import byte_datasets

SEEN: list[tuple[TrainSpec, dict]] = []  # (spec, run tags) per backend call
# One document each, of 5000, 7000 and 3000 tokens with its EOS (the recording backend reads no cache).
DATASETS = byte_datasets({"sotu": (["s" * 4999], []), "shakespeare": (["k" * 6999], []), "spam_assassin": (["x" * 2999], [])})
mixture = mixture_asset(["sotu", "shakespeare", "spam_assassin"])


class RecordingBackend(TrainingBackend):
    """Trains nothing: records the spec and reports 8 steps as a worker would (no metrics.jsonl)."""

    def run(self, context, spec: TrainSpec) -> TrainOutcome:
        SEEN.append((spec, dict(context.run.tags)))
        rows = tuple({"step": s, "loss": 6.0 - 0.25 * s, "phase": spec.config.phase} for s in range(1, 9))
        return TrainOutcome("recording", 8, 8 * 128, 0, 4.0, {"sotu": 4000, "shakespeare": 6500}, {"grad_clipped": 1}, rows)


def _resources(tmp_path):
    store = ArtifactStoreResource(prefix=str(tmp_path))
    return {
        "artifact_store": store,
        "artifact_io": ArtifactIOManager(artifact_store=store),
        "training_backend": RecordingBackend(),
    }


def _mixture(instance, resources, stages):
    config = {"ops": {"mixture": {"config": {"schedule": [{"step": s, "weights": w} for s, w in stages]}}}}
    assert dg.materialize([*DATASETS, mixture], instance=instance, resources=resources, run_config=config).success


def _train(instance, resources, phase: dict, raise_on_error=True):
    SEEN.clear()
    result = dg.materialize(
        [*DATASETS, mixture, train_phase],
        selection=[train_phase],
        partition_key=phase["name"],
        instance=instance,
        resources=resources,
        run_config=phase_run_config(phase),
        raise_on_error=raise_on_error,
        tags={"marin/accelerator": "cpu"},
    )
    if not raise_on_error:
        return result
    [event] = result.get_asset_materialization_events()
    return {k: v.value for k, v in event.materialization.metadata.items()}


@pytest.fixture
def setup(tmp_path):
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(demo_phases.name, ["kestrel", "ocelot"])
    return instance, _resources(tmp_path)


def test_a_phase_without_a_mix_trains_on_the_mixture_asset(setup):
    instance, resources = setup
    stages = [(0, {"sotu": 3.0, "shakespeare": 1.0}), (4, {"shakespeare": 1.0})]
    _mixture(instance, resources, stages)
    phase = {**dataclasses.asdict(phase_spec("kestrel", 8)), "mixture": None}
    meta = _train(instance, resources, phase)
    [(spec, tags)] = SEEN
    assert spec.config.mixture == Mixture(stages)  # the whole schedule, stages and all
    assert spec.config.mixture.weights_at(5) == {"shakespeare": 1.0, "sotu": 0.0}
    assert sorted(spec.caches) == ["shakespeare", "sotu"]  # each a dataset index: its shard caches, read in place
    assert spec.caches["sotu"].endswith("/datasets/sotu/__all__/" + spec.caches["sotu"].split("/")[-3] + "/data/dataset.json")
    assert spec.out_dir.endswith("/.work") and spec.resume is True and spec.warm_start is None
    assert spec.telemetry_run == "demo-kestrel"  # the name the phase controller watches live
    assert tags["marin/accelerator"] == "cpu"  # the run's tags reach the backend
    # The metadata the phase controller reads, from the outcome.
    assert meta["count/backend"] == "recording" and meta["count/final_step"] == 8
    assert meta["count/tokens_trained"] == 8 * 128 and meta["count/phase_tokens"] == 8 * 4 * 32
    assert meta["count/tokens_consumed"] == {"shakespeare": 500, "sotu": 1000}
    # The trained sources as the data position leaves them; spam_assassin, in the mixture but not trained on, whole:
    # the controller can re-warm or cool down onto it.
    assert meta["count/tokens_available"] == {"sotu": 4000, "shakespeare": 6500, "spam_assassin": 3000}
    assert meta["count/recent_losses"] == [6.0 - 0.25 * s for s in range(1, 9)]  # no metrics.jsonl: the reported rows
    assert meta["count/guard_events"] == {"grad_clipped": 1} and meta["count/steps_reported"] == 8
    assert meta["count/stopped_by"] == ""  # ran to the end of its budget


def test_the_phase_own_mix_wins_and_keeps_its_version(setup):
    instance, resources = setup
    _mixture(instance, resources, [(0, {"sotu": 1.0})])
    own = dataclasses.asdict(phase_spec("kestrel", 8, {"sotu": 0.25, "spam_assassin": 0.75}))
    first = _train(instance, resources, own)
    [(spec, _)] = SEEN
    assert spec.config.mixture == Mixture.constant({"sotu": 0.25, "spam_assassin": 0.75})
    assert sorted(spec.caches) == ["sotu", "spam_assassin"]
    from_asset = {**dataclasses.asdict(phase_spec("ocelot", 8)), "mixture": None}
    asset_before = _train(instance, resources, from_asset)

    _mixture(instance, resources, [(0, {"shakespeare": 1.0})])  # a new schedule, a new mixture version
    again = _train(instance, resources, own)
    assert again["version"] == first["version"] and again["cache_hit"] is True and SEEN == []
    asset_after = _train(instance, resources, from_asset)
    assert asset_after["version"] != asset_before["version"] and asset_after["cache_hit"] is False
    assert SEEN[0][0].config.mixture == Mixture.constant({"shakespeare": 1.0})


def test_a_mix_naming_a_source_without_a_cache_is_refused(setup):
    instance, resources = setup
    _mixture(instance, resources, [(0, {"sotu": 1.0})])
    phase = dataclasses.asdict(phase_spec("kestrel", 8, {"sotu": 0.5, "wikipedia": 0.5}))
    result = _train(instance, resources, phase, raise_on_error=False)
    assert not result.success and SEEN == []
    error = result.failure_data_for_node("train__demo").error
    assert "no dataset for ['wikipedia'] in the mixture" in (error.cause or error).message


def test_the_backend_comes_from_the_environment():
    assert isinstance(training_backend_from_env({}), LocalTrainingBackend)
    processes = training_backend_from_env(
        {"MARIN_TRAINING_BACKEND": "processes", "MARIN_TRAIN_PROCESSES": "4", "MARIN_TRAIN_DEVICES_PER_PROCESS": "2"}
    )
    assert isinstance(processes, ProcessesTrainingBackend) and (processes.processes, processes.devices_per_process) == (4, 2)
    assert training_backend_from_env({"MARIN_TRAINING_BACKEND": "processes"}).devices_per_process is None
    kube = training_backend_from_env({"MARIN_TRAINING_BACKEND": "kubernetes", "MARIN_FLEET_FILE": "/etc/fleet.yaml"})
    assert isinstance(kube, KubernetesTrainingBackend) and kube.fleet_file == "/etc/fleet.yaml"
    for env, needle in [
        ({"MARIN_TRAINING_BACKEND": "slurm"}, "MARIN_TRAINING_BACKEND='slurm' is not one of"),
        ({"MARIN_TRAINING_BACKEND": "kubernetes"}, "needs MARIN_FLEET_FILE"),
        ({"MARIN_TRAINING_BACKEND": "processes", "MARIN_TRAIN_PROCESSES": "0"}, "MARIN_TRAIN_PROCESSES='0'"),
        ({"MARIN_TRAINING_BACKEND": "processes", "MARIN_TRAIN_PROCESSES": "2\n"}, "not an integer"),
        ({"MARIN_TRAINING_BACKEND": "processes", "MARIN_TRAIN_DEVICES_PER_PROCESS": "1025"}, "[1, 1024]"),
    ]:
        with pytest.raises(ValueError) as err:
            training_backend_from_env(env)
        assert needle in str(err.value), env


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=8), st.integers(-5, 2000).map(str)))
def test_process_counts_parse_exactly_or_name_the_variable(text):
    env = {"MARIN_TRAINING_BACKEND": "processes", "MARIN_TRAIN_PROCESSES": text}
    try:
        backend = training_backend_from_env(env)
    except ValueError as err:
        assert str(err).startswith("MARIN_TRAIN_PROCESSES=")
        assert not (text.isascii() and text.isdigit() and text[0] != "0" and 1 <= int(text) <= 1024)
    else:
        expected = 2 if text == "" else int(text)
        assert backend.processes == expected and 1 <= expected <= 1024
        assert text == "" or str(expected) == text  # no sign, padding, whitespace or non-ASCII digits
