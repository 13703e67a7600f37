"""Thin fsspec helpers so local paths, gs://, s3:// and memory:// behave alike."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any, cast

import fsspec
import fsspec.config
from fsspec.implementations.local import LocalFileSystem

_FLAGS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}


def _gcs_listings_cache_off(conf: dict) -> None:
    """Make gs:// filesystems list fresh: gcsfs caches directory listings with no expiry by default, so a
    file another process creates stays invisible (``exists`` False) and a file it rewrote longer reads back
    cut to the cached size (measured on fake-gcs-server with gcsfs 2025.12.0). Lease polling and
    ``ArtifactStore.load`` read exactly such files. Other ``gs`` settings stay; an explicit user choice of
    ``use_listings_cache`` (FSSPEC_GS JSON, or FSSPEC_GS_USE_LISTINGS_CACHE whose string value is parsed here) wins."""
    gs = conf.setdefault("gs", {})
    value = gs.setdefault("use_listings_cache", False)
    if isinstance(value, str):  # FSSPEC_GS_<KEY> values arrive unparsed, and the string "false" is truthy
        if value.strip().lower() not in _FLAGS:
            raise ValueError(f"FSSPEC_GS_USE_LISTINGS_CACHE={value!r}: expected true or false")
        gs["use_listings_cache"] = _FLAGS[value.strip().lower()]


_gcs_listings_cache_off(fsspec.config.conf)  # at import: every gs:// filesystem the project opens through fsspec


def adopt_inherited_filesystems() -> int:
    """Make the async filesystems (gcsfs) this forked child inherited usable here; returns how many.

    An instance remembers the pid that made it and raises "This class is not fork-safe" in any
    other process: its event loop ran on a thread the child does not have, and its HTTP session's
    keep-alive sockets are shared with the parent (two processes writing one TCP stream corrupt
    both). Objects built before the fork (``ArtifactStore.fs``, a telemetry store's) still hold
    such instances, so clearing fsspec's instance cache is not enough. fsspec's own after-fork
    hook has already dropped the parent's loop; here each inherited instance gets this process's
    loop and no session, so its first call opens its own connections. The parent's session is
    left unclosed: closing it here would shut sockets the parent is still using.
    Call it at the start of a forked child, before it touches a store."""
    from fsspec.asyn import AsyncFileSystem, get_loop

    adopted = 0
    for cls in _subclasses(AsyncFileSystem):
        for fs in list(cls.__dict__.get("_cache", {}).values()):
            if getattr(fs, "_pid", None) in (None, os.getpid()):
                continue
            fs._pid = os.getpid()
            if not fs.asynchronous:
                fs._loop = get_loop()
            if hasattr(fs, "_session"):  # gcsfs, http: a new aiohttp session on this process's loop
                fs._session = None
            adopted += 1
    return adopted


def _subclasses(cls: type) -> list[type]:
    found = [cls]
    for sub in cls.__subclasses__():
        found += _subclasses(sub)
    return found


class StoreUnusable(ValueError):
    """An object store this process cannot use at all (no such bucket, a credentials file that is
    missing): one line naming the bucket or the variable, said before any work starts."""


_GCS = ("gs", "gcs")
CREDENTIALS_ENV = "GOOGLE_APPLICATION_CREDENTIALS"


def check_gcs_credentials(env: dict[str, str] | None = None) -> None:
    """StoreUnusable when $GOOGLE_APPLICATION_CREDENTIALS names a file that is not there: gcsfs would
    quietly go anonymous and fail a minute of retries later, tensorstore and google-cloud-storage
    would fail on first use. Unset, it is fine (the default credentials are looked up)."""
    path = (os.environ if env is None else env).get(CREDENTIALS_ENV)
    if path and not os.path.isfile(path):
        raise StoreUnusable(
            f"{CREDENTIALS_ENV}={path}: no such file (point it at a service-account key file, "
            "or unset it to use the default credentials)"
        )


def filesystem(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """(filesystem, path without protocol) for a URL or local path. StoreUnusable for a gs:// URL
    when $GOOGLE_APPLICATION_CREDENTIALS names a missing file."""
    if fsspec.core.split_protocol(url)[0] in _GCS:
        check_gcs_credentials()
    fs, path = fsspec.core.url_to_fs(url)
    return fs, path.rstrip("/") or "/"


def check_bucket(url: str) -> None:
    """StoreUnusable naming the bucket when ``url`` is on gs:// and its bucket does not exist or
    cannot be read, so a run says so before its first write (a write's error names the upload URL).
    Other stores have no buckets to check."""
    fs, path = filesystem(url)
    if fsspec.core.split_protocol(url)[0] not in _GCS:
        return
    bucket = path.split("/", 1)[0]
    try:
        fs.info(bucket)
    except FileNotFoundError:
        raise StoreUnusable(f"gs://{bucket}: no such bucket (create it, or fix the bucket name in {url})") from None
    except Exception as err:  # noqa: BLE001 - gcsfs's HttpError (a 403) is no OSError; keep its reason, say the bucket
        reason = " ".join(str(err).split())[:300]
        raise StoreUnusable(f"gs://{bucket}: cannot read the bucket ({type(err).__name__}: {reason})") from None


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *[p.strip("/") for p in parts if p]])


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return isinstance(fs, LocalFileSystem)


def unstrip(fs: fsspec.AbstractFileSystem, path: str) -> str:
    """Turn a protocol-less path back into a URL other fsspec users can open."""
    return fs.unstrip_protocol(path) if not is_local(fs) else path


def child(root: str | os.PathLike, *parts: str) -> Path | str:
    """``root/parts``: a ``Path`` under a local root, else the URL as the caller spelled it
    (``memory://x/y``, ``gs://b/y``), so results compare equal to what callers build."""
    fs, base = filesystem(os.fspath(root))
    if is_local(fs):
        return Path(join(base, *parts))
    return join(os.fspath(root), *parts)


def write_json_atomic(fs: fsspec.AbstractFileSystem, path: str, value: Any, durable: bool = True) -> None:
    """Write JSON so readers see the old or the new file, never half of one."""
    write_bytes_atomic(fs, path, json.dumps(value, indent=2, sort_keys=True).encode("utf-8"), durable)


def write_bytes_atomic(fs: fsspec.AbstractFileSystem, path: str, data: bytes, durable: bool = True) -> None:
    """Replace a file so readers see the old or the new one, never half of one.

    Locally: temp file (+ fsync when ``durable``) + os.replace. The rename alone is what
    protects against a killed process; the fsync only matters if the machine itself goes
    down, so advisory records (RUNNING, lease records) skip it: about 0.5 ms each, twice
    per committed partition. Object stores: a single PUT is atomic and durable.
    """
    if is_local(fs):
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:  # a full disk, ``path`` a folder: leave no temp file behind
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise
    else:  # fs.open's file, typed: fsspec infers open() as the text wrapper of mode "r" or the binary file
        with fsspec.core.OpenFile(fs, path, "wb") as f:
            f.write(data)


def fsync_dir(path: str) -> None:
    """Make a local folder's entries (a file created, renamed or removed in it) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_bytes(fs: fsspec.AbstractFileSystem, path: str) -> bytes:
    """The whole file; FileNotFoundError when there is none."""
    data = fs.cat_file(path)
    return data if isinstance(data, bytes) else data.encode("utf-8")  # fsspec's cat_file is typed str | bytes


def read_json(fs: fsspec.AbstractFileSystem, path: str) -> Any | None:
    try:
        return json.loads(read_bytes(fs, path).decode("utf-8"))
    except FileNotFoundError:
        return None


def list_files(fs: fsspec.AbstractFileSystem, root: str) -> list[tuple[str, int]]:
    """(relative path, size) of every file under root, sorted."""
    if not fs.exists(root):
        return []
    found = cast(dict[str, dict], fs.find(root, detail=True))  # {path: info}; fsspec types find list | dict
    root_stripped = root.rstrip("/") + "/"
    out = []
    for path, info in found.items():
        rel = path[len(root_stripped) :] if path.startswith(root_stripped) else path
        out.append((rel, int(info.get("size") or 0)))
    return sorted(out)


def sha256_file(path: str) -> str:
    """Hex sha256 of a local file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def real_path_inside(directory: str, name: str) -> str:
    """The real path of ``directory/name``; ValueError when it (a symlink, ``..``) resolves
    outside ``directory``, so a watched folder cannot be used to read files elsewhere."""
    root = os.path.realpath(directory)
    real = os.path.realpath(os.path.join(root, name))
    if real == root or os.path.commonpath([root, real]) != root:
        raise ValueError(f"{name} resolves to {real}, outside the directory {root}")
    return real


def kvstore_spec(url: str) -> dict:
    """A tensorstore kvstore spec for a local path or ``gs://bucket/path`` (the two stores
    Levanter caches live on here). tensorstore reaches a GCS emulator through
    ``TENSORSTORE_GCS_HTTP_URL``; the real service needs nothing else."""
    protocol, _, rest = url.partition("://") if "://" in url else ("file", "", url)
    if protocol in ("file", "local"):
        return {"driver": "file", "path": os.path.abspath(rest)}
    if protocol in _GCS:
        check_gcs_credentials()
        bucket, _, path = rest.partition("/")
        if not bucket:
            raise ValueError(f"{url}: no bucket name")
        return {"driver": "gcs", "bucket": bucket, "path": path.strip("/") + "/"}
    raise ValueError(f"{url}: token caches live on a local disk or on gs:// (tensorstore), not on {protocol}://")


def sha256_of(fs, path: str) -> str:
    """Hex sha256 of a file on any fsspec filesystem, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with fs.open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
