"""Experiment records as assets: hypothesis -> runs -> analysis -> report, per record.

    experiments/corpus                       the DataKit datasets the records read (one per data_files)
    experiments/<name>/runs[<arm>-C<budget>-s<seed>]   one training run per partition
    experiments/<name>/analysis              effective speedup per arm, controls, criterion
    experiments/<name>/report                Markdown + PNGs (loss vs compute, speedups)

Partitions are one static set per record with keys ``<arm>-C<budget>-s<seed>`` (e.g.
``muon-C3e10-s1``): arm names are ``[a-z][a-z0-9_]*``, so keys hold none of Dagster's
reserved characters (``|,[]``, ``...``) and are valid artifact-store path segments.

Every step goes through the library (``marin_assets.experiments``): runs are content-
cached in the artifact store, so runs made by ``marin experiment screen`` are cache hits
here and the other way round, and an edited started record is refused (the lock) in the
runs and in the analysis. The corpus asset runs the DataKit (``data.materialize_corpus``)
once for each ``data_files`` the records name; a runs partition only opens the dataset
(``open_corpus``), so partitions running in parallel never start a DataKit run of their own.
``build_experiment_assets(path)`` builds one record's assets, ``corpus_asset(sizes)`` the
corpus; ``experiment_assets`` holds the corpus plus every record under ``experiments/`` (or
under ``$MARIN_EXPERIMENTS_DIR`` when set: another folder of records, e.g. a test's).
"""

import base64
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import dagster as dg
import fsspec

from marin_assets.experiments.analysis import analyze, report_images, report_markdown
from marin_assets.experiments.data import CORPUS_KEY, materialize_corpus, open_corpus
from marin_assets.experiments.lock import check_lock
from marin_assets.experiments.record import DEFAULT_DATA_FILES, ExperimentRecord
from marin_assets.experiments.record_files import load_record, record_outline
from marin_assets.experiments.runs import CODE_VERSION, materialize_run, partition_key, plan_runs, read_run, run_keys, runs_key
from marin_assets.orchestration import ArtifactStoreResource
from marin_assets.settings import setting
from marin_assets.store.fsutil import join, read_json, write_json_atomic

EXPERIMENTS_GROUP = "experiments"
RECORDS_DIR = Path(__file__).resolve().parents[1] / "experiments"
RECORDS_ENV = "MARIN_EXPERIMENTS_DIR"


def records_dir() -> Path:
    """``$MARIN_EXPERIMENTS_DIR`` if set (it must be a folder), else the repo's ``experiments/``."""
    raw = setting(RECORDS_ENV)
    if not raw:
        return RECORDS_DIR
    path = Path(raw)
    if not path.is_dir():
        raise ValueError(f"{RECORDS_ENV}={raw!r} is not a folder of experiment records (<name>.yaml)")
    return path


def corpus_asset(data_files: Sequence[int]) -> dg.AssetsDefinition:
    """``experiments/corpus``: the DataKit dataset of each of these corpus sizes (standard-library files)."""
    sizes = sorted(set(data_files))

    @dg.asset(
        key=dg.AssetKey.from_user_string(CORPUS_KEY),
        group_name=EXPERIMENTS_GROUP,
        code_version=CODE_VERSION,
        description=f"The DataKit datasets (byte tokenizer) of the first {sizes} standard-library files.",
    )
    def experiment_corpus(context: dg.AssetExecutionContext, artifact_store: ArtifactStoreResource) -> dg.MaterializeResult:
        corpora = [(n, materialize_corpus(artifact_store.store, n, context.log.info)) for n in sizes]
        versions = ",".join(f"{n}:{c.version}" for n, c in corpora)
        return dg.MaterializeResult(
            data_version=dg.DataVersion(hashlib.sha256(versions.encode()).hexdigest()[:16]),
            metadata={
                "datasets": dg.MetadataValue.json(
                    [
                        {
                            "data_files": n,
                            "index": c.index,
                            "version": c.version,
                            "train_tokens": c.train_tokens,
                            "validation_tokens": c.validation_tokens,
                            "vocab_size": c.vocab_size,
                        }
                        for n, c in corpora
                    ]
                )
            },
        )

    return experiment_corpus


def _analysis_path(store, record: ExperimentRecord) -> str:
    return join(store.root, "experiments", record.name, "analysis.json")


