"""The screens' corpus: Python standard-library sources as byte-level token caches.

It ships with every Python, so a screen needs no download. Each source file is one unit of
the split (a file goes to validation when the first 8 hex digits of sha256(file name)
fall in the lowest 10%), each paragraph (blank-line separated, > 40 characters) one
document: its UTF-8 bytes followed by EOS = 0, for ``vocab_size = 256`` models. The
caches are Levanter's format (``SerialCacheWriter``), as ``marin train`` reads them.
"""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

import numpy as np

EOS = 0
VOCAB_SIZE = 256
VALIDATION_FRACTION = 0.1


def stdlib_files(n_files: int) -> list[Path]:
    """The first ``n_files`` standard-library ``*.py`` files by name (same list every call)."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    if len(files) < n_files:
        raise ValueError(f"the standard library has {len(files)} top-level .py files, fewer than {n_files}")
    return files[:n_files]


def is_validation(name: str) -> bool:
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) < VALIDATION_FRACTION * 16**8


def split_files(files: list[Path]) -> dict[str, list[Path]]:
    """{"train", "validation"}; validation gets the last file if the hash picked none."""
    split = {"train": [f for f in files if not is_validation(f.name)],
             "validation": [f for f in files if is_validation(f.name)]}
    if not split["validation"]:
        split["validation"].append(split["train"].pop())
    return split


def documents(path: Path) -> list[bytes]:
    text = path.read_text(encoding="utf-8", errors="replace").replace("\0", "")
    return [p.encode("utf-8") for p in text.split("\n\n") if len(p.strip()) > 40]


def fingerprint(n_files: int) -> str:
    """sha256 over the files' names and bytes: the corpus's content version."""
    digest = hashlib.sha256()
    for f in stdlib_files(n_files):
        digest.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()


def build_caches(out_dir: str | Path, n_files: int) -> dict:
    """Write ``out_dir/{train,validation}`` caches; return their document/token counts."""
    from levanter.store.cache import SerialCacheWriter

    out = {}
    for split, files in split_files(stdlib_files(n_files)).items():
        docs = [d for f in files for d in documents(f)]
        with SerialCacheWriter(str(Path(out_dir) / split), {"input_ids": np.zeros((0,), np.int32)}) as writer:
            for i in range(0, len(docs), 256):
                writer.write_batch([{"input_ids": np.frombuffer(d + bytes([EOS]), np.uint8).astype(np.int32)}
                                    for d in docs[i:i + 256]])
        out[split] = {"files": len(files), "documents": len(docs), "tokens": sum(len(d) + 1 for d in docs)}
    return out
