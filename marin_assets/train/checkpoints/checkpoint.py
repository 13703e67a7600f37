"""Atomic checkpoints of the whole train state, and the commit rule every checkpoint folder obeys.

Two formats share the folder names, meta.json and the COMMITTED marker: the sharded one that
training writes on a local disk or ``gs://`` (``sharded_checkpoint.py``: each process writes
its own shards; the marker names meta.json and every process's manifest of digests), and the
single-file one below, which ``save`` writes on any fsspec filesystem (a local dir,
``gs://bucket/run/checkpoints``, ``memory://`` in tests) from host arrays. ``marker_problem``,
``latest_valid`` and ``load`` read both.

Layout under ``<out>/checkpoints/``::

    step-000000120/
        state.npz      every leaf of the train state pytree (params, optimizer state,
                       guard windows, router bias, RNG, step) as a0, a1, ...
        meta.json      step, kind (temporary|permanent), data position, phase info, the
                       leaf keys/dtypes/shapes, and anything else the caller adds
        COMMITTED      sha256 of state.npz and meta.json, written last

The COMMITTED marker is the last file written and names the digests of the other two:
a process killed at any point leaves either no ``step-*`` folder or one without a valid
marker, which ``latest_valid`` skips with a warning. On a local disk the folder is also
written as ``.staging-*`` and renamed into place (a rename is atomic there); object stores
have no atomic rename and no real folders, so there the files go straight into place and
the marker alone is the commit. Temporary checkpoints (time-based) are pruned when a newer
one commits; permanent ones (every N steps) are kept.

Folders come back as ``Path`` for a local root and as URL strings (``memory://...``,
``gs://...``) otherwise; every function takes either.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import uuid
from pathlib import Path

import jax
import ml_dtypes
import numpy as np

from marin_assets.store.fsutil import child, filesystem, is_local, join, sha256_of
from marin_assets.train.checkpoints import sharded_checkpoint as sharded

log = logging.getLogger(__name__)
MARKER = "COMMITTED"


def _fs(where: str | os.PathLike):
    return filesystem(os.fspath(where))


def write_durable(fs, path: str, data: bytes) -> None:
    """One file, durable before the next is written (fsync locally; one PUT on object stores)."""
    if is_local(fs):
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    else:
        with fs.open(path, "wb") as f:
            f.write(data)


def flatten(state) -> tuple[list[str], list[np.ndarray]]:
    pairs, _ = jax.tree_util.tree_flatten_with_path(state)
    return [jax.tree_util.keystr(p) for p, _ in pairs], [np.asarray(x) for _, x in pairs]


def _to_storable(x: np.ndarray) -> np.ndarray:
    # npz cannot round-trip bfloat16: store its bits.
    return x.view(np.uint16) if x.dtype == ml_dtypes.bfloat16 else x


def save(root: str | os.PathLike, step: int, state, meta: dict, kind: str = "permanent") -> Path | str:
    """Write a checkpoint for ``step`` atomically; returns its folder."""
    if kind not in ("temporary", "permanent"):
        raise ValueError(f"checkpoint kind must be temporary or permanent, got {kind!r}")
    fs, base = _fs(root)
    fs.makedirs(base, exist_ok=True)
    name = f"step-{step:09d}"
    final = join(base, name)
    if fs.exists(final) and marker_problem(child(root, name)) is None:
        return child(root, name)  # the same step is already safely stored
    keys, leaves = flatten(jax.device_get(state))
    buf = io.BytesIO()
    np.savez(buf, **{f"a{i}": _to_storable(x) for i, x in enumerate(leaves)})
    full_meta = dict(
        meta, step=int(step), kind=kind, keys=keys, dtypes=[str(x.dtype) for x in leaves], shapes=[list(x.shape) for x in leaves]
    )
    files = {"state.npz": buf.getvalue(), "meta.json": json.dumps(full_meta, indent=1, sort_keys=True).encode()}
    if fs.exists(final):
        fs.rm(final, recursive=True)  # an invalid leftover from a crash
    if is_local(fs):
        staging = join(base, f".staging-{step:09d}-{uuid.uuid4().hex[:8]}")
        fs.makedirs(staging)
        for file, data in files.items():
            write_durable(fs, join(staging, file), data)
        os.rename(staging, final)
    else:
        for file, data in files.items():
            write_durable(fs, join(final, file), data)
    marker = {file: hashlib.sha256(data).hexdigest() for file, data in files.items()}
    write_durable(fs, join(final, MARKER), json.dumps(marker).encode())
    prune_temporary(root, keep=name)
    return child(root, name)


FILES = ("meta.json", "state.npz")  # what a COMMITTED marker must list, exactly
_SHA256 = re.compile(r"[0-9a-f]{64}")


def marker_problem(folder: str | os.PathLike) -> str | None:
    """Why ``folder`` is not a valid checkpoint, or None when it is.

    Single-file format: the marker must be a JSON object naming exactly ``FILES``, each with a
    sha256 hex digest that matches the stored file: an empty object, a list or a partial list is
    not a commit. Sharded format (``sharded_checkpoint.py``): it names meta.json and every
    process's manifest, and the manifests together name every file of every leaf, each verified.
    """
    fs, path = _fs(folder)
    try:
        with fs.open(join(path, MARKER), "rb") as f:
            expected = json.loads(f.read())
    except (OSError, ValueError) as e:
        return f"unreadable {MARKER} ({e.__class__.__name__})"

    def check(name: str, digest) -> str | None:
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            return f"{MARKER}: {name} has no sha256 digest"
        try:
            if sha256_of(fs, join(path, name)) != digest:
                return f"{name} does not match its checksum"
        except OSError as e:
            return f"{name} unreadable ({e.__class__.__name__})"
        return None

    if isinstance(expected, dict) and sharded.is_sharded_marker(expected):
        return sharded.problem(folder, expected, check)
    if not isinstance(expected, dict) or sorted(expected) != sorted(FILES):
        return f"{MARKER} must map exactly {list(FILES)} to sha256 digests"
    for name in FILES:
        found = check(name, expected[name])
        if found is not None:
            return found
    return None


def is_sharded(folder: str | os.PathLike) -> bool:
    """Whether a (verified) checkpoint folder is in the sharded format."""
    fs, path = _fs(folder)
    return not fs.exists(join(path, "state.npz")) and sharded.read_meta(folder).get("format") == sharded.FORMAT


def is_valid(folder: str | os.PathLike) -> bool:
    return marker_problem(folder) is None


def list_checkpoints(root: str | os.PathLike) -> list[Path | str]:
    fs, base = _fs(root)
    if not fs.isdir(base):
        return []
    found = [e["name"].rstrip("/") for e in fs.ls(base, detail=True) if e["type"] == "directory"]
    steps = [name for name in (p.rsplit("/", 1)[-1] for p in found) if re.fullmatch(r"step-[0-9]+", name)]
    return [child(root, name) for name in sorted(steps, key=lambda name: int(name.split("-")[1]))]


def latest_valid(root: str | os.PathLike) -> Path | str | None:
    """Newest checkpoint whose marker and checksums verify; corrupt ones are skipped with a warning."""
    for folder in reversed(list_checkpoints(root)):
        problem = marker_problem(folder)
        if problem is None:
            return folder
        log.warning("skipping %s: not a valid checkpoint (%s)", folder, problem)
    return None


def prune_temporary(root: str | os.PathLike, keep: str) -> None:
    fs, base = _fs(root)
    for folder in list_checkpoints(root):
        path = _fs(folder)[1]
        if path.rsplit("/", 1)[-1] == keep:
            continue
        try:
            with fs.open(join(path, "meta.json"), "rb") as f:
                kind = json.loads(f.read()).get("kind")
        except (OSError, ValueError):
            continue  # leave unreadable ones for latest_valid to report
        if kind == "temporary":
            fs.rm(path, recursive=True)
    for stale in fs.glob(join(base, ".staging-*")):
        fs.rm(stale, recursive=True)


def load(folder: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict]:
    """(key -> whole host array, meta) of a checkpoint of either format; raises if it does not verify."""
    problem = marker_problem(folder)
    if problem is not None:
        raise ValueError(f"checkpoint {folder} is corrupt or incomplete: {problem}")
    if is_sharded(folder):
        meta = sharded.read_meta(folder)
        return sharded.load_arrays(folder, meta), meta
    fs, path = _fs(folder)
    with fs.open(join(path, "meta.json"), "rb") as f:
        meta = json.loads(f.read())
    with fs.open(join(path, "state.npz"), "rb") as f, np.load(f) as z:
        arrays = {}
        for i, (key, dtype) in enumerate(zip(meta["keys"], meta["dtypes"], strict=True)):
            x = z[f"a{i}"]
            arrays[key] = x.view(ml_dtypes.bfloat16) if dtype == "bfloat16" else x
    return arrays, meta


def restore_like(template, arrays: dict[str, np.ndarray], prefix: str = "", where: str = "checkpoint"):
    """Fill ``template``'s tree with the saved arrays whose keys are ``prefix + key``."""
    pairs, treedef = jax.tree_util.tree_flatten_with_path(template)
    leaves = []
    for path, leaf in pairs:
        key = prefix + jax.tree_util.keystr(path)
        if key not in arrays:
            raise ValueError(f"{where}: no saved array for {key}; the model/optimizer structure differs")
        saved = arrays[key]
        # the template may hold arrays or jax.ShapeDtypeStruct (from jax.eval_shape)
        dtype = np.dtype(leaf.dtype) if hasattr(leaf, "dtype") else np.asarray(leaf).dtype
        shape = tuple(leaf.shape) if hasattr(leaf, "shape") else np.shape(leaf)
        if tuple(saved.shape) != shape or saved.dtype != dtype:
            raise ValueError(f"{where}: {key} saved as {saved.dtype}{list(saved.shape)}, expected {dtype}{list(shape)}")
        leaves.append(saved)
    return jax.tree_util.tree_unflatten(treedef, leaves)
