"""The sharded DataKit graph over a user's files: what `marin datakit run` materialises.

make_shard_assets over one `sources/<name>` asset per --input, plus the three fixed inputs
of the graph built from the run's flags, under their real keys:
- quality_model: the user's --quality-model dir; or, with a threshold above 0 and no dir,
  one trained on the demo sources; or no model (threshold 0: nothing is filtered);
- eval_ngrams: the n-gram index of the --eval sets (empty without any: nothing matches);
- tokenizer: the user's --tokenizer; or a BPE trained on every shards/final partition.
Each is content-versioned by what it reads (file bytes, not paths or times), so a rerun into
the same --prefix recomputes only what changed.

Also `watched_source_asset`: sources/user of the code location's sharded graph, the files of
$MARIN_USER_DATA_DIR, which the new_user_shards sensor (sensors/user_shards.py) feeds.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence

import dagster as dg

from assets.shards import make_shard_assets
from assets.shards.common import GROUP, every, shard_file
from marin_assets.datakit.pipeline import RunSpec, dataset_names
from marin_assets.datakit.readers import JSONL_SUFFIXES, SUPPORTED_SUFFIXES, ReaderConfig, iter_file, list_input_files
from marin_assets.datakit.shard_index import WHOLE_FILE_SUFFIXES
from marin_assets.datakit.shards import basename, join
from marin_assets.datakit.watched_dir import WATCH_ENV, directory_digest, scan
from marin_assets.orchestration import StageConfig, StageContext, versioned_asset
from marin_assets.store import ArtifactRef
from marin_assets.store.fsutil import real_path_inside, sha256_file

SHARDABLE = JSONL_SUFFIXES + WHOLE_FILE_SUFFIXES
assert set(SHARDABLE) == set(SUPPORTED_SUFFIXES), "the index must shard every format the readers read"


def files_digest(files: Sequence[tuple[str, str]]) -> str:
    """sha256 over (name, bytes) of every file: a version that follows content, not paths or times."""
    import fsspec

    digest = hashlib.sha256()
    for name, path in files:
        digest.update(f"{len(name)}:{name}".encode())
        with fsspec.open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        digest.update(b"\x00end")
    return digest.hexdigest()[:32]


def copy_file(path: str, dest: str) -> None:
    import fsspec

    fs, root = fsspec.core.url_to_fs(dest)
    fs.makedirs(root.rsplit("/", 1)[0], exist_ok=True)
    with fsspec.open(path, "rb") as src, fsspec.open(dest, "wb") as out:
        for chunk in iter(lambda: src.read(1 << 20), b""):
            out.write(chunk)


def input_names(path: str, files: Sequence[str]) -> list[tuple[str, str]]:
    """(name under the input, file) of every listed file: its path inside the --input
    directory, or its basename when the input is one file. Not numbered: a shard key follows
    its file's name (shard_index.file_labels), so a file added to the input renames none."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    if not fs.isdir(root):
        return [(basename(f), f) for f in files]
    prefix = root.rstrip("/") + "/"
    return [(fsspec.core.url_to_fs(f)[1][len(prefix):], f) for f in files]


def source_asset(name: str, path: str, max_doc_bytes: int) -> dg.AssetsDefinition:
    """sources/<name>: the files of one --input, copied under their names inside it.

    A file of a format the index cannot shard is not copied: it is read by the readers here,
    which quarantine it (unsupported_file_type), and counted, as the single-process run does.
    """
    named = input_names(path, list_input_files(path))

    @versioned_asset(key=f"sources/{name}", code_version=f"files.{files_digest(named)}", group_name=GROUP)
    def _source(ctx: StageContext):
        reasons: dict[str, int] = {}
        for copy_name, file in named:
            if basename(file).lower().endswith(SHARDABLE):
                copy_file(file, join(ctx.out_dir, copy_name))
                continue
            for record in iter_file(file, ReaderConfig(max_doc_bytes=max_doc_bytes)):
                reason = record.reason  # iter_file yields one QuarantineRecord for such a file
                reasons[reason] = reasons.get(reason, 0) + 1
        return {"files": len(named), "quarantined": sum(reasons.values()), "quarantine_reasons": reasons}

    return _source


