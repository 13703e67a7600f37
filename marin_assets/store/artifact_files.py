"""An asset's files: read from a committed artifact's data folder, written into a run's output
folder (any fsspec URL). Thin over ``marin_assets.store.fsutil``: one way to join, open and
write atomically, shared with the store.
"""

from __future__ import annotations

from marin_assets.store import ArtifactRef
from marin_assets.store.fsutil import filesystem, join, write_bytes_atomic
from marin_assets.store.fsutil import read_json as read_json_at


def read_bytes(ref: ArtifactRef, name: str) -> bytes:
    """``name`` under the artifact's data folder; FileNotFoundError names the file."""
    fs, path = filesystem(join(ref.data_path, name))
    data = fs.cat_file(path)
    return data if isinstance(data, bytes) else data.encode("utf-8")  # fsspec's cat_file is typed str | bytes


def read_json(ref: ArtifactRef, name: str) -> dict:
    """``name`` (a JSON file) under the artifact's data folder; a missing file is an error naming it."""
    fs, path = filesystem(join(ref.data_path, name))
    value = read_json_at(fs, path)
    if value is None:
        raise FileNotFoundError(f"{join(ref.data_path, name)}: no such file in {ref.asset_key}")
    return value


def write_file(root: str, name: str, data: str | bytes) -> None:
    """Write ``root/name``, text (UTF-8) or bytes, atomically: readers see the whole file or none.
    Missing folders are made (a sweep run's output folder may not exist yet)."""
    fs, path = filesystem(join(root, name))
    fs.makedirs(path.rsplit("/", 1)[0] or "/", exist_ok=True)
    write_bytes_atomic(fs, path, data.encode("utf-8") if isinstance(data, str) else data)
