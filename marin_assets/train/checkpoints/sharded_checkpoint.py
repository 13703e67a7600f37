"""Sharded, asynchronous checkpoints: every process writes only the shards it owns, through tensorstore.

Layout of one checkpoint (the folder ``checkpoint.py`` names ``step-NNNNNNNNN``)::

    meta.json                    what checkpoint.py's meta holds, plus format, num_processes and each
                                 leaf's chunk shape (the shard shape of the mesh that saved it)
    arrays/a<i>/                 leaf i as a zarr v2 array (uncompressed, one chunk per distinct shard)
    shards/process-<p>.json      {file: sha256} of every file process p wrote (its chunks; process 0
                                 also the arrays' .zarray metadata)
    COMMITTED                    sha256 of meta.json and of every process manifest, written last

No leaf is gathered to a host: a process copies the shards it owns to host memory (the next step
donates the device buffers), and a background thread writes them while training goes on. A shard
replicated on several processes (today every non-expert leaf) is written once, by one of its
holders chosen round-robin over leaves, so replicated state is spread over the processes too.
tensorstore's file store fsyncs each write (``file_io_sync``). When every process has written its
manifest (a host barrier of the coordination service), process 0 writes the marker: a process
killed at any point before that leaves a folder without a valid marker, which
``checkpoint.latest_valid`` skips, so the previous checkpoint stays the newest valid one.

Restoring reads, on each process, only the slices its devices hold under the *target* shardings,
so a checkpoint saved on one mesh (2 processes x 2 devices) restores onto another (1 x 4, 1 x 1).
Stores: a local disk and ``gs://`` (tensorstore's file and gcs kvstores, ``fsutil.kvstore_spec``);
any other fsspec URL (``memory://``) keeps the single-file format of ``checkpoint.save``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
import os
import re
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np

from marin_assets.store.fsutil import child, filesystem, join, kvstore_spec
from marin_assets.train.checkpoints import checkpoint as ckpt
from marin_assets.train.distributed import hosts as distributed

log = logging.getLogger(__name__)

FORMAT = "sharded-zarr-v1"
MANIFEST = re.compile(r"shards/process-([0-9]{5})\.json")
_SAVES = itertools.count()  # the same sequence on every process: names the save's barriers


def supported(root: str | os.PathLike) -> bool:
    """Whether tensorstore can write checkpoints under ``root`` (a local dir or ``gs://``)."""
    try:
        kvstore_spec(os.fspath(root))
    except ValueError:
        return False
    return True


def manifest_name(process: int) -> str:
    return f"shards/process-{process:05d}.json"


def _dtype_name(dtype) -> str:
    dtype = np.dtype(dtype)
    return "bfloat16" if dtype == ml_dtypes.bfloat16 else dtype.str


def _array_spec(folder: str | os.PathLike, leaf: int) -> dict:
    """The tensorstore spec that opens leaf ``leaf``'s zarr array."""
    return {"driver": "zarr", "kvstore": kvstore_spec(os.fspath(child(folder, "arrays", f"a{leaf}")))}


def _create_spec(folder: str | os.PathLike, leaf: int, shape: list[int], chunks: list[int], dtype: str) -> dict:
    """The spec that creates (or, with assume_metadata, writes into) leaf ``leaf``'s array."""
    metadata = {
        "shape": list(shape),
        "chunks": list(chunks),
        "dtype": _dtype_name(dtype),
        "compressor": None,
        "order": "C",
        "dimension_separator": ".",
    }
    # every chunk is stored, even one equal to the fill value: the manifests name them all
    return dict(_array_spec(folder, leaf), metadata=metadata, store_data_equal_to_fill_value=True)


def _context():
    import tensorstore as ts

    return ts.Context({"file_io_sync": True})


def _bounds(index: tuple, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    return tuple((s.start or 0, dim if s.stop is None else s.stop) for s, dim in zip(index, shape, strict=True))


def chunk_key(bounds: tuple[tuple[int, int], ...], chunks: tuple[int, ...]) -> str:
    """The zarr v2 file name of the chunk starting at ``bounds`` ("0" for a scalar)."""
    return ".".join(str(lo // c) for (lo, _), c in zip(bounds, chunks, strict=True)) or "0"


def chunk_keys(shape: tuple[int, ...], chunks: tuple[int, ...]) -> list[str]:
    """Every chunk file of an array (none when a dimension is empty)."""
    if any(d == 0 for d in shape):
        return []
    grid = [range(-(-d // c)) for d, c in zip(shape, chunks, strict=True)]
    return [".".join(map(str, ix)) or "0" for ix in itertools.product(*grid)]


@dataclasses.dataclass
class _Piece:
    """One shard this process writes: leaf, where in it, and a host copy of its data."""

    leaf: int
    bounds: tuple[tuple[int, int], ...]
    data: np.ndarray


def _leaf_plan(i: int, x) -> tuple[tuple[int, ...], list[_Piece]]:
    """(chunk shape, the pieces this process writes) of leaf ``i``."""
    me = jax.process_index()
    if not isinstance(x, jax.Array):
        x = np.asarray(x)
        return tuple(max(1, d) for d in x.shape), (
            [_Piece(i, _bounds((slice(None),) * x.ndim, x.shape), x.copy())] if me == 0 else []
        )
    shape = tuple(x.shape)
    holders: dict[tuple, set[int]] = {}
    for device, index in x.sharding.devices_indices_map(shape).items():
        holders.setdefault(_bounds(index, shape), set()).add(device.process_index)
    extents = {tuple(hi - lo for lo, hi in b) for b in holders}
    if len(extents) != 1:
        raise ValueError(f"leaf {i} {shape}: uneven shards {sorted(extents)} cannot be zarr chunks")
    chunks = tuple(max(1, d) for d in extents.pop())
    mine = set()
    for j, bounds in enumerate(sorted(holders)):
        procs = sorted(holders[bounds])
        if procs[(i + j) % len(procs)] == me:  # spread replicated shards over their holders
            mine.add(bounds)
    pieces, seen = [], set()
    for shard in x.addressable_shards:
        bounds = _bounds(shard.index, shape)
        if bounds in mine and bounds not in seen:
            seen.add(bounds)
            pieces.append(_Piece(i, bounds, np.array(shard.data)))  # a copy: the next step donates the buffer
    return chunks, pieces


class CheckpointNotWritten(RuntimeError):
    """A save failed before its commit (a full disk, a lost mount): the folder is not a checkpoint, the
    older ones stand. ``cause`` is the writer's own error."""

    def __init__(self, folder: Path | str, cause: BaseException) -> None:
        super().__init__(f"checkpoint {folder} was not written: {cause}")
        self.folder, self.cause = folder, cause


class PendingSave:
    """A checkpoint being written in the background; ``wait()`` returns its folder once committed."""

    def __init__(self, folder: Path | str, work: Callable[[], None] | None) -> None:
        self.folder, self._error = folder, None
        self._thread = None
        if work is not None:
            self._thread = threading.Thread(target=self._run, args=(work,), name=f"checkpoint-{folder}", daemon=True)
            self._thread.start()

    def _run(self, work: Callable[[], None]) -> None:
        try:
            work()
        except BaseException as e:  # re-raised on the training thread by wait()
            self._error = e

    def done(self) -> bool:
        return self._thread is None or not self._thread.is_alive()

    def wait(self) -> Path | str:
        """Block until the checkpoint is committed (on every process); raise the writer's error."""
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise CheckpointNotWritten(self.folder, self._error) from self._error
        return self.folder


def _barrier(name: str) -> None:
    distributed.barrier(name)


def _agree(value: bool) -> bool:
    return bool(distributed.agree(value))


def start_save(
    root: str | os.PathLike,
    step: int,
    state: Mapping[str, Any],
    meta: dict,
    kind: str = "permanent",
    on_commit: Callable[[], None] | None = None,
) -> PendingSave:
    """Start writing ``state`` (global arrays) as the checkpoint of ``step``; a collective: every
    process calls it alike. Returns once this process's shards are copied to host memory;
    ``PendingSave.wait()`` returns once the marker is written. ``on_commit`` runs on process 0
    after the marker (e.g. pruning older temporaries)."""
    if kind not in ("temporary", "permanent"):
        raise ValueError(f"checkpoint kind must be temporary or permanent, got {kind!r}")
    n, name = next(_SAVES), f"step-{step:09d}"
    folder, writer = child(root, name), jax.process_index() == 0
    fs, path = filesystem(os.fspath(folder))
    if _agree(writer and fs.exists(path) and ckpt.marker_problem(folder) is None):
        return PendingSave(folder, None)  # the same step is already safely stored
    if writer:
        if fs.exists(path):
            fs.rm(path, recursive=True)  # an invalid leftover from a crash
        fs.makedirs(path, exist_ok=True)
    _barrier(f"ckpt-{n}-begin")  # nobody writes into the folder before the leftover is gone
    keys, leaves = zip(*[(jax.tree_util.keystr(p), x) for p, x in jax.tree_util.tree_flatten_with_path(state)[0]], strict=True)
    plans = [_leaf_plan(i, x) for i, x in enumerate(leaves)]
    full_meta = dict(
        meta,
        step=int(step),
        kind=kind,
        format=FORMAT,
        num_processes=jax.process_count(),
        keys=list(keys),
        dtypes=[str(np.dtype(x.dtype)) for x in leaves],
        shapes=[list(x.shape) for x in leaves],
        chunks=[list(c) for c, _ in plans],
    )
    pieces = [p for _, ps in plans for p in ps]
    return PendingSave(folder, lambda: _write_and_commit(folder, n, full_meta, pieces, on_commit))


def _write_and_commit(folder, n: int, meta: dict, pieces: list[_Piece], on_commit) -> None:
    """The background half of a save: this process's shards and manifest, then (process 0) the marker.

    A process whose writes fail still meets the others at both barriers (so no peer waits out the
    barrier timeout) but writes no manifest: process 0 then writes no marker and raises."""
    fs, path = filesystem(os.fspath(folder))
    me, failure = jax.process_index(), None
    try:
        files = _write_pieces(folder, meta, pieces)
        fs.makedirs(join(path, "shards"), exist_ok=True)
        ckpt.write_durable(fs, join(path, manifest_name(me)), json.dumps({"files": files}, sort_keys=True).encode())
    except Exception as e:  # raised below, after the barriers
        failure = e
    _barrier(f"ckpt-{n}-written")
    try:
        if me == 0 and failure is None:
            _commit(folder, meta)
            if on_commit is not None:
                on_commit()
    finally:
        _barrier(f"ckpt-{n}-committed")
    if failure is not None:
        raise failure


def _write_pieces(folder, meta: dict, pieces: list[_Piece]) -> dict[str, str]:
    """Write this process's shards (all at once: tensorstore overlaps them); {file: sha256} of what it wrote."""
    import tensorstore as ts

    context, files, writes = _context(), {}, []
    opened: dict[int, Any] = {}
    if jax.process_index() == 0:
        fs, path = filesystem(os.fspath(folder))
        meta_bytes = json.dumps(meta, indent=1, sort_keys=True).encode()
        ckpt.write_durable(fs, join(path, "meta.json"), meta_bytes)
        for i, (shape, chunks, dtype) in enumerate(zip(meta["shapes"], meta["chunks"], meta["dtypes"], strict=True)):
            opened[i] = ts.open(_create_spec(folder, i, shape, chunks, dtype), create=True, context=context).result()
            files[f"arrays/a{i}/.zarray"] = ckpt.sha256_of(fs, join(path, "arrays", f"a{i}", ".zarray"))
    for piece in pieces:
        i = piece.leaf
        if piece.data.size == 0:
            continue  # an empty array has no chunks
        if i not in opened:
            spec = _create_spec(folder, i, meta["shapes"][i], meta["chunks"][i], meta["dtypes"][i])
            opened[i] = ts.open(spec, assume_metadata=True, context=context).result()
        index = tuple(slice(lo, hi) for lo, hi in piece.bounds)
        writes.append(opened[i][index].write(piece.data))
        data = np.ascontiguousarray(piece.data)  # an uncompressed C-order chunk is exactly these bytes
        files[f"arrays/a{i}/{chunk_key(piece.bounds, tuple(meta['chunks'][i]))}"] = hashlib.sha256(data.tobytes()).hexdigest()
    for w in writes:
        w.result()
    return files


def _commit(folder, meta: dict) -> None:
    """Process 0, once every process has written its manifest: the marker, naming their digests."""
    fs, path = filesystem(os.fspath(folder))
    marker = {"meta.json": ckpt.sha256_of(fs, join(path, "meta.json"))}
    for p in range(meta["num_processes"]):
        name = manifest_name(p)
        if not fs.exists(join(path, name)):
            raise RuntimeError(f"process {p} wrote no {name}: its shards are not known to be durable")
        marker[name] = ckpt.sha256_of(fs, join(path, name))
    ckpt.write_durable(fs, join(path, ckpt.MARKER), json.dumps(marker).encode())


# -- verifying and reading -------------------------------------------------------------------


def is_sharded_marker(marker: Mapping[str, Any]) -> bool:
    """A marker of this format: meta.json plus process manifests only."""
    names = [k for k in marker if k != "meta.json"]
    return "meta.json" in marker and bool(names) and all(MANIFEST.fullmatch(k) for k in names)


def expected_files(meta: Mapping[str, Any]) -> set[str]:
    """Every file the manifests of a checkpoint with ``meta`` must name together."""
    out = set()
    for i, (shape, chunks) in enumerate(zip(meta["shapes"], meta["chunks"], strict=True)):
        out.add(f"arrays/a{i}/.zarray")
        out.update(f"arrays/a{i}/{key}" for key in chunk_keys(tuple(shape), tuple(chunks)))
    return out


def problem(folder: str | os.PathLike, marker: Mapping[str, Any], check_digest: Callable[[str, Any], str | None]) -> str | None:
    """Why a sharded checkpoint is not valid (None when it is), given its parsed marker;
    ``check_digest(name, digest)`` verifies one file against a digest."""
    for name in sorted(marker):
        found = check_digest(name, marker[name])
        if found is not None:
            return found
    fs, path = filesystem(os.fspath(folder))
    try:
        with fs.open(join(path, "meta.json"), "rb") as f:
            meta = json.loads(f.read())
        if meta.get("format") != FORMAT:
            return f"meta.json format is {meta.get('format')!r}, expected {FORMAT}"
        manifests = sorted(k for k in marker if k != "meta.json")
        if manifests != [manifest_name(p) for p in range(int(meta["num_processes"]))]:
            return f"{ckpt.MARKER} must name the manifests of all {meta['num_processes']} processes"
        listed: dict[str, str] = {}
        for name in manifests:
            with fs.open(join(path, name), "rb") as f:
                listed.update(json.loads(f.read())["files"])
        missing = expected_files(meta) - set(listed)
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"unreadable meta.json or manifest ({e.__class__.__name__})"
    if missing:
        return f"no process wrote {sorted(missing)[0]}"
    for name in sorted(listed):
        found = check_digest(name, listed[name])
        if found is not None:
            return found
    return None


def read_meta(folder: str | os.PathLike) -> dict:
    fs, path = filesystem(os.fspath(folder))
    with fs.open(join(path, "meta.json"), "rb") as f:
        return json.loads(f.read())


def load_arrays(folder: str | os.PathLike, meta: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Every leaf whole, as host arrays (tools that need the whole state: eval, transplant)."""
    import tensorstore as ts

    context = _context()
    futures = {
        key: ts.open(_array_spec(folder, i), open=True, context=context).result().read() for i, key in enumerate(meta["keys"])
    }
    return {key: np.asarray(f.result()) for key, f in futures.items()}


def restore(folder: str | os.PathLike, meta: Mapping[str, Any], template, shardings, prefix: str = "", where: str = "checkpoint"):
    """``template``'s tree (arrays or ShapeDtypeStructs) filled from the checkpoint's leaves named
    ``prefix + key``, each laid out by its sharding in ``shardings`` (a tree like ``template``):
    every process reads only the slices its devices hold."""
    import tensorstore as ts

    index_of = {key: i for i, key in enumerate(meta["keys"])}
    pairs, treedef = jax.tree_util.tree_flatten_with_path(template)
    context, pending = _context(), []
    for (path, leaf), sharding in zip(pairs, jax.tree_util.tree_leaves(shardings), strict=True):
        key = prefix + jax.tree_util.keystr(path)
        if key not in index_of:
            raise ValueError(f"{where}: no saved array for {key}; the model/optimizer structure differs")
        i = index_of[key]
        shape, dtype = tuple(leaf.shape), np.dtype(leaf.dtype)
        if tuple(meta["shapes"][i]) != shape or meta["dtypes"][i] != str(dtype):
            raise ValueError(
                f"{where}: {key} saved as {meta['dtypes'][i]}{list(meta['shapes'][i])}, expected {dtype}{list(shape)}"
            )
        store = ts.open(_array_spec(folder, i), open=True, context=context).result()
        reads = [(d, store[tuple(index)].read()) for d, index in sharding.addressable_devices_indices_map(shape).items()]
        pending.append((shape, sharding, reads))
    leaves = [
        jax.make_array_from_single_device_arrays(shape, sharding, [jax.device_put(f.result(), d) for d, f in reads])
        for shape, sharding, reads in pending
    ]
    return jax.tree_util.tree_unflatten(treedef, leaves)