class WatchedSourceConfig(StageConfig):
    # Not versioned: a machine path. The version is the content of what the scan finds there.
    directory: str = ""  # "" = the directory named by the watch variable
    expected: str = ""  # the directory_digest the sensor saw ("" = none): a run that finds other content fails


def watched_source_asset(name: str = "user", watch_env: str = WATCH_ENV) -> dg.AssetsDefinition:
    """sources/<name>: the usable files of the watched directory ($MARIN_USER_DATA_DIR), copied.

    Versioned by directory_digest of what the scan finds when the run plans (the same scan,
    symlink and extension checks as the new-files sensors), so a run from the sensor and
    one from `make demo` over the same files share a version. With the variable unset the
    source is empty (the demo's sources still shard); a file that changes under the run is
    an error, not an artifact whose version names other bytes.
    """
    planned: dict[str, str] = {}  # real directory -> digest the version was planned with

    def directory_of(config: WatchedSourceConfig) -> str | None:
        directory = config.directory or os.environ.get(watch_env, "")
        if directory and not os.path.isdir(directory):
            raise NotADirectoryError(f"sources/{name}: {directory} (${watch_env} or config directory) is not a directory")
        return os.path.realpath(directory) if directory else None

    def changed(directory: str | None, digest: str, expected: str | None, whose: str) -> ValueError:
        return ValueError(f"sources/{name}: the files of {directory} changed: their digest is {digest}, {whose} "
                          f"{expected}; the next sensor tick requests the new content")

    def _version(config: WatchedSourceConfig, partition: str | None, inputs: Mapping) -> dict[str, str]:
        directory = directory_of(config)
        digest = directory_digest(scan(directory)[0] if directory else {})
        if config.expected and config.expected != digest:  # checked here: a cache hit runs no body
            raise changed(directory, digest, config.expected, "the sensor saw")
        if directory:
            planned[directory] = digest
        return {"files": digest}

    @versioned_asset(key=f"sources/{name}", code_version="1", config_cls=WatchedSourceConfig, group_name=GROUP,
                     version_inputs=_version)
    def _watched(ctx: StageContext, config: WatchedSourceConfig):
        directory = directory_of(config)
        if directory is None:
            ctx.log(f"${watch_env} is not set: sources/{name} is empty")
            return {"files": 0, "skipped": 0, "files_digest": directory_digest({})}
        usable, skipped = scan(directory)
        digest = directory_digest(usable)
        if planned.get(directory) != digest:
            raise changed(directory, digest, planned.get(directory), "this run planned")
        for file, sha in usable.items():
            dest = join(ctx.out_dir, file)
            copy_file(real_path_inside(directory, file), dest)
            if sha256_file(dest) != sha:
                raise ValueError(f"sources/{name}: {file} changed while it was copied (sha256 {sha[:12]} planned)")
        for file, why in skipped.items():
            ctx.log(f"not ingesting {file}: {why}")
        return {"files": len(usable), "skipped": len(skipped), "skip_reasons": skipped, "files_digest": digest}

    return _watched


def quality_model_asset(spec: RunSpec) -> dg.AssetsDefinition:
    model_dir, threshold = spec.config.quality_model, spec.config.quality_threshold
    if model_dir is not None:
        files = [(f[len(model_dir.rstrip("/")) + 1:], f) for f in list_input_files(model_dir)]
        version, what = f"dir.{files_digest(files)}", "the given model"
    elif threshold > 0:
        version, what = "demo.1", "trained on the demo sources"
    else:
        version, what = "none", "no model (threshold 0)"

    @versioned_asset(key="quality_model", code_version=version, group_name=GROUP, description=f"quality model: {what}")
    def _quality_model(ctx: StageContext):
        from marin_assets.datakit.pipeline import train_demo_quality_model

        if model_dir is not None:
            for rel, f in files:
                copy_file(f, join(ctx.out_dir, rel))
            return {"model": "given", "files": len(files)}
        if threshold > 0:
            return train_demo_quality_model(ctx.out_dir, spec.config.source_cache_dir, ctx.scratch_dir)
        return {"model": "none"}

    return _quality_model


