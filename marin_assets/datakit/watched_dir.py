"""A directory of users' files, scanned: what the new_user_shards sensor and sources/user read.

The same entry policy as a ``marin datakit run --input`` folder (input_scan.scan_input): an
entry whose real path leaves the directory (a symlink to /etc/passwd, say), a FIFO or other
non-regular file, a name that is not valid UTF-8 or is not a valid path segment, or an
extension the readers do not read is skipped with the reason, never silently.
"""

from __future__ import annotations

import hashlib
import json
import os

from marin_assets.datakit.input_scan import local_entry_problem, shown_name
from marin_assets.datakit.readers import SUPPORTED_SUFFIXES
from marin_assets.store import validate_segment
from marin_assets.store.fsutil import real_path_inside, sha256_file

SUFFIXES = SUPPORTED_SUFFIXES  # a file is usable when the readers read it
WATCH_ENV = "MARIN_USER_DATA_DIR"


def scan(directory: str) -> tuple[dict[str, str], dict[str, str]]:
    """({file: sha256} of usable files, {file: why skipped}) in ``directory``."""
    usable, skipped = {}, {}
    root = os.path.realpath(directory)
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if name.startswith(".") or (os.path.isdir(path) and not os.path.islink(path)):
            continue
        why = local_entry_problem(path, root)
        if why is None:
            try:
                validate_segment(name, "file name")
            except ValueError as err:
                why = str(err)
        if why is not None:
            skipped[shown_name(name)] = why
            continue
        real = real_path_inside(directory, name)
        if not name.endswith(SUFFIXES):
            skipped[name] = f"unsupported extension (want one of {', '.join(SUFFIXES)})"
        else:
            usable[name] = sha256_file(real)
    return usable, skipped


def directory_digest(files: dict[str, str]) -> str:
    """The content version of a scanned directory: sha256 over its {file name: sha256}
    (names and bytes; not paths, times or the order of the listing)."""
    return hashlib.sha256(json.dumps(dict(sorted(files.items())), sort_keys=True).encode()).hexdigest()[:32]
