"""Atomic checkpoints of the whole train state as one .npz per checkpoint.

Layout under ``<out>/checkpoints/``::

    step-000000120/
        state.npz      every leaf of the train state pytree (params, optimizer state,
                       guard windows, router bias, RNG, step) as a0, a1, ...
        meta.json      step, kind (temporary|permanent), data position, phase info, the
                       leaf keys/dtypes/shapes, and anything else the caller adds
        COMMITTED      sha256 of state.npz and meta.json, written last

A checkpoint is written into a ``.staging-*`` folder and renamed into place, then the
COMMITTED marker is the last file: a process killed at any point leaves either no
``step-*`` folder, or one without a valid marker, which ``latest_valid`` skips with a
warning. Temporary checkpoints (time-based) are pruned when a newer one commits;
permanent ones (every N steps) are kept.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import uuid
from pathlib import Path

import jax
import ml_dtypes
import numpy as np

from marin_assets.store.fsutil import sha256_file

log = logging.getLogger(__name__)
MARKER = "COMMITTED"


def _write_fsync(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def flatten(state) -> tuple[list[str], list[np.ndarray]]:
    pairs, _ = jax.tree_util.tree_flatten_with_path(state)
    return [jax.tree_util.keystr(p) for p, _ in pairs], [np.asarray(x) for _, x in pairs]


def _to_storable(x: np.ndarray) -> np.ndarray:
    # npz cannot round-trip bfloat16: store its bits.
    return x.view(np.uint16) if x.dtype == ml_dtypes.bfloat16 else x


def save(root: str | os.PathLike, step: int, state, meta: dict, kind: str = "permanent") -> Path:
    """Write a checkpoint for ``step`` atomically; returns its folder."""
    if kind not in ("temporary", "permanent"):
        raise ValueError(f"checkpoint kind must be temporary or permanent, got {kind!r}")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:09d}"
    if final.exists() and is_valid(final):
        return final  # the same step is already safely on disk
    keys, leaves = flatten(jax.device_get(state))
    staging = root / f".staging-{step:09d}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    arrays = {f"a{i}": _to_storable(x) for i, x in enumerate(leaves)}
    with open(staging / "state.npz", "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    full_meta = dict(meta, step=int(step), kind=kind, keys=keys,
                     dtypes=[str(x.dtype) for x in leaves], shapes=[list(x.shape) for x in leaves])
    _write_fsync(staging / "meta.json", json.dumps(full_meta, indent=1, sort_keys=True).encode())
    if final.exists():
        shutil.rmtree(final)  # an invalid leftover from a crash
    os.rename(staging, final)
    marker = {"state.npz": sha256_file(final / "state.npz"), "meta.json": sha256_file(final / "meta.json")}
    _write_fsync(final / MARKER, json.dumps(marker).encode())
    _prune_temporary(root, keep=final)
    return final


FILES = ("meta.json", "state.npz")  # what a COMMITTED marker must list, exactly
_SHA256 = re.compile(r"[0-9a-f]{64}")


def marker_problem(folder: Path) -> str | None:
    """Why ``folder`` is not a valid checkpoint, or None when it is.

    The marker must be a JSON object naming exactly ``FILES``, each with a sha256 hex digest
    that matches the file on disk: an empty object, a list or a partial list is not a commit.
    """
    try:
        expected = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError) as e:
        return f"unreadable {MARKER} ({e.__class__.__name__})"
    if not isinstance(expected, dict) or sorted(expected) != sorted(FILES):
        return f"{MARKER} must map exactly {list(FILES)} to sha256 digests"
    for name in FILES:
        digest = expected[name]
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            return f"{MARKER}: {name} has no sha256 digest"
        try:
            if sha256_file(folder / name) != digest:
                return f"{name} does not match its checksum"
        except OSError as e:
            return f"{name} unreadable ({e.__class__.__name__})"
    return None


def is_valid(folder: Path) -> bool:
    return marker_problem(Path(folder)) is None


def list_checkpoints(root: str | os.PathLike) -> list[Path]:
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-")),
                  key=lambda p: int(p.name.split("-")[1]))


def latest_valid(root: str | os.PathLike) -> Path | None:
    """Newest checkpoint whose marker and checksums verify; corrupt ones are skipped with a warning."""
    for folder in reversed(list_checkpoints(root)):
        problem = marker_problem(folder)
        if problem is None:
            return folder
        log.warning("skipping %s: not a valid checkpoint (%s)", folder, problem)
    return None


def _prune_temporary(root: Path, keep: Path) -> None:
    for folder in list_checkpoints(root):
        if folder == keep:
            continue
        try:
            kind = json.loads((folder / "meta.json").read_text()).get("kind")
        except (OSError, ValueError):
            continue  # leave unreadable ones for latest_valid to report
        if kind == "temporary":
            shutil.rmtree(folder, ignore_errors=True)
    for stale in root.glob(".staging-*"):
        shutil.rmtree(stale, ignore_errors=True)


def load(folder: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict]:
    """(key -> array, meta) of a checkpoint; raises if it does not verify."""
    folder = Path(folder)
    problem = marker_problem(folder)
    if problem is not None:
        raise ValueError(f"checkpoint {folder} is corrupt or incomplete: {problem}")
    meta = json.loads((folder / "meta.json").read_text())
    with np.load(folder / "state.npz") as z:
        arrays = {}
        for i, (key, dtype) in enumerate(zip(meta["keys"], meta["dtypes"])):
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
            raise ValueError(f"{where}: {key} saved as {saved.dtype}{list(saved.shape)}, "
                             f"expected {dtype}{list(shape)}")
        leaves.append(saved)
    return jax.tree_util.tree_unflatten(treedef, leaves)
