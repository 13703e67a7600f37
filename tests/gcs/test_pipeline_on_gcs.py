"""The whole path with the artifact prefix on the GCS emulator: a raw source -> the sharded
DataKit graph (range runs, as `materialize_waves` drives it) -> its dataset index and the
mixture -> a real JAX train phase (caches read and checkpoints written through tensorstore's
gcs driver) -> eval/demo. Nothing of the run lands on local disk: the test checks the store's
objects are on the bucket and the local temp folder holds no artifact.
"""

from __future__ import annotations

import dataclasses

import dagster as dg
import pytest

from assets.datakit import make_datakit_graph
from assets.datakit.datasets import mixture_asset
from assets.evals import eval_phase
from assets.partitions import demo_phases
from assets.training import train_phase
from marin_assets.datakit.datasets import read_dataset
from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource
from marin_assets.orchestration.training_backends import LocalTrainingBackend
from marin_assets.orchestration.waves import materialize_waves
from marin_assets.store.fsutil import filesystem
from tests.assets.shard_corpus import SOURCE, base_records
from tests.assets.test_shard_assets import eval_ngrams, quality_model, raw_source, tokenizer
from tests.orchestration.phase_job import phase_run_config, phase_spec

pytestmark = pytest.mark.slow
MIXTURE = {"schedule": [{"step": 0, "weights": {SOURCE: 1.0}}]}


@pytest.mark.forks
def test_sources_to_eval_with_the_prefix_on_the_emulator(gcs_prefix, tmp_path, monkeypatch):
    monkeypatch.delenv("MARIN_LOCAL_WORKERS", raising=False)  # the default: forked workers on gs:// (issue 35)
    monkeypatch.chdir(tmp_path)  # a stray relative write would land here: checked at the end
    store_resource = ArtifactStoreResource(prefix=gcs_prefix)
    resources = {
        "artifact_store": store_resource,
        "artifact_io": ArtifactIOManager(artifact_store=store_resource),
        "training_backend": LocalTrainingBackend(),
    }
    mixture = mixture_asset([SOURCE])
    datakit = [
        raw_source({"a.jsonl": base_records()}),
        quality_model,
        eval_ngrams,
        tokenizer,
        *make_datakit_graph({SOURCE: f"sources/{SOURCE}"}),
        mixture,
    ]
    assets = [*datakit, train_phase, eval_phase]
    instance = dg.DagsterInstance.ephemeral()

    results = materialize_waves(
        assets,
        instance,
        resources,
        selection=[a.key for a in datakit],
        run_config={"ops": {mixture.op.name: {"config": MIXTURE}}},
        log=lambda line: None,
    )
    assert results and all(r.success for r in results)
    store = store_resource.store
    dataset = read_dataset(store.read_pointer(f"datasets/{SOURCE}", None).data_path)
    assert dataset.shards and dataset.train_tokens > 0
    assert all(shard.path.startswith(gcs_prefix) for shard in dataset.shards)  # caches on the bucket, read in place

    instance.add_dynamic_partitions(demo_phases.name, ["kestrel"])
    spec = {**dataclasses.asdict(phase_spec("kestrel", 6)), "mixture": None}
    trained = dg.materialize(
        assets,
        selection=[train_phase],
        partition_key="kestrel",
        instance=instance,
        resources=resources,
        run_config=phase_run_config(spec),
    )
    assert trained.success
    [metadata] = [
        e.materialization.metadata for e in trained.get_asset_materialization_events() if e.asset_key.path[0] == "train"
    ]
    assert metadata["count/final_step"].value == 6
    checkpoint_root = store.read_pointer("train/demo", "kestrel").data_path
    assert checkpoint_root.startswith(gcs_prefix)
    fs, _ = filesystem(gcs_prefix)
    assert fs.find(f"{checkpoint_root}/checkpoints"), "no checkpoint objects on the bucket"

    evaluated = dg.materialize(
        assets,
        selection=[eval_phase],
        partition_key="kestrel",
        instance=instance,
        resources=resources,
        run_config={"ops": {eval_phase.op.name: {"config": {"limit": 2}}}},
    )
    assert evaluated.success
    scores = evaluated.get_asset_materialization_events()[0].materialization.metadata
    assert 0 < scores["count/micro_bpb"].value < 20
    assert fs.exists(f"{store.read_pointer('eval/demo', 'kestrel').data_path}/eval.json")
    assert not list(tmp_path.iterdir()), f"local files written: {sorted(p.name for p in tmp_path.iterdir())}"
