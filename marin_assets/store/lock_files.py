"""Write-once lock files in the artifact store: what freezes an experiment record, and a frozen prediction.

``<root>/experiments/<name>/LOCK.json`` holds a record's frozen fields and their content hash, and
``locks/<arm>.json`` beside it an arm's; each is written whole, once, and never rewritten. Reading one
validates it: a file that is not what marin wrote (``null``, ``{}``, bad JSON, a hash that does not match
its fields) is a ``LockFileError`` naming it, never "no lock".

Two users, which is why it lives here, below both: ``experiments/lock.py`` (an experiment record's freeze,
its run stamps and checks) and ``scaling/extrapolation.py`` (a prediction registered as the experiment
``scaling_<ladder>_<target>_<version>``). See docs/layers.md.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, cast

from marin_assets.store.artifact import ArtifactStore
from marin_assets.store.fsutil import join
from marin_assets.store.versioning import canonical_json

LOCK_FILE = "LOCK.json"
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class RecordChangedError(ValueError):
    """A started experiment's record was edited in a frozen field."""


class LockFileError(ValueError):
    """A lock file or run stamp that is not what marin wrote; the freeze it held cannot be trusted."""


def content_hash(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


def experiment_dir(store: ArtifactStore, name: str) -> str:
    return join(store.root, "experiments", name)


def lock_path(store: ArtifactStore, name: str) -> str:
    return join(experiment_dir(store, name), LOCK_FILE)


def arm_lock_path(store: ArtifactStore, name: str, arm: str) -> str:
    return join(experiment_dir(store, name), "locks", f"{arm}.json")


REWRITE_HINT = (
    "lock files are written once by marin and never edited: restore it, or delete it to have it rebuilt from the runs' own stamps"
)


def short_json(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def hashed(value: Any, frozen_key: str, hash_key: str) -> bool:
    """``value[frozen_key]`` is a mapping whose content hash is ``value[hash_key]``."""
    frozen, digest = value.get(frozen_key), value.get(hash_key)
    return (
        isinstance(frozen, dict)
        and isinstance(digest, str)
        and bool(SHA256_HEX.fullmatch(digest))
        and content_hash(frozen) == digest
    )


def read_lock_file(store: ArtifactStore, path: str) -> Any:
    """The parsed file, or None when there is none; bad bytes are a LockFileError naming it."""
    try:
        with store.fs.open(path, "rb") as f:
            raw = cast(bytes, f.read())  # opened "rb"
    except FileNotFoundError:
        return None
    try:
        value = json.loads(raw.decode("utf-8"))
    except ValueError as err:  # JSONDecodeError and UnicodeDecodeError
        raise LockFileError(f"{path}: not JSON ({err}); {REWRITE_HINT}") from None
    if value is None:  # `null` written into the file is not "no lock"
        raise LockFileError(f"{path}: holds null, not a lock; {REWRITE_HINT}")
    return value


def read_lock(store: ArtifactStore, name: str) -> dict | None:
    """LOCK.json of experiment ``name`` (validated), or None before its first run."""
    path = lock_path(store, name)
    lock = read_lock_file(store, path)
    if lock is None:
        return None
    if not isinstance(lock, dict) or lock.get("experiment") != name or not hashed(lock, "frozen", "frozen_hash"):
        raise LockFileError(
            f"{path}: not the lock of experiment {name!r} (an object with 'experiment', 'frozen' "
            f"and its 'frozen_hash'), got {short_json(lock)}; {REWRITE_HINT}"
        )
    return lock


def locked_arms(store: ArtifactStore, name: str) -> dict[str, dict]:
    """Each started arm's lock (validated), by arm name."""
    root = join(experiment_dir(store, name), "locks")
    if not store.fs.exists(root):
        return {}
    out = {}
    for path in sorted(store.fs.ls(root, detail=False)):
        if not path.endswith(".json"):
            continue
        arm = read_lock_file(store, path)
        stem = path.rstrip("/").rsplit("/", 1)[-1][: -len(".json")]
        if not isinstance(arm, dict) or arm.get("arm") != stem or not hashed(arm, "frozen", "hash"):
            raise LockFileError(
                f"{path}: not the lock of arm {stem!r} (an object with 'arm', 'frozen' and its "
                f"'hash'), got {short_json(arm)}; {REWRITE_HINT}"
            )
        out[stem] = arm
    return out
