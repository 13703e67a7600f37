"""The blocking check on each dataset fails when a contaminated document slips past the
per-shard decontamination, and its scan is itself content-versioned (a cache hit next time)."""

import dagster as dg
import pyarrow as pa
import pytest

from assets.datakit.datasets import contamination_check
from marin_assets.datakit.datasets import Dataset, ShardCache, write_dataset
from marin_assets.datakit.decontaminate import DecontamConfig, EvalNgramIndex
from marin_assets.datakit.shards import join, write_table
from marin_assets.orchestration import (
    ArtifactIOManager,
    ArtifactStoreResource,
    StageConfig,
    StageContext,
    versioned,
    versioned_asset,
)

EVAL_ITEM = (
    "A farmer has 17 sheep and all but 9 run away; how many sheep does the farmer have left "
    "at the end of the day after counting them twice in the evening light"
)


class DocsConfig(StageConfig):
    leak: bool = versioned(False)


@versioned_asset(key="datasets/web", code_version="test", config_cls=DocsConfig)
def fake_dataset(ctx: StageContext, config: DocsConfig):
    """A dataset of two shards whose documents the check reads (their caches are not needed)."""
    texts = [
        ["An ordinary paragraph about rivers, mountains and the weather in the north."],
        ["Another harmless document on the history of printing presses in Europe."],
    ]
    if config.leak:
        texts[1].append("Homework help.\n\n" + EVAL_ITEM)
    shards = []
    for i, docs in enumerate(texts):
        path = join(ctx.out_dir, f"web-{i}.parquet")
        write_table(pa.table({"id": [f"{i}{j:031x}" for j in range(len(docs))], "text": docs}), path)
        shards.append(ShardCache(f"web-{i}", "v", join(ctx.out_dir, f"web-{i}"), 1, 0, len(docs), 0, documents=path))
    write_dataset(Dataset("web", tuple(shards), {}), ctx.out_dir)
    return {"shards": len(shards)}


@versioned_asset(key="eval_ngrams", code_version="test")
def fake_ngrams(ctx: StageContext):
    EvalNgramIndex.build([("gsm8k/test/0", EVAL_ITEM)], DecontamConfig()).save(ctx.out_dir)
    return {"items": 1}


@pytest.mark.parametrize("leak", [False, True])
def test_check_passes_clean_data_and_fails_a_leak_then_caches_the_scan(tmp_path, leak):
    store = ArtifactStoreResource(prefix=str(tmp_path))
    resources = {"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)}
    instance = dg.DagsterInstance.ephemeral()
    run_config = {"ops": {"datasets__web": {"config": {"leak": leak}}}}
    for _ in range(2):  # the second evaluation reuses the versioned scan
        result = dg.materialize(
            [fake_dataset, fake_ngrams, contamination_check("web")],
            instance=instance,
            resources=resources,
            run_config=run_config,
            raise_on_error=False,
        )
        evaluation = result.get_asset_check_evaluations()[0]
        assert evaluation.passed is (not leak) and evaluation.metadata["documents"].value == 2 + int(leak)
        assert evaluation.metadata["contaminated"].value == int(leak)
        if leak:  # the example names the shard and the eval item that leaked
            [example] = evaluation.metadata["examples"].value
            assert example["shard"] == "web-1" and example["evals"] == ["gsm8k/test/0"]
    assert len(list(tmp_path.glob("checks/no_contaminated_documents/web/__all__/*/data/contaminated.json"))) == 1
