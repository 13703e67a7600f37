"""export/demo: a phase's final checkpoint written as a Hugging Face folder whose card names the data it trained on,
its eval results and the frozen prediction that scored it; a model with no exact HF layout fails the step with
export_hf's one-line reason; never automated. The phase is a stand-in that saves an untrained checkpoint
(tests/support/checkpoints.py) with the counts a real phase reports; its eval and the ladder's scored target are
stand-ins with a real one's counts and files."""

import json
from pathlib import Path

import dagster as dg

from assets.datakit.datasets import mixture_asset
from assets.evals import EVAL_KEY
from assets.export import EXPORT_KEY, export_phase
from assets.partitions import demo_phases
from assets.run_plan import TRAIN_KEY
from marin_assets.orchestration import (
    ArtifactIOManager,
    ArtifactStoreResource,
    StageConfig,
    StageContext,
    versioned,
    versioned_asset,
)
from marin_assets.store import ArtifactRef
from tests.hf.support import MIXTRAL_MODEL
from tests.support.checkpoints import save_untrained
from tests.support.configs import TINY_MODEL
from tests.support.datasets import byte_datasets, mixture_run_config

DATASETS = byte_datasets({"sotu": (["s" * 999], []), "shakespeare": (["k" * 1999], [])})
mixture = mixture_asset(["sotu", "shakespeare"])
# Softmax routing, no shared expert: the Mixtral layout holds it exactly. Our own MoE (sigmoid routing, a shared
# expert: TINY_MODEL, ModelConfig's defaults) has no HF counterpart. (The demo's model is Qwen3-MoE-shaped:
# tests/demo/test_demo_export.py exports it.)
EXPORTABLE = dict(MIXTRAL_MODEL, vocab_size=257, max_seq_len=64)
OWN_MOE = dict(TINY_MODEL, vocab_size=257, max_seq_len=64)


class StubPhase(StageConfig):
    exportable: bool = versioned(True)


@versioned_asset(key=TRAIN_KEY, code_version="stub", config_cls=StubPhase, partitions_def=demo_phases)
def stub_phase(ctx: StageContext, config: StubPhase):
    """A phase artifact without training: an untrained checkpoint at step 7 and a real phase's counts."""
    save_untrained(Path(ctx.out_dir), EXPORTABLE if config.exportable else OWN_MOE, {"phase": ctx.partition, "tokens": 896})
    return {
        "phase": ctx.partition,
        "tokens_trained": 896,
        "tokens_consumed": {"sotu": 300, "shakespeare": 596},
        "final_checkpoint": f"{ctx.partition}.000000007",
    }


@versioned_asset(key="tokenizer", code_version="stub")
def stub_tokenizer(ctx: StageContext):
    from marin_assets.datakit.tokenize import byte_tokenizer_json

    Path(ctx.out_dir, "tokenizer.json").write_text(byte_tokenizer_json(), encoding="utf-8")
    return {"vocab_size": 257}


EVALS = {"bpb/sotu": 4.25, "bpb/shakespeare": 4.5, "macro_bpb": 4.375, "docs/sotu": 13}


@versioned_asset(key=EVAL_KEY, code_version="stub", ins={"phase": TRAIN_KEY}, partitions_def=demo_phases)
def stub_eval(ctx: StageContext, phase: ArtifactRef):
    return EVALS


PREDICTION, SCORE = "scaling/moe/main/prediction", "scaling/moe/main/target"
FROZEN = {"loss": 2.75, "frozen_hash": "f" * 64}


@versioned_asset(key=PREDICTION, code_version="stub")
def stub_prediction(ctx: StageContext):
    Path(ctx.out_dir, "prediction.json").write_text(json.dumps({"loss": 2.75, "interval": {"low": 2.5, "high": 3.0}}))
    return FROZEN


SCORED = dg.AssetIn(key=dg.AssetKey(TRAIN_KEY.split("/")), partition_mapping=dg.SpecificPartitionsPartitionMapping(["kestrel"]))


@versioned_asset(key=SCORE, code_version="stub", ins={"run": SCORED})
def stub_score(ctx: StageContext, run: dict):
    """The main run's target as main_run_asset writes it: run.json names the phase artifact it scored."""
    ((_, phase),) = run.items()
    Path(ctx.out_dir, "run.json").write_text(json.dumps({"phase": phase.partition, "version": phase.version}))
    return {
        "validation_loss": 2.875,
        "experiment": "scaling_moe_main_x",
        "frozen_hash": FROZEN["frozen_hash"],
        "phase": phase.partition,
    }


