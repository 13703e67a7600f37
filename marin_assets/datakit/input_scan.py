"""Which files an input path holds: the one entry policy, shared by ``marin datakit run --input``
(``scan_input``) and the watched folder (watched_dir.py applies ``local_entry_problem`` and
prints names through ``shown_name``)."""

from __future__ import annotations

import os
import stat


def list_input_files(path: str) -> list[str]:
    """The readable files under `path` (see ``scan_input``), sorted, as URLs."""
    return scan_input(path)[0]


def shown_name(name: str) -> str:
    """A file name as it is safe to print: control characters and undecodable bytes escaped,
    so a name cannot forge a log line (a newline) or break a UTF-8 terminal."""
    shown = name.encode("utf-8", "backslashreplace").decode("utf-8")
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in shown)


def scan_input(path: str) -> tuple[list[str], dict[str, str]]:
    """(readable files, {skipped entry: why}) under `path` (a file or a directory, any fsspec URL).

    Inside a directory, names starting with "_" or "." are sidecars (_counts.json, _SUCCESS,
    .DS_Store, as in Hadoop/Spark layouts) and are not listed. On a local disk the same rules
    as the watched directory apply (watched_dir.scan), and an entry that breaks one is skipped
    and counted, never read: a symlink whose target leaves the input (or is not a regular
    file: a directory, a loop), a FIFO, socket or device (reading one would block), and a
    name that is not valid UTF-8 or holds control characters. Everything else is read or
    quarantined record by record.
    """
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    if _is_local(fs):
        return _scan_local(root, path)
    if not fs.exists(root):
        raise FileNotFoundError(f"input path does not exist: {path}")
    files = sorted(p for p in fs.find(root) if not _is_sidecar(p[len(root) :])) if fs.isdir(root) else [root]
    return [fs.unstrip_protocol(p) for p in files], {}


def _scan_local(root: str, given: str) -> tuple[list[str], dict[str, str]]:
    if not os.path.lexists(root):
        raise FileNotFoundError(f"input path does not exist: {given}")
    if not os.path.isdir(root) or os.path.islink(root) and not os.path.isdir(os.path.realpath(root)):
        why = local_entry_problem(root, os.path.dirname(os.path.realpath(root)))
        if why:
            raise ValueError(f"input {shown_name(given)}: {why}")
        return [root], {}
    real_root = os.path.realpath(root)
    files, skipped = [], {}
    for folder, dirs, names in os.walk(root, followlinks=False):
        links = [d for d in dirs if os.path.islink(os.path.join(folder, d))]  # reported, never descended
        dirs[:] = sorted(d for d in dirs if d not in links and not d.startswith(("_", ".")))
        for entry in sorted([*names, *links]):
            if entry.startswith(("_", ".")):
                continue
            full = os.path.join(folder, entry)
            why = local_entry_problem(full, real_root)
            if why:
                skipped[shown_name(os.path.relpath(full, root))] = why
            else:
                files.append(full)
    return sorted(files), skipped


def local_entry_problem(full: str, real_root: str) -> str | None:
    """Why a local input entry is not read, or None for a regular file we may read."""
    name = os.path.basename(full)
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "its name is not valid UTF-8"
    if not name.isprintable():
        return "its name holds control characters (a newline, a tab...)"
    real = os.path.realpath(full)
    if os.path.islink(full) and real != real_root and os.path.commonpath([real_root, real]) != real_root:
        return f"a symlink to {shown_name(real)}, outside the input (links are followed only inside it)"
    try:
        mode = os.stat(full).st_mode
    except OSError as e:
        return f"cannot be read ({e.strerror}: a broken or looping symlink?)"
    if stat.S_ISDIR(mode):
        return "a symlink to a directory (not followed)"
    if not stat.S_ISREG(mode):
        return "not a regular file (a FIFO, socket or device: reading it could block forever)"
    return None


def _is_sidecar(relative: str) -> bool:
    return any(part.startswith(("_", ".")) for part in relative.strip("/").split("/"))


def _is_local(fs) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")