def eval_ngrams_asset(spec: RunSpec) -> dg.AssetsDefinition:
    from marin_assets.datakit.eval_sets import PACKAGED_EVAL_SETS

    named = [(f"{i}:{e}", e) for i, e in enumerate(spec.evals) if e not in PACKAGED_EVAL_SETS]
    packaged = [e for e in spec.evals if e in PACKAGED_EVAL_SETS]
    version = f"evals.{files_digest(named)}.{'+'.join(packaged)}"

    @versioned_asset(key="eval_ngrams", code_version=version, group_name=GROUP)
    def _eval_ngrams(ctx: StageContext):
        from marin_assets.datakit.decontaminate import EvalNgramIndex
        from marin_assets.datakit.eval_sets import iter_eval_items

        index = EvalNgramIndex.build(iter_eval_items(spec.evals), spec.config.decontam())
        index.save(ctx.out_dir)
        return {"eval_sets": len(spec.evals), "items": len(index.eval_ids), "ngrams": index.num_ngrams}

    return _eval_ngrams


def tokenizer_asset(spec: RunSpec) -> dg.AssetsDefinition:
    from marin_assets.datakit.tokenize import TokenizerTrainConfig, train_tokenizer

    given = spec.config.tokenizer
    if given is not None:
        import fsspec

        fs, root = fsspec.core.url_to_fs(given)
        path = join(given, "tokenizer.json") if fs.isdir(root) else given

        @versioned_asset(key="tokenizer", code_version=f"file.{files_digest([('tokenizer.json', path)])}", group_name=GROUP)
        def _given(ctx: StageContext):
            copy_file(path, join(ctx.out_dir, "tokenizer.json"))
            return {"tokenizer": "given"}

        return _given
    vocab_size = spec.config.vocab_size

    @versioned_asset(key="tokenizer", code_version=f"bpe.1.v{vocab_size}", ins={"docs": every("shards/final")}, group_name=GROUP)
    def _trained(ctx: StageContext, docs: dict[str, ArtifactRef]):
        """A byte-level BPE trained on every final shard (what the single cache is tokenized with)."""
        return train_tokenizer([shard_file(docs[k]) for k in sorted(docs)], ctx.out_dir, TokenizerTrainConfig(vocab_size=vocab_size))

    return _trained


def user_graph(spec: RunSpec) -> list[dg.AssetsDefinition]:
    """Every asset of the run's graph: one source per --input, the fixed inputs, the sharded graph."""
    names = dataset_names(spec.inputs)
    sources = [source_asset(name, path, spec.config.max_doc_bytes) for name, path in zip(names, spec.inputs)]
    fixed = [quality_model_asset(spec), eval_ngrams_asset(spec), tokenizer_asset(spec)]
    graph = make_shard_assets({name: f"sources/{name}" for name in names})
    return [*sources, *fixed, *graph]


def run_config(spec: RunSpec, assets: Sequence[dg.AssetsDefinition]) -> dict:
    """The flags that configure the graph's assets, by asset key."""
    by_key = {a.key.to_user_string(): a.op.name for a in assets}
    ops = {
        "shards/index": {"shard_bytes": spec.shard_bytes},
        "shards/normalized": {"max_doc_bytes": spec.config.max_doc_bytes},
        "shards/quality": {"threshold": spec.config.quality_threshold},
        "shards/fuzzy_edges": {"jaccard_threshold": spec.config.fuzzy_jaccard_threshold},
        "shards/decontam": {"threshold": spec.config.decontam_threshold},
    }
    level = "WARNING" if spec.quiet else "INFO"
    return {"ops": {by_key[k]: {"config": c} for k, c in ops.items()},
            "loggers": {"console": {"config": {"log_level": level}}}}


__all__ = ["files_digest", "run_config", "user_graph", "watched_source_asset"]
