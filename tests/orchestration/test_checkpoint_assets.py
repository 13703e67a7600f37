"""checkpoints/demo: train/demo reports each committed checkpoint as a partition of the checkpoint asset, with a
data version chained to its parent's; never an uncommitted one, never one twice (real train/demo and mixture
assets; a backend that writes real, tiny checkpoints instead of training)."""

import dataclasses
import json
from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from assets.datakit.datasets import mixture_asset
from assets.partitions import CheckpointsOfPhase, FinalCheckpointOfPhase, NewestMainPhase, demo_checkpoints, demo_phases
from assets.training import train_phase
from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource
from marin_assets.orchestration.checkpoint_assets import LEDGER, checkpoint_key, split_checkpoint_key
from marin_assets.orchestration.compat import DATA_VERSION_TAG
from marin_assets.orchestration.training_backends import TrainingBackend, TrainOutcome, TrainSpec
from tests.orchestration.phase_job import phase_run_config, phase_spec
from tests.support.datasets import byte_datasets, mixture_run_config

DATASETS = byte_datasets({"sotu": (["s" * 4999], []), "shakespeare": (["k" * 6999], [])})
mixture = mixture_asset(["sotu", "shakespeare"])
CHECKPOINTS = dg.AssetKey(["checkpoints", "demo"])


class CommittingBackend(TrainingBackend):
    """Commits real checkpoints at steps 4 and 8 (a loss row before each, as the trainer syncs metrics first)
    and leaves a step-12 folder that never commits; announces each commit unless ``announce`` is off (a
    backend behind Pipes), and dies after committing ``die_after`` (a killed attempt) when set."""

    announce: bool = True
    die_after: int = 0

    def run(self, context, spec: TrainSpec) -> TrainOutcome:
        return self.run_announcing(context, spec, lambda folder, step: None)

    def run_announcing(self, context, spec: TrainSpec, on_checkpoint) -> TrainOutcome:
        from marin_assets.train.checkpoints import checkpoint as ckpt

        root = Path(spec.out_dir) / "checkpoints"
        root.mkdir(parents=True, exist_ok=True)
        for step in (4, 8):
            with open(Path(spec.out_dir) / "metrics.jsonl", "a") as f:
                f.write(json.dumps({"step": step, "loss": 6.0 - step / 4, "phase": spec.config.phase}) + "\n")
            folder = ckpt.save(root, step, {"w": np.full(2, float(step))}, {"tokens": step * 128, "phase": spec.config.phase})
            if self.announce:
                on_checkpoint(folder, step)
            if step == self.die_after:
                raise RuntimeError(f"simulated worker death after step {step}")
        (root / "step-000000012").mkdir()  # a save killed before its marker
        (root / "step-000000012" / "meta.json").write_text(json.dumps({"step": 12, "tokens": 12 * 128}))
        return TrainOutcome("committing", 8, 8 * 128, 0, 4.0, {}, {})


@pytest.fixture
def setup(tmp_path):
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(demo_phases.name, ["kestrel", "jellyfish"])
    store = ArtifactStoreResource(prefix=str(tmp_path))
    resources = {"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)}
    config = mixture_run_config({"sotu": 1.0, "shakespeare": 1.0})
    assert dg.materialize([*DATASETS, mixture], instance=instance, resources=resources, run_config=config).success
    return instance, resources


def _phase(instance, resources, backend, phase: dict, warm_start_version: str = "", attempt: int = 0):
    config = phase_run_config(phase)
    config["ops"]["train__demo"]["config"].update(warm_start_version=warm_start_version, attempt=attempt)
    result = dg.materialize(
        [*DATASETS, mixture, train_phase],
        selection=[train_phase],
        partition_key=phase["name"],
        instance=instance,
        resources={**resources, "training_backend": backend},
        run_config=config,
        raise_on_error=False,
    )
    records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=CHECKPOINTS), limit=100, ascending=True).records
    reported = [r.asset_materialization for r in records if r.run_id == result.run_id]  # a failed step's too
    phase_meta = {
        k: v.value
        for e in result.get_asset_materialization_events()
        if e.asset_key == train_phase.key
        for k, v in e.materialization.metadata.items()
    }
    return result, reported, phase_meta


def _versions(reported) -> dict[str, str]:
    return {m.partition: m.tags[DATA_VERSION_TAG] for m in reported}


