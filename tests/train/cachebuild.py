"""Build tiny, real Levanter caches from text that ships with Python (tests only).

Byte-level tokens: each paragraph's UTF-8 bytes followed by EOS = 0 (NUL never occurs in
the text), so ``vocab_size = 256`` models can train on them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

EOS = 0


def stdlib_paragraphs(name: str = "LICENSE.txt", limit: int | None = None) -> list[str]:
    text = (Path(sys.base_prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / name).read_text()
    paras = [p.strip() for p in text.split("\n\n") if len(p.strip()) > 20]
    return paras[:limit] if limit else paras


def stdlib_module_docs(modules=("json", "argparse", "dataclasses", "functools", "pathlib")) -> list[str]:
    import importlib

    out = []
    for m in modules:
        doc = importlib.import_module(m).__doc__ or ""
        out += [p.strip() for p in doc.split("\n\n") if len(p.strip()) > 20]
    return out


def encode(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8") + bytes([EOS]), dtype=np.uint8).astype(np.int32)


def write_cache(cache_dir: Path, docs: list[str]) -> Path:
    from levanter.store.cache import SerialCacheWriter

    with SerialCacheWriter(str(cache_dir), {"input_ids": np.zeros((0,), np.int32)}) as writer:
        for i in range(0, len(docs), 16):
            writer.write_batch([{"input_ids": encode(d)} for d in docs[i:i + 16]])
    return cache_dir
