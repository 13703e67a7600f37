"""The demo's release step: its main model (assets/run_plan.py DEMO_BASE.model) maps exactly onto Hugging Face's
qwen3_moe layout, and demo/export.py materialises export/demo for the main run's newest phase through Dagster: a
folder whose config.json is Qwen3-MoE's and whose weights give our model's logits. The phases are stand-ins that
save the demo's model (norms perturbed, tests/hf/support.py) with the counts a real phase reports."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import numpy as np

from assets.export import EXPORT_KEY, export_phase
from assets.partitions import demo_phases
from assets.run_plan import TRAIN_KEY
from assets.train_base import TrainBaseConfig
from marin_assets.orchestration import (
    ArtifactIOManager,
    ArtifactStoreResource,
    StageConfig,
    StageContext,
    versioned,
    versioned_asset,
)
from tests.assets import test_export_asset as stubs  # its datasets, mixture and tokenizer stand-ins
from tests.hf.support import fixed_tokens, our_logits, save_checkpoint
from tests.support.datasets import mixture_run_config

VOCAB = 257  # the stand-in tokenizer's (bytes + EOS)


def demo_model_config():
    """The demo's ModelConfig as train/demo builds it: TrainBaseConfig's defaults (the demo's) through config_from_dict."""
    from marin_assets.train.config import config_from_dict

    base = TrainBaseConfig().model_dump()
    base["model"]["vocab_size"] = VOCAB
    return config_from_dict(base, "base").model


def test_the_demos_model_maps_exactly_onto_qwen3_moe():
    """A shared expert, sigmoid gating or a balancing bias put back into the demo's defaults fails here."""
    from marin_assets.hf.layouts import auto_layout, check_exportable

    config = demo_model_config()
    assert config.is_moe and config.qk_norm and auto_layout(config) == "qwen3_moe"
    check_exportable(config, "qwen3_moe", "the demo's base model (assets/run_plan.py DEMO_BASE)")
    assert config.balancing == "none"  # so router_bias stays zero (check_router_bias refuses any other)


class StubPhase(StageConfig):
    own_moe: bool = versioned(False)  # True: our shared-expert, sigmoid MoE instead of the demo's model


@versioned_asset(key=TRAIN_KEY, code_version="stub", config_cls=StubPhase, partitions_def=demo_phases)
def demo_phase(ctx: StageContext, config: StubPhase):
    """A phase artifact without training: the demo's model at step 7 and a real phase's counts."""
    model = TrainBaseConfig().model_dump()["model"] | {"vocab_size": VOCAB}
    if config.own_moe:
        model |= {"n_shared_experts": 1, "router_gating": "sigmoid", "balancing": "quantile_exact"}
    save_checkpoint(Path(ctx.out_dir), model, seed=len(ctx.partition))  # each phase its own weights
    return {
        "phase": ctx.partition,
        "tokens_trained": 896,
        "tokens_consumed": {"sotu": 300, "shakespeare": 596},
        "final_checkpoint": f"{ctx.partition}.000000007",
    }


def _trained(tmp_path, phases: tuple[str, ...], own_moe: bool = False):
    """(defs, instance) with the stand-in datasets, mixture and tokenizer, and ``phases`` materialised in order, each
    with its eval."""
    store = ArtifactStoreResource(prefix=str(tmp_path))
    resources = {"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)}
    assets = [*stubs.DATASETS, stubs.mixture, stubs.stub_tokenizer, demo_phase, stubs.stub_eval]
    defs = dg.Definitions(assets=[*assets, export_phase], resources=resources)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(str(demo_phases.name), list(phases))
    assert dg.materialize(
        assets[:-2], instance=instance, resources=resources, run_config=mixture_run_config({"sotu": 0.5, "shakespeare": 0.5})
    ).success
    for phase in phases:
        assert dg.materialize(
            assets,
            selection=[demo_phase, stubs.stub_eval],  # each phase is scored, as the phase controller asks
            partition_key=phase,
            instance=instance,
            resources=resources,
            run_config={
                "ops": {dg.AssetKey.from_user_string(TRAIN_KEY).to_python_identifier(): {"config": {"own_moe": own_moe}}}
            },
        ).success
    return defs, instance


def test_the_demo_exports_its_newest_phase_as_qwen3_moe_with_our_logits(tmp_path):
    from safetensors.numpy import load_file

    from demo.export import export_main_run
    from demo.sample import newest_main_phase
    from marin_assets.hf import import_hf
    from marin_assets.train.restore import load_model_from_checkpoint

    defs, instance = _trained(tmp_path, ("kestrel", "jellyfish"))
    export = export_main_run(defs, instance, dg.AssetKey.from_user_string(TRAIN_KEY), demo_phases)
    assert export is not None and "error" not in export, export
    assert (export["phase"], export["layout"], export["step"]) == ("jellyfish", "qwen3_moe", 7)  # what the sample takes
    [run] = instance.get_run_records(dg.RunsFilter(tags={"dagster/partition": "jellyfish"}), limit=1)
    assert run.dagster_run.asset_selection == {dg.AssetKey.from_user_string(EXPORT_KEY)}  # a run of its own

    folder = Path(export["path"])
    hf_config = json.loads((folder / "config.json").read_text())
    assert (hf_config["model_type"], hf_config["architectures"]) == ("qwen3_moe", ["Qwen3MoeForCausalLM"])
    tensors = load_file(str(folder / "model.safetensors"))
    assert sum(t.size for t in tensors.values()) == export["parameters"]
    assert not any("shared_expert" in name for name in tensors)

    newest = newest_main_phase(instance, dg.AssetKey.from_user_string(TRAIN_KEY), demo_phases)
    assert newest is not None and newest[0] == "jellyfish"
    params, config, _, _ = load_model_from_checkpoint(newest[1])
    back, imported = import_hf(folder)
    tokens = fixed_tokens(config.vocab_size, seq=config.max_seq_len)
    ours, exported = our_logits(params, config, tokens), our_logits(back, imported, tokens)
    assert float(np.max(np.abs(ours - exported))) <= 1e-5
    assert float(np.std(ours)) > 0.5  # logits far from uniform: a wrong mapping could not hide in them


def test_a_model_the_export_refuses_comes_back_as_its_one_line_reason(tmp_path):
    """What the demo's summary shows (and fails on) when its main run cannot be exported."""
    from demo.export import export_main_run

    defs, instance = _trained(tmp_path, ("kestrel",), own_moe=True)
    export = export_main_run(defs, instance, dg.AssetKey.from_user_string(TRAIN_KEY), demo_phases)
    assert export is not None and set(export) == {"phase", "error"} and export["phase"] == "kestrel"
    assert export["error"].startswith(f"{EXPORT_KEY} kestrel: not exported: ") and "n_shared_experts" in export["error"]


def test_the_newest_main_phase_is_the_newest_materialised_not_a_planned_one_or_a_branch(tmp_path):
    """A budget cut can leave a phase the plan added but the run never reached; the sample and the export take the
    newest phase that was materialised."""
    from demo.export import export_main_run
    from demo.sample import newest_main_phase

    defs, instance = _trained(tmp_path, ("kestrel", "jellyfish"))
    train = dg.AssetKey.from_user_string(TRAIN_KEY)
    instance.add_dynamic_partitions(str(demo_phases.name), ["starling"])  # planned, never trained
    newest = newest_main_phase(instance, train, demo_phases)
    assert newest is not None and newest[0] == "jellyfish" and Path(newest[1]).is_dir()
    export = export_main_run(defs, instance, train, demo_phases)
    assert export is not None and export["phase"] == "jellyfish"