@pytest.mark.parametrize("announce", [True, False], ids=["live", "scanned"])
def test_committed_checkpoints_are_reported_as_partitions_whose_versions_chain(setup, announce):
    instance, resources = setup
    kestrel = dataclasses.asdict(phase_spec("kestrel", 8))
    result, reported, meta = _phase(instance, resources, CommittingBackend(announce=announce), kestrel)
    assert result.success
    # The step-12 folder never committed: no partition, no event.
    assert [m.partition for m in reported] == ["kestrel.000000004", "kestrel.000000008"]
    assert instance.get_dynamic_partitions(demo_checkpoints.name) == ["kestrel.000000004", "kestrel.000000008"]
    first, second = ({k: v.value for k, v in m.metadata.items()} for m in reported)
    assert first == {
        "phase": "kestrel",
        "step": 4,
        "path": "checkpoints/step-000000004",
        "tokens": 512,
        "kind": "permanent",
        "loss": 5.0,
        "version": reported[0].tags[DATA_VERSION_TAG],
        "parent_checkpoint": "",
    }
    assert second["parent_checkpoint"] == "kestrel.000000004" and second["loss"] == 4.0
    versions = _versions(reported)
    assert len(set(versions.values())) == 2 and all(len(v) == 64 for v in versions.values())
    assert meta["count/final_checkpoint"] == "kestrel.000000008" and meta["count/warm_start_checkpoint"] == ""
    assert meta["count/final_checkpoint_version"] == versions["kestrel.000000008"]
    # The phase artifact keeps what it reported: step 8's parent is step 4's version.
    ledger = json.loads(Path(meta["path"], "data", LEDGER).read_text())
    assert ledger["kestrel.000000008"]["parent"] == versions["kestrel.000000004"]
    assert ledger["kestrel.000000004"]["parent"] == ""


def test_a_warm_start_chains_to_its_source_final_checkpoint_and_a_changed_parent_changes_the_child(setup):
    instance, resources = setup
    jellyfish = {**dataclasses.asdict(phase_spec("jellyfish", 8)), "warm_start_from": "kestrel"}
    children = []
    for attempt in (0, 1):  # two versions of kestrel (a roll-back's retry draws fresh randomness)
        _, parents, kestrel_meta = _phase(
            instance, resources, CommittingBackend(), dataclasses.asdict(phase_spec("kestrel", 8)), attempt=attempt
        )
        result, reported, meta = _phase(instance, resources, CommittingBackend(), jellyfish, kestrel_meta["version"])
        assert result.success and [m.partition for m in reported] == ["jellyfish.000000004", "jellyfish.000000008"]
        assert meta["count/warm_start_checkpoint"] == "kestrel.000000008"
        assert meta["count/warm_start_checkpoint_version"] == _versions(parents)["kestrel.000000008"]
        ledger = json.loads(Path(meta["path"], "data", LEDGER).read_text())
        assert ledger["jellyfish.000000004"]["parent"] == _versions(parents)["kestrel.000000008"]
        children.append(_versions(reported))
    # Same jellyfish config and data; only the parent differs, and with it every checkpoint down the chain.
    assert all(children[0][key] != children[1][key] for key in children[0])


def test_a_resumed_attempt_reports_each_checkpoint_once(setup):
    instance, resources = setup
    kestrel = dataclasses.asdict(phase_spec("kestrel", 8))
    killed, first, _ = _phase(instance, resources, CommittingBackend(die_after=4), kestrel)
    assert not killed.success and [m.partition for m in first] == ["kestrel.000000004"]
    # The retry runs in the same version's scratch dir: step 4 is announced again but not reported again.
    resumed, second, _ = _phase(instance, resources, CommittingBackend(), kestrel)
    assert resumed.success and [m.partition for m in second] == ["kestrel.000000008"]
    records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=CHECKPOINTS), limit=10).records
    assert sorted(r.partition_key for r in records) == ["kestrel.000000004", "kestrel.000000008"]


def test_a_resumed_attempt_first_reports_what_its_killed_predecessor_committed(setup):
    instance, resources = setup
    kestrel = dataclasses.asdict(phase_spec("kestrel", 8))
    killed, first, _ = _phase(instance, resources, CommittingBackend(announce=False, die_after=8), kestrel)
    assert not killed.success and first == []  # died before any report
    resumed, second, meta = _phase(instance, resources, CommittingBackend(), kestrel)
    assert [m.partition for m in second] == ["kestrel.000000004", "kestrel.000000008"]  # in step order: the chain holds
    ledger = json.loads(Path(meta["path"], "data", LEDGER).read_text())
    assert ledger["kestrel.000000008"]["parent"] == ledger["kestrel.000000004"]["version"]


def test_checkpoint_keys_are_store_safe_and_parse_back():
    assert checkpoint_key("jellyfish+sft", 48) == "jellyfish+sft.000000048"
    assert split_checkpoint_key("jellyfish+sft.000000048") == ("jellyfish+sft", 48)
    for bad in ("kestrel", "kestrel.48", ".000000048", "kestrel.00000004x"):
        with pytest.raises(ValueError, match="not a checkpoint partition key"):
            split_checkpoint_key(bad)
    with pytest.raises(ValueError, match="invalid checkpoint partition key"):
        checkpoint_key("a/b", 1)


