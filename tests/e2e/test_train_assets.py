"""train/demo as a content-versioned asset: a real JAX run, warm starts chained by version."""

import dataclasses
from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from assets.partitions import demo_phases as phases
from assets.training import train_phase
from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource
from marin_assets.orchestration.training_backends import LocalTrainingBackend
from marin_assets.phases.plan import PhaseSpec
from tests.orchestration.phase_job import MIXTURE_CONFIG, TOKENS_PER_STEP, byte_caches, mixture
from tests.support.configs import PHASE_BASE


def _phase(name, warm_from, budget_steps, cooldown=False, mixture=None):
    return PhaseSpec(
        name=name,
        warm_start_from=warm_from,
        schedule="linear_decay" if cooldown else "wsd",
        mixture=mixture or {"sotu": 0.5, "shakespeare": 0.5},
        batch_size=4,
        hardware="cpu",
        token_budget=budget_steps * TOKENS_PER_STEP,
        peak_lr=3e-3,
        is_cooldown=cooldown,
    )


def _resources(tmp_path):
    store = ArtifactStoreResource(prefix=str(tmp_path))
    return {
        "artifact_store": store,
        "artifact_io": ArtifactIOManager(artifact_store=store),
        "training_backend": LocalTrainingBackend(),
    }


def _upstream(instance, resources):
    assert dg.materialize([*byte_caches, mixture], instance=instance, resources=resources, run_config=MIXTURE_CONFIG).success


def _run(assets, instance, resources, spec, warm_version=""):
    config = {"phase": dataclasses.asdict(spec), "base": PHASE_BASE, "warm_start_version": warm_version}
    result = dg.materialize(
        assets,
        selection=[train_phase],
        partition_key=spec.name,
        instance=instance,
        resources=resources,
        run_config={"ops": {"train__demo": {"config": config}}},
    )
    assert result.success
    [event] = [e for e in result.get_asset_materialization_events() if e.asset_key.path[0] == "train"]  # not its checkpoints
    return event.materialization.metadata


@pytest.mark.slow
def test_phases_train_warm_start_and_hit_the_cache(tmp_path):
    resources = _resources(tmp_path)
    assets = [*byte_caches, mixture, train_phase]
    instance = dg.DagsterInstance.ephemeral()
    _upstream(instance, resources)
    instance.add_dynamic_partitions(phases.name, ["kestrel", "jellyfish"])

    first = _run(assets, instance, resources, _phase("kestrel", None, 8))
    assert first["count/final_step"].value == 8 and first["count/tokens_trained"].value == 8 * TOKENS_PER_STEP
    assert first["count/backend"].value == "local" and first["count/steps_reported"].value == 8
    losses = first["count/recent_losses"].value
    assert len(losses) == 8 and all(np.isfinite(losses))
    assert "loss_curve" in first and "moe_telemetry" in first  # PNGs attached: the loss; the MoE drop rate and load
    assert "![MoE telemetry](data:image/png;base64," in first["moe_telemetry"].value
    data = Path(first["path"].value, "data")
    assert (data / "metrics.jsonl").exists() and (data / "loss_curve.png").exists() and list((data / "checkpoints").iterdir())
    assert not Path(first["path"].value, ".work").exists()  # scratch removed after commit

    # The cooldown trains on sotu alone: its tokens_consumed still names shakespeare, which the weights saw before.
    cooldown = _phase("jellyfish", "kestrel", 4, cooldown=True, mixture={"sotu": 1.0})
    second = _run(assets, instance, resources, cooldown, first["version"].value)
    assert second["count/final_step"].value == 12  # global step continues from the warm start
    assert second["count/tokens_trained"].value == 12 * TOKENS_PER_STEP
    assert second["count/phase_tokens"].value == 4 * TOKENS_PER_STEP
    consumed_before, consumed_after = first["count/tokens_consumed"].value, second["count/tokens_consumed"].value
    assert sum(consumed_after.values()) > sum(consumed_before.values())  # data position kept, not reset
    assert consumed_after["shakespeare"] == consumed_before["shakespeare"] > 0  # carried from the warm start
    assert consumed_after["sotu"] > consumed_before["sotu"]
    # Each phase reported its committed checkpoints as it trained; jellyfish warm-started from kestrel's final one.
    reported = instance.get_dynamic_partitions("demo_checkpoints")
    assert reported == ["kestrel.000000004", "kestrel.000000008", "jellyfish.000000012"]
    assert first["count/final_checkpoint"].value == second["count/warm_start_checkpoint"].value == "kestrel.000000008"
    assert second["count/warm_start_checkpoint_version"].value == first["count/final_checkpoint_version"].value

    again = _run(assets, instance, resources, _phase("kestrel", None, 8))
    assert again["cache_hit"].value is True and again["version"].value == first["version"].value

    # The demo's last word: a greedy sample of the newest main phase (jellyfish, not kestrel re-materialised
    # later as a cache hit), through the real decoder on its final checkpoint.
    from demo.sample import sample_main_run

    sample = sample_main_run(instance, train_phase.key, phases, prompt="The ")
    assert sample is not None and (sample["phase"], sample["step"], sample["prompt"]) == ("jellyfish", 12, "The ")
    assert isinstance(sample["completion"], str) and sample["completion"]


def test_a_missing_warm_start_is_a_clear_error(tmp_path):
    resources = _resources(tmp_path)
    instance = dg.DagsterInstance.ephemeral()
    _upstream(instance, resources)
    instance.add_dynamic_partitions(phases.name, ["jellyfish"])
    with pytest.raises(Exception, match="warm start 'kestrel'"):
        _run(
            [*byte_caches, mixture, train_phase], instance, resources, _phase("jellyfish", "kestrel", 4, cooldown=True), "0" * 64
        )