ASSETS = [*DATASETS, mixture, stub_tokenizer, stub_phase, stub_eval, export_phase]


def _export(tmp_path, exportable: bool, scored: bool = False, evaluated: bool = True):
    """(the export's result, the mixture's datasets' versions); ``evaluated``: the phase's eval ran before the
    export; ``scored``: the main run's target scored the phase before it."""
    store = ArtifactStoreResource(prefix=str(tmp_path))
    resources = {"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)}
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(demo_phases.name, ["kestrel"])
    assert dg.materialize(
        [*DATASETS, mixture, stub_tokenizer],
        instance=instance,
        resources=resources,
        run_config=mixture_run_config({"sotu": 0.5, "shakespeare": 0.5}),
    ).success
    assert dg.materialize(
        ASSETS,
        selection=[stub_phase],
        partition_key="kestrel",
        instance=instance,
        resources=resources,
        run_config={"ops": {stub_phase.op.name: {"config": {"exportable": exportable}}}},
    ).success
    if evaluated:
        assert dg.materialize(
            ASSETS, selection=[stub_eval], partition_key="kestrel", instance=instance, resources=resources
        ).success
    if scored:
        assert dg.materialize(
            [*ASSETS, stub_prediction, stub_score],
            selection=[stub_prediction, stub_score],
            instance=instance,
            resources=resources,
        ).success
    result = dg.materialize(
        ASSETS, selection=[export_phase], partition_key="kestrel", instance=instance, resources=resources, raise_on_error=False
    )
    versions = {name: store.store.read_pointer(f"datasets/{name}", None).version for name in ("sotu", "shakespeare")}
    return result, versions


def test_a_phase_final_checkpoint_is_exported_with_its_data_lineage_on_the_card(tmp_path):
    result, versions = _export(tmp_path, exportable=True)
    assert result.success
    [event] = result.get_asset_materialization_events()
    meta = {k: v.value for k, v in event.materialization.metadata.items()}
    assert (meta["count/layout"], meta["count/step"], meta["count/checkpoint"]) == ("mixtral", 7, "kestrel.000000007")
    folder = Path(meta["path"], "data")
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= {p.name for p in folder.iterdir()}
    card = (folder / "README.md").read_text()
    for name, version in versions.items():  # each dataset by its content version
        assert name in card and version[:12] in card
    assert "kestrel" in card and "896" in card
    assert card.count("- phase: kestrel") == 1
    evals = card.split("## Evaluation")[1].split("##")[0]
    assert "- bpb/sotu: 4.25" in evals and "- macro_bpb: 4.375" in evals and "docs/" not in evals
    assert "No prediction was frozen for this run." in card  # nothing scored this phase


def test_the_card_states_the_frozen_prediction_and_its_outcome_when_the_run_was_scored(tmp_path):
    result, _ = _export(tmp_path, exportable=True, scored=True)
    assert result.success
    [event] = result.get_asset_materialization_events()
    card = Path(event.materialization.metadata["path"].value, "data", "README.md").read_text()
    prediction = card.split("## Frozen prediction")[1]
    assert "- predicted: 2.75" in prediction and "- interval: [2.5, 3]" in prediction
    assert "- outcome: 2.875 (error +0.125)" in prediction and "- within the interval: yes" in prediction
    assert "scaling_moe_main_x (hash ffffffffffffffff)" in prediction


def test_a_model_without_an_exact_layout_fails_the_step_in_one_line(tmp_path):
    result, _ = _export(tmp_path, exportable=False)
    assert not result.success
    failure = result.failure_data_for_node(export_phase.op.name)
    description = failure.user_failure_data.description
    assert description.startswith(f"{EXPORT_KEY} kestrel: not exported: ") and "\n" not in description
    assert "shared" in description or "sigmoid" in description  # the field at fault is named


def test_the_export_is_never_automated():
    assert export_phase.automation_conditions_by_key.get(export_phase.key) is None
    assert export_phase.group_names_by_key[export_phase.key] == "models"  # not the phase job's "training" group


def test_a_phase_never_evaluated_is_exported_with_a_card_that_says_so(tmp_path):
    result, _ = _export(tmp_path, exportable=True, evaluated=False)
    assert result.success
    [event] = result.get_asset_materialization_events()
    card = Path(event.materialization.metadata["path"].value, "data", "README.md").read_text()
    assert "No eval results were given to this export." in card and "bpb/" not in card
