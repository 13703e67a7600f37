"""The executor's half of switch_architecture: the train/demo phase asset carries its warm start into
the switched model with the spec's transplant mapping and trains that model on from the checkpoint
(a real JAX run of the tiny config)."""

import dataclasses
import math
from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from assets.partitions import demo_phases as phases
from assets.training import train_phase
from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource
from marin_assets.orchestration.training_backends import LocalTrainingBackend, TrainSpec
from marin_assets.phases.plan import PhaseSpec
from marin_assets.train.checkpoints import checkpoint as ckpt
from marin_assets.train.checkpoints.transplant import META_KEY, saved_params
from marin_assets.train.metrics import read_metrics
from marin_assets.train.restore import resolve_checkpoint
from tests.orchestration.phase_job import MIXTURE_CONFIG, TOKENS_PER_STEP, byte_caches, mixture
from tests.support.configs import PHASE_BASE

WARM_STARTS: list[tuple[str, dict, dict]] = []  # (warm start path, its params, its meta) per backend call


class LookingBackend(LocalTrainingBackend):
    """The local backend, after noting what the phase warm-starts from."""

    def run(self, context, spec: TrainSpec):
        if spec.warm_start:
            arrays, meta = ckpt.load(resolve_checkpoint(spec.warm_start))
            WARM_STARTS.append((spec.warm_start, saved_params(arrays), meta))
        return super().run(context, spec)


def _phase(name, warm_from, steps, **changes):
    return PhaseSpec(
        name=name,
        warm_start_from=warm_from,
        schedule="wsd",
        mixture={"sotu": 0.5, "shakespeare": 0.5},
        batch_size=4,
        hardware="cpu",
        token_budget=steps * TOKENS_PER_STEP,
        peak_lr=3e-3,
        **changes,
    )


def _run(instance, resources, spec, warm_version=""):
    config = {"phase": dataclasses.asdict(spec), "base": PHASE_BASE, "warm_start_version": warm_version}
    result = dg.materialize(
        [*byte_caches, mixture, train_phase],
        selection=[train_phase],
        partition_key=spec.name,
        instance=instance,
        resources=resources,
        run_config={"ops": {"train__demo": {"config": config}}},
    )
    assert result.success
    [event] = [e for e in result.get_asset_materialization_events() if e.asset_key.path[0] == "train"]  # not its checkpoints
    return {k: v.value for k, v in event.materialization.metadata.items()}


@pytest.mark.slow
def test_a_switched_phase_transplants_its_warm_start_and_trains_the_new_model_from_it(tmp_path):
    store = ArtifactStoreResource(prefix=str(tmp_path))
    resources = {
        "artifact_store": store,
        "artifact_io": ArtifactIOManager(artifact_store=store),
        "training_backend": LookingBackend(),
    }
    instance = dg.DagsterInstance.ephemeral()
    assert dg.materialize([*byte_caches, mixture], instance=instance, resources=resources, run_config=MIXTURE_CONFIG).success
    instance.add_dynamic_partitions(phases.name, ["kestrel", "jellyfish"])
    WARM_STARTS.clear()

    before = _run(instance, resources, _phase("kestrel", None, 8, model_changes={"qk_norm": False}))
    kestrel = resolve_checkpoint(Path(before["path"], "data"))
    kestrel_params = saved_params(ckpt.load(kestrel)[0])
    switched = _phase("jellyfish", "kestrel", 4, model_changes={"qk_norm": True}, transplant="qk_norm")
    after = _run(instance, resources, switched, before["version"])

    # It trained from kestrel's final checkpoint carried over by the qk_norm mapping: the same weights, new unit gains.
    [(warm, params, meta)] = WARM_STARTS
    assert meta[META_KEY]["mapping"] == "qk_norm" and meta[META_KEY]["source"] == str(kestrel)
    assert meta["config"]["model"]["qk_norm"] is True and meta["step"] == 8
    for name, value in kestrel_params.items():
        expected = np.ones_like(value) if name in ("layers/q_norm", "layers/k_norm") else value
        np.testing.assert_array_equal(params[name], expected, err_msg=name)
    # ... then trained the new model on: the global step continues, its checkpoints have QK-norm.
    assert after["count/final_step"] == 12 and after["count/phase_tokens"] == 4 * TOKENS_PER_STEP
    data = Path(after["path"], "data")
    final_arrays, final_meta = ckpt.load(resolve_checkpoint(data))
    assert final_meta["config"]["model"]["qk_norm"] is True and final_meta["step"] == 12
    assert not np.array_equal(saved_params(final_arrays)["layers/wq"], kestrel_params["layers/wq"])
    assert not (data / "transplanted").exists() and not Path(warm).exists()  # the carried-over copy is not kept
    # The loss right after the switch is near kestrel's (measured: 5.09 before, 4.92 after), well below a fresh
    # model's ln 257 = 5.55 (its logits start near zero).
    first = [r["loss"] for r in read_metrics(data / "metrics.jsonl") if r.get("phase") == "jellyfish"][0]
    last_before = before["count/recent_losses"][-1]
    assert first < math.log(257) - 0.3 and abs(first - last_before) < 0.5


def test_the_phase_reports_its_recent_drop_rates_when_its_metrics_have_them(tmp_path):
    """What the controller's max_drop_rate signal reads: the phase's own rows of the moe/drop_rate column."""
    import json

    from assets.training import _recent

    rows = [
        {"step": 1, "loss": 3.0, "phase": "kestrel", "moe/drop_rate": 0.9},
        {"step": 2, "loss": 2.9, "phase": "ocelot", "moe/drop_rate": 0.1},
        {"step": 3, "loss": 2.8, "phase": "ocelot"},  # a row without the column is left out, not read as 0
        {"step": 4, "loss": 2.7, "phase": "ocelot", "moe/drop_rate": 0.3},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert _recent(str(tmp_path), "ocelot", None) == {"recent_losses": [2.9, 2.8, 2.7], "recent_drop_rates": [0.1, 0.3]}
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "moe/drop_rate"}) + "\n" for r in rows)
    )
    assert _recent(str(tmp_path), "ocelot", None)["recent_drop_rates"] == []  # a dense model: no signal
