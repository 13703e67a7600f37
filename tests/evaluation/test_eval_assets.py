"""The eval assets: eval/demo scores every source's held-out documents (up to docs_per_source
each, Paloma-style domains), eval/demo/tasks scores one task per partition on the run's newest
phase, on request: automation never starts the suite (~10 CPU-minutes per phase here)."""

from __future__ import annotations

import dagster as dg
import pytest

from assets.datakit.datasets import mixture_asset
from assets.evals import EVAL_KEY, TASKS_KEY, eval_phase, eval_task
from assets.partitions import demo_phases
from assets.training import TRAIN_KEY
from marin_assets.orchestration import (
    ArtifactIOManager,
    ArtifactStoreResource,
    StageConfig,
    StageContext,
    versioned,
    versioned_asset,
)
from tests.support.configs import EVAL_CHECKPOINT
from tests.support.datasets import byte_datasets, mixture_run_config

# A dense 64-token model over the byte tokenizer's ids (EOS 256), untrained.
MODEL = dict(EVAL_CHECKPOINT, model=dict(EVAL_CHECKPOINT["model"], vocab_size=257))


class StubPhase(StageConfig):
    step: int = versioned(10)


@versioned_asset(key=TRAIN_KEY, code_version="stub", config_cls=StubPhase, partitions_def=demo_phases, group_name="training")
def stub_train(ctx: StageContext, config: StubPhase):
    """A phase's checkpoint without training: the model at init, saved at the configured step."""
    import jax

    from marin_assets.model import init_params, init_router_bias
    from marin_assets.train.checkpoints import checkpoint as ckpt
    from marin_assets.train.config import config_from_dict, config_to_dict

    config_ = config_from_dict(MODEL)
    state = {"params": init_params(config_.model, jax.random.PRNGKey(0)), "router_bias": init_router_bias(config_.model)}
    ckpt.save(f"{ctx.out_dir}/checkpoints", config.step, state, {"config": config_to_dict(config_), "phase": ctx.partition_key})
    return {"phase": ctx.partition_key}


@versioned_asset(key="tokenizer", code_version="stub")
def stub_tokenizer(ctx: StageContext):
    from marin_assets.datakit.tokenize import byte_tokenizer_json

    with open(f"{ctx.out_dir}/tokenizer.json", "w", encoding="utf-8") as f:
        f.write(byte_tokenizer_json())
    return {"vocab_size": 257}


@pytest.fixture
def resources(tmp_path):
    store = ArtifactStoreResource(prefix=str(tmp_path / "store"))
    return {"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)}


def _train(instance, resources, phase: str, step: int) -> None:
    instance.add_dynamic_partitions(demo_phases.name, [phase])
    dg.materialize(
        [stub_train],
        partition_key=phase,
        instance=instance,
        resources=resources,
        run_config={"ops": {stub_train.op.name: {"config": {"step": step}}}},
    )


def test_eval_phase_scores_up_to_docs_per_source_held_out_documents_of_every_source(resources):
    web = [f"Held-out web page number {i}: the weather is fine and the river runs north." for i in range(300)]
    code = [f"def f{i}(x):\n    return x + {i}\n" for i in range(20)]
    datasets = byte_datasets({"web": (["train text of the web"] * 4, web), "code": (["def g(): pass"] * 4, code)})
    mixture = mixture_asset(["web", "code"])
    instance = dg.DagsterInstance.ephemeral()
    dg.materialize(
        [*datasets, mixture, stub_tokenizer],
        instance=instance,
        resources=resources,
        run_config=mixture_run_config({"web": 0.5, "code": 0.5}),
    )
    _train(instance, resources, "kestrel", 10)
    result = dg.materialize(
        [*datasets, mixture, stub_tokenizer, stub_train, eval_phase],
        selection=[eval_phase],
        partition_key="kestrel",
        instance=instance,
        resources=resources,
    )
    meta = {k: v.value for k, v in result.get_asset_materialization_events()[0].materialization.metadata.items()}
    assert meta["count/docs/web"] == 64 and meta["count/docs/code"] == 20  # 64 by default; all 20 of the smaller one
    for domain in ("web", "code"):
        assert 6.0 < meta[f"count/bpb/{domain}"] < 10.0  # an untrained byte model: near 8 bits per byte
    assert (
        min(meta["count/bpb/web"], meta["count/bpb/code"])
        <= meta["count/micro_bpb"]
        <= max(meta["count/bpb/web"], meta["count/bpb/code"])
    )
    assert meta["count/macro_bpb"] == pytest.approx((meta["count/bpb/web"] + meta["count/bpb/code"]) / 2)
    assert not any(k.startswith("count/acc") for k in meta)  # the task suite has its own partitions


def test_a_task_partition_scores_its_task_on_the_newest_phase(resources):
    instance = dg.DagsterInstance.ephemeral()
    dg.materialize([stub_tokenizer], instance=instance, resources=resources)
    _train(instance, resources, "kestrel", 10)
    _train(instance, resources, "jellyfish", 20)
    assets = [stub_train, stub_tokenizer, eval_task]

    def run(task: str) -> dg.ExecuteInProcessResult:
        return dg.materialize(
            assets,
            selection=[eval_task],
            partition_key=task,
            instance=instance,
            resources=resources,
            run_config={"ops": {eval_task.op.name: {"config": {"limit": 5}}}},
        )

    for task, kind in (("copa", "mc"), ("lambada", "bpb")):
        (event,) = run(task).get_asset_materialization_events()
        meta = {k: v.value for k, v in event.materialization.metadata.items()}
        assert event.partition == task and meta["count/task"] == task
        assert meta["count/phase"] == "jellyfish" and meta["count/step"] == 20 and meta["count/n"] == 5
        assert ("count/acc" in meta) is (kind == "mc") and 4.0 < meta["count/bpb"] < 12.0
    store = resources["artifact_store"].store
    assert store.read_pointer(TASKS_KEY, "copa") is not None and store.read_pointer(EVAL_KEY, "copa") is None


def test_automation_never_starts_the_task_suite(resources):
    """The automation sensor's ticks request no eval/demo/tasks partition, before or after a phase
    lands: the full suite costs ~10 CPU-minutes per phase here, so it runs when asked."""
    defs = dg.Definitions(assets=[stub_train, stub_tokenizer, eval_task], resources=resources)
    instance = dg.DagsterInstance.ephemeral()
    key = dg.AssetKey(TASKS_KEY.split("/"))
    dg.materialize([stub_tokenizer], instance=instance, resources=resources)
    tick = dg.evaluate_automation_conditions(defs=defs, instance=instance)
    instance.add_dynamic_partitions(demo_phases.name, ["kestrel"])
    _train(instance, resources, "kestrel", 10)
    tick = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=tick.cursor)
    assert tick.get_requested_partitions(key) == set()