def _up(mapping, downstream_def, upstream_def, keys, instance) -> list[str]:
    asked = downstream_def.empty_subset().with_partition_keys(keys)
    result = mapping.get_upstream_mapped_partitions_result_for_partitions(
        asked, downstream_def, upstream_def, dynamic_partitions_store=instance
    )
    return sorted(result.partitions_subset.get_partition_keys())


def _down(mapping, upstream_def, downstream_def, keys, instance) -> list[str]:
    given = upstream_def.empty_subset().with_partition_keys(keys)
    found = mapping.get_downstream_partitions_for_partitions(
        given, upstream_def, downstream_def, dynamic_partitions_store=instance
    )
    return sorted(found.get_partition_keys())


def test_a_phase_reads_its_final_checkpoint_and_a_checkpoint_comes_from_its_phase():
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(demo_phases.name, ["kestrel", "jellyfish", "jellyfish+sft"])
    checkpoints = ["kestrel.000000004", "kestrel.000000008", "jellyfish.000000012", "jellyfish+sft.000000014"]
    instance.add_dynamic_partitions(demo_checkpoints.name, checkpoints)
    final = FinalCheckpointOfPhase()  # eval/demo, export/demo <- checkpoints/demo
    assert _up(final, demo_phases, demo_checkpoints, ["kestrel"], instance) == ["kestrel.000000008"]
    assert _up(final, demo_phases, demo_checkpoints, ["kestrel", "jellyfish+sft"], instance) == [
        "jellyfish+sft.000000014",
        "kestrel.000000008",
    ]
    assert _down(final, demo_checkpoints, demo_phases, ["kestrel.000000004"], instance) == []  # not kestrel's final
    assert _down(final, demo_checkpoints, demo_phases, ["kestrel.000000008"], instance) == ["kestrel"]
    of_phase = CheckpointsOfPhase()  # checkpoints/demo <- train/demo
    assert _up(of_phase, demo_checkpoints, demo_phases, ["kestrel.000000004"], instance) == ["kestrel"]
    assert _down(of_phase, demo_phases, demo_checkpoints, ["kestrel"], instance) == ["kestrel.000000004", "kestrel.000000008"]
    # eval/demo/tasks scores the newest main phase's final checkpoint: the last-added one that is not a branch's.
    tasks = dg.StaticPartitionsDefinition(["copa"])
    assert _up(NewestMainPhase(), tasks, demo_checkpoints, ["copa"], instance) == ["jellyfish.000000012"]


def test_the_lineage_of_an_export_and_an_eval_reaches_a_checkpoint_and_through_it_the_shards():
    from definitions import defs

    graph = defs.resolve_asset_graph()

    def parents(key: str) -> set[str]:
        return {k.to_user_string() for k in graph.get(dg.AssetKey(key.split("/"))).parent_keys}

    assert parents("checkpoints/demo") == {"train/demo"}
    assert {"checkpoints/demo", "train/demo", "tokenizer", "mixture"} <= parents("export/demo")
    assert "checkpoints/demo" in parents("eval/demo") and "checkpoints/demo" in parents("eval/demo/tasks")
    upstream, todo = set(), ["checkpoints/demo"]
    while todo:
        for parent in parents(todo.pop()) - upstream:
            upstream.add(parent)
            todo.append(parent)
    assert {"train/demo", "mixture", "shards/tokenized", "shards/index"} <= upstream
    assert any(key.startswith("sources/") for key in upstream)


def test_retention_at_phase_end_deletes_all_but_the_last_n_and_the_final_and_says_so(setup):
    """keep_last_checkpoints=1: the phase keeps its final checkpoint (step 8) and the never-committed step-12
    folder (not a checkpoint: left alone), deletes step 4, names it in its metadata and marks it in the ledger."""
    from assets.training import PhaseConfig

    instance, resources = setup
    kestrel = dataclasses.asdict(phase_spec("kestrel", 8))
    config = phase_run_config(kestrel)
    config["ops"]["train__demo"]["config"]["keep_last_checkpoints"] = 1
    result = dg.materialize(
        [*DATASETS, mixture, train_phase],
        selection=[train_phase],
        partition_key="kestrel",
        instance=instance,
        resources={**resources, "training_backend": CommittingBackend()},
        run_config=config,
    )
    (event,) = [e for e in result.get_asset_materialization_events() if e.asset_key == train_phase.key]
    meta = {k: v.value for k, v in event.materialization.metadata.items()}
    assert meta["count/checkpoints_deleted"] == ["kestrel.000000004"]
    data = Path(meta["path"], "data")
    assert sorted(p.name for p in (data / "checkpoints").iterdir()) == ["step-000000008", "step-000000012"]
    ledger = json.loads((data / LEDGER).read_text())
    assert ledger["kestrel.000000004"]["deleted"] is True and "deleted" not in ledger["kestrel.000000008"]
    # Which intermediate checkpoints an artifact keeps is not part of the phase's version.
    assert "keep_last_checkpoints" not in PhaseConfig(keep_last_checkpoints=1).versioned_fields()
