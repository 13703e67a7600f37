"""Fuzzy dedup end to end: ours vs datasketch ``MinHash.bulk`` + ``MinHashLSH``.

Both sides get the same documents: paragraphs of real prose found offline (docstrings of
the Python standard library and installed packages, and the Python LICENSE), grouped into documents, plus planted near
duplicates made by random word edits. Both clean the text the same way and use character
5-grams, 286 permutations, 26 bands x 11 rows, seed 42.

- ours: shingle hashing + signatures + LSH + exact-Jaccard verification + components.
- reference: Python shingle sets + ``MinHash.bulk`` + ``MinHashLSH`` insert/query +
  union-find (no verification: datasketch has none, so it does strictly less work).

Prints one JSON line: {"name": "fuzzy_dedup", "unit": "docs/s", "ours", "reference",
"ratio", "docs", ...} with ratio = ours / reference (> 1: we are faster).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import sysconfig
import time

import numpy as np

from marin_assets.datakit.fuzzy_dedup import FuzzyDedupConfig, dedup_texts
from marin_assets.datakit.minhash import clean_text


_DOCSTRING = re.compile(r'"""(.*?)"""', re.DOTALL)


def _prose_paragraphs(limit: int) -> list[str]:
    """Unique paragraphs (>= 200 chars, mostly letters) of docstrings found offline: the
    Python standard library first, then installed packages, plus the Python LICENSE."""
    paths = sysconfig.get_paths()
    roots = [paths["stdlib"], paths["purelib"]]
    seen: set[str] = set()
    paragraphs: list[str] = []
    license_path = os.path.join(paths["stdlib"], "LICENSE.txt")
    sources = [license_path] if os.path.exists(license_path) else []
    for root_dir in roots:
        for root, dirs, files in os.walk(root_dir):
            dirs[:] = sorted(d for d in dirs if d not in {"test", "tests", "idlelib"})
            sources.extend(os.path.join(root, f) for f in sorted(files) if f.endswith(".py"))
    for path in sources:
        try:
            with open(path, encoding="utf-8") as f:
                content = f.read()
        except (UnicodeDecodeError, OSError):
            continue
        blocks = [content] if path.endswith(".txt") else _DOCSTRING.findall(content)
        for block in blocks:
            for para in block.split("\n\n"):
                para = " ".join(para.split())
                letters = sum(c.isalpha() for c in para)
                if len(para) >= 200 and letters > 0.7 * len(para) and para not in seen:
                    seen.add(para)
                    paragraphs.append(para)
        if len(paragraphs) >= limit:
            break
    return paragraphs[:limit]


def _edit(text: str, rng: random.Random, fraction: float) -> str:
    """Replace/delete/insert about ``fraction`` of the words."""
    words = text.split()
    out = []
    for w in words:
        r = rng.random()
        if r < fraction / 3:
            continue
        if r < 2 * fraction / 3:
            out.append(rng.choice(words))
        elif r < fraction:
            out.extend([w, rng.choice(words)])
        else:
            out.append(w)
    return " ".join(out)


def build_corpus(num_docs: int = 3000, dup_fraction: float = 0.2, seed: int = 0) -> list[str]:
    """``num_docs`` documents; ``dup_fraction`` of them are edited copies of others."""
    rng = random.Random(seed)
    num_unique = int(num_docs * (1 - dup_fraction))
    paragraphs = _prose_paragraphs(limit=num_unique * 4)
    if len(paragraphs) < num_unique * 2:
        raise RuntimeError(f"only {len(paragraphs)} prose paragraphs found offline")
    rng.shuffle(paragraphs)
    docs: list[str] = []
    cursor = 0
    while len(docs) < num_unique:
        # Paragraphs are used once each, so the unique documents really are unique.
        take = min(rng.randint(1, 4), len(paragraphs) - cursor)
        chunk = paragraphs[cursor : cursor + take]
        cursor += take
        docs.append("\n\n".join(chunk))
    while len(docs) < num_docs:
        docs.append(_edit(rng.choice(docs[:num_unique]), rng, fraction=0.03))
    return docs


def run_ours(docs: list[str], config: FuzzyDedupConfig) -> tuple[float, int]:
    ids = [f"{i:08d}" for i in range(len(docs))]
    start = time.perf_counter()
    result = dedup_texts(ids, docs, config)
    elapsed = time.perf_counter() - start
    return elapsed, result.counts()["duplicates"]


def run_reference(docs: list[str], config: FuzzyDedupConfig) -> tuple[float, int]:
    from datasketch import MinHash, MinHashLSH

    n = config.ngram
    start = time.perf_counter()
    shingle_sets = []
    for text in docs:
        cleaned = clean_text(text, config.max_chars)
        shingle_sets.append({cleaned[i : i + n].encode("utf-8") for i in range(max(1, len(cleaned) - n + 1))})
    minhashes = MinHash.bulk(shingle_sets, num_perm=config.num_perm, seed=config.seed)
    lsh = MinHashLSH(num_perm=config.num_perm, params=(config.bands, config.rows))
    for i, m in enumerate(minhashes):
        lsh.insert(i, m)
    parent = list(range(len(docs)))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i, m in enumerate(minhashes):
        for j in lsh.query(m):
            ri, rj = find(i), find(j)
            if ri != rj:
                parent[max(ri, rj)] = min(ri, rj)
    duplicates = sum(1 for i in range(len(docs)) if find(i) != i)
    return time.perf_counter() - start, duplicates


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=1, help="best of N timings per side")
    args = parser.parse_args(argv)

    config = FuzzyDedupConfig()
    docs = build_corpus(args.docs)
    ours_t, ours_dups = min(run_ours(docs, config) for _ in range(args.repeats))
    ref_t, ref_dups = min(run_reference(docs, config) for _ in range(args.repeats))
    record = {
        "name": "fuzzy_dedup",
        "unit": "docs/s",
        "ours": round(len(docs) / ours_t, 1),
        "reference": round(len(docs) / ref_t, 1),
        "ratio": round(ref_t / ours_t, 3),
        "docs": len(docs),
        "mean_chars": int(np.mean([len(d) for d in docs])),
        "duplicates_ours": ours_dups,
        "duplicates_reference": ref_dups,
        "planted_duplicates": len(docs) - int(len(docs) * 0.8),
    }
    print(json.dumps(record))
    sys.stdout.flush()
    return record


if __name__ == "__main__":
    main()
