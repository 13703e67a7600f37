"""The blocking asset check on final_documents fails when a contaminated document slips in."""

import dagster as dg
import pyarrow as pa
import pytest

from assets.datakit import no_contaminated_documents
from marin_assets.datakit.decontaminate import DecontamConfig, EvalNgramIndex
from marin_assets.datakit.shards import join, write_table
from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource, StageConfig, StageContext, versioned, versioned_asset

EVAL_ITEM = ("A farmer has 17 sheep and all but 9 run away; how many sheep does the farmer have left "
             "at the end of the day after counting them twice in the evening light")


class DocsConfig(StageConfig):
    leak: bool = versioned(False)


@versioned_asset(key="final_documents", code_version="test", config_cls=DocsConfig)
def fake_final(ctx: StageContext, config: DocsConfig):
    texts = ["An ordinary paragraph about rivers, mountains and the weather in the north.",
             "Another harmless document on the history of printing presses in Europe."]
    if config.leak:
        texts.append("Homework help.\n\n" + EVAL_ITEM)
    write_table(pa.table({"id": [f"{i:032x}" for i in range(len(texts))], "text": texts}), join(ctx.out_dir, "part-00000-of-00001.parquet"))
    return {"docs_out": len(texts)}


@versioned_asset(key="eval_ngrams", code_version="test")
def fake_ngrams(ctx: StageContext):
    EvalNgramIndex.build([("gsm8k/test/0", EVAL_ITEM)], DecontamConfig()).save(ctx.out_dir)
    return {"items": 1}


@pytest.mark.parametrize("leak", [False, True])
def test_check_passes_clean_data_and_fails_a_leak_then_caches_the_scan(tmp_path, leak):
    store = ArtifactStoreResource(prefix=str(tmp_path))
    resources = {"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)}
    instance = dg.DagsterInstance.ephemeral()
    run_config = {"ops": {"final_documents": {"config": {"leak": leak}}}}
    for _ in range(2):  # the second evaluation reuses the versioned scan
        result = dg.materialize([fake_final, fake_ngrams, no_contaminated_documents], instance=instance, resources=resources,
                                run_config=run_config, raise_on_error=False)
        evaluation = result.get_asset_check_evaluations()[0]
        assert evaluation.passed is (not leak)
        assert evaluation.metadata["contaminated"].value == int(leak)
    assert len(list(tmp_path.glob("checks/no_contaminated_documents/__all__/*/data/contaminated.json"))) == 1
