"""Tiny, real Levanter caches for the tests, from text that ships with Python.

One writer: the DataKit's (``marin_assets.datakit.levanter_cache.CacheWriter``), in its byte
tokenizer's ids (tests/support/byte_tokens.py: UTF-8 bytes, then EOS 256), so a ``vocab_size``
257 model trains on them. Levanter's own reader opens them (tests/train/test_data.py).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

from tests.support.byte_tokens import byte_ids

BATCH_DOCS = 16  # documents per write_batch: a cache of several batches, as tokenize writes them
STDLIB_MODULES = ("json", "argparse", "dataclasses", "functools", "pathlib")


def stdlib_paragraphs(name: str = "LICENSE.txt", limit: int | None = None) -> list[str]:
    """The paragraphs (blank-line separated, over 20 characters) of a text file in Python's
    standard-library folder; the first ``limit`` of them when given."""
    folder = Path(sys.base_prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    paras = [p.strip() for p in (folder / name).read_text().split("\n\n") if len(p.strip()) > 20]
    return paras[:limit] if limit else paras


def stdlib_module_docs(modules: Sequence[str] = STDLIB_MODULES) -> list[str]:
    """The paragraphs (over 20 characters) of standard-library modules' docstrings."""
    out = []
    for name in modules:
        doc = importlib.import_module(name).__doc__ or ""
        out += [p.strip() for p in doc.split("\n\n") if len(p.strip()) > 20]
    return out


def write_cache(cache_dir: str | Path, docs: Sequence[str]) -> int:
    """A finished one-field Levanter cache at ``cache_dir`` (a local path or an fsspec URL) with
    one row per document; returns the number of tokens written."""
    from marin_assets.datakit.levanter_cache import CacheWriter

    with CacheWriter(str(cache_dir)) as writer:
        for start in range(0, len(docs), BATCH_DOCS):
            writer.write_batch({"input_ids": [byte_ids(doc) for doc in docs[start : start + BATCH_DOCS]]})
    return writer.tokens