def build_experiment_assets(path: str | Path) -> list[dg.AssetsDefinition]:
    """The runs, analysis and report assets of the record at ``path``."""
    # The outline, not the record: loading the code location builds no TrainConfig (no jax);
    # the full record is loaded and validated (and its lock checked) when an asset runs.
    record = record_outline(path)
    keys = [partition_key(arm, budget, seed) for arm, budget, seed in record.runs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{path}: run keys repeat (budgets must differ at 2 significant digits): {keys}")
    partitions = dg.StaticPartitionsDefinition(keys)
    prefix = ["experiments", record.name]
    runs_asset_key = dg.AssetKey.from_user_string(runs_key(record.name))

    def current_record() -> ExperimentRecord:
        # Re-read at run time: an edit made after the code location loaded is still checked.
        return load_record(path)

    @dg.asset(
        key=runs_asset_key,
        partitions_def=partitions,
        group_name=EXPERIMENTS_GROUP,
        code_version=CODE_VERSION,
        deps=[dg.AssetKey.from_user_string(CORPUS_KEY)],
        description=f"{record.name}: one training run per (arm, budget, seed). {record.hypothesis.strip()}",
    )
    def runs(context: dg.AssetExecutionContext, artifact_store: ArtifactStoreResource) -> dg.MaterializeResult:
        store = artifact_store.store
        rec = current_record()
        corpus = open_corpus(store, rec.data_files)
        spec = {s.key: s for s in plan_runs(rec, corpus.vocab_size)}.get(context.partition_key)
        if spec is None:
            raise ValueError(f"{rec.source}: no run {context.partition_key!r} in the record any more")
        row, hit = materialize_run(store, rec, spec, corpus, context.log.info)
        return dg.MaterializeResult(
            metadata={
                "validation_loss": float(row["validation_loss"]),
                "flops": float(row["flops"]),
                "steps": int(row["steps"]),
                "arm": row["arm"],
                "seed": int(row["seed"]),
                "cache_hit": hit,
                **({"wandb_run_id": row["wandb"]["run_id"], "wandb_dir": row["wandb"]["dir"]} if "wandb" in row else {}),
            }
        )

    @dg.asset(
        key=dg.AssetKey([*prefix, "analysis"]),
        deps=[runs],
        group_name=EXPERIMENTS_GROUP,
        code_version=CODE_VERSION,
        description=f"{record.name}: effective speedup per arm (bootstrap over seeds), controls, criterion.",
    )
    def analysis(context: dg.AssetExecutionContext, artifact_store: ArtifactStoreResource) -> dg.MaterializeResult:
        store = artifact_store.store
        rec = current_record()
        check_lock(store, rec)
        rows = []
        for key in sorted(run_keys(rec)):
            ref = store.read_pointer(runs_key(rec.name), key)
            if ref is None:
                raise FileNotFoundError(f"{rec.name}: run {key} has not been materialised yet")
            rows.append(read_run(ref))
        result = analyze(rec, rows)
        write_json_atomic(store.fs, _analysis_path(store, rec), result)
        return dg.MaterializeResult(
            metadata={
                "arms": dg.MetadataValue.json(
                    [{k: a[k] for k in ("arm", "effective_speedup", "ci_low", "ci_high", "runs")} for a in result["arms"]]
                ),
                "noise_floor": dg.MetadataValue.json(result["noise_floor"]),
                "controls_held": result["controls_held"],
                "criterion_held": result["criterion"]["held"],
                "runs": len(rows),
            }
        )

    @dg.asset(
        key=dg.AssetKey([*prefix, "report"]),
        deps=[analysis],
        group_name=EXPERIMENTS_GROUP,
        code_version=CODE_VERSION,
        description=f"{record.name}: Markdown report with plots and whether the criterion held.",
    )
    def report(context: dg.AssetExecutionContext, artifact_store: ArtifactStoreResource) -> dg.MaterializeResult:
        store = artifact_store.store
        rec = current_record()
        result = read_json(store.fs, _analysis_path(store, rec))
        if result is None:
            raise FileNotFoundError(f"{rec.name}: the analysis has not been materialised yet")
        images = report_images(result)
        links = {name: f"data:image/png;base64,{base64.b64encode(png).decode()}" for name, png in images.items()}
        markdown = report_markdown(rec, result, image_links=links)
        out = join(store.root, "experiments", rec.name, "report")
        store.fs.makedirs(out, exist_ok=True)
        with store.fs.open(join(out, "report.md"), "w") as f:
            f.write(report_markdown(rec, result))
        for name, png in images.items():
            with fsspec.core.OpenFile(store.fs, join(out, name), "wb") as f:  # store.fs.open, typed as bytes-writing
                f.write(png)
        return dg.MaterializeResult(
            metadata={
                "report": dg.MetadataValue.md(markdown),
                "criterion_held": result["criterion"]["held"],
                "controls_held": result["controls_held"],
                "path": out,
                "speedups": dg.MetadataValue.json(json.loads(json.dumps(result["arms"]))),
            }
        )

    return [runs, analysis, report]


def build_all(paths: Sequence[str | Path] | None = None) -> list[dg.AssetsDefinition]:
    """The corpus (the records' sizes) plus every record's assets (default: every *.yaml of ``records_dir()``)."""
    paths = sorted(records_dir().glob("*.yaml")) if paths is None else paths
    sizes = [record_outline(p).data_files for p in paths] or [DEFAULT_DATA_FILES]
    return [corpus_asset(sizes), *[a for p in paths for a in build_experiment_assets(p)]]


experiment_assets = build_all()
