"""Fuzzy dedup on one core: the shard path the graph runs vs datasketch MinHash + MinHashLSH.

Both sides get the same documents: paragraphs of real prose found offline (docstrings of
the Python standard library and installed packages, and the Python LICENSE), 1-3 to a
document, each paragraph used once, plus planted near duplicates (about 3% of the words of
a document replaced, deleted or repeated), shuffled so that copies land in other shards than
their originals. Both clean the text the same way (minhash.clean_text) and use character
5-grams, 286 permutations, 26 bands x 11 rows, seed 42.

- ours: the steps of the sharded graph, in this process over shards of ~1 MiB of text (the
  graph's default shard size) written like filtered shards: fuzzy_map per shard,
  fuzzy_band_reduce per band (one key range), fuzzy_verify per shard, fuzzy_resolve.
  Writing the shards is not timed; the steps' reads and writes of their files are.
- reference: Python shingle sets + ``MinHash.bulk`` + ``MinHashLSH`` insert/query +
  union-find (no verification: datasketch has none, so it does strictly less work).

The process is pinned to one CPU and Arrow to one thread; times are CPU seconds of the
process (user + system, so other processes on a shared machine do not count). Prints one
JSON line per figure:
  fuzzy_dedup         CPU seconds of the whole path, ratio = reference / ours (> 1: we are
                      faster), with ours' seconds per step
  fuzzy_dedup_recall  the fraction of planted near duplicates (those whose true Jaccard
                      with their original reaches the threshold, 0.8) found in their
                      original's component, each side (ratio = ours / reference); the same
                      over every planted copy in recall_all_planted_*
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import emit  # noqa: E402

_DOCSTRING = re.compile(r'"""(.*?)"""', re.DOTALL)
SHARD_TEXT_BYTES = 1 << 20  # ShardingConfig.shard_bytes' default


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
    """Replace/delete/insert about ``fraction`` of the words (at least one edit)."""
    words = text.split()
    while True:
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
        if out != words:
            return " ".join(out)


def build_corpus(num_unique: int, num_near: int, seed: int = 0) -> tuple[list[str], list[tuple[int, int]]]:
    """(documents in corpus order, planted (copy position, original position) pairs)."""
    rng = random.Random(seed)
    paragraphs = _prose_paragraphs(limit=num_unique * 2 + 1000)  # 2 a document on average, and a margin
    rng.shuffle(paragraphs)
    unique, cursor = [], 0
    while len(unique) < num_unique:
        take = rng.randint(1, 3)  # paragraphs are used once each: the unique documents are unique
        if cursor + take > len(paragraphs):
            raise RuntimeError(f"only {len(paragraphs)} prose paragraphs found offline: too few for {num_unique} documents")
        unique.append("\n\n".join(paragraphs[cursor : cursor + take]))
        cursor += take
    originals = rng.sample(range(num_unique), num_near)
    docs = unique + [_edit(unique[o], rng, fraction=0.03) for o in originals]
    order = list(range(len(docs)))
    rng.shuffle(order)
    position = {d: p for p, d in enumerate(order)}
    planted = [(position[num_unique + k], position[o]) for k, o in enumerate(originals)]
    return [docs[d] for d in order], planted


def write_shards(docs: list[str], folder: str) -> tuple[dict[str, str], list[tuple[str, int]]]:
    """({shard key: path}, (shard key, row) of every document): ~SHARD_TEXT_BYTES of text per
    shard, in row groups of DOC_ROW_GROUP like the filtered shards the graph dedups."""
    import pyarrow as pa

    from marin_assets.datakit.normalize import doc_id
    from marin_assets.datakit.readers import string_array
    from marin_assets.datakit.shards import DOC_ROW_GROUP, write_table

    paths, where, start = {}, [], 0
    while start < len(docs):
        stop, size = start, 0
        while stop < len(docs) and (stop == start or size < SHARD_TEXT_BYTES):
            size += len(docs[stop].encode())
            stop += 1
        key = f"s-{len(paths):05d}"
        paths[key] = os.path.join(folder, f"{key}.parquet")
        part = docs[start:stop]
        write_table(pa.table({"id": string_array([doc_id(t) for t in part]), "text": string_array(part)}), paths[key],
                    row_group_size=DOC_ROW_GROUP)  # fmt: skip
        where += [(key, row) for row in range(len(part))]
        start = stop
    return paths, where


def run_ours(shards: dict[str, str], work: str) -> tuple[dict[str, float], dict[tuple[str, int], tuple[str, int]]]:
    """({step: seconds}, {(shard, row) of a removed document: (shard, row) of its survivor})."""
    from marin_assets.datakit.fuzzy_dedup import FuzzyDedupConfig, fuzzy_band_reduce, fuzzy_map, fuzzy_resolve, fuzzy_verify
    from marin_assets.datakit.removals import read_removal_list, removal_list_path

    config = FuzzyDedupConfig()
    maps = {k: os.path.join(work, "map", k) for k in shards}
    cands = [os.path.join(work, "cand", f"band-{b:03d}") for b in range(config.bands)]
    edges = {k: os.path.join(work, "edges", f"{k}.parquet") for k in shards}
    steps = {
        "map": lambda: [fuzzy_map(k, p, maps[k], config) for k, p in shards.items()],
        "band_reduce": lambda: [fuzzy_band_reduce(b, (0, 1), list(maps.values()), cands[b], config) for b in range(config.bands)],
        "verify": lambda: [fuzzy_verify(k, cands, shards, maps, edges[k], config) for k in shards],
        "resolve": lambda: fuzzy_resolve(edges, os.path.join(work, "removals")),
    }
    seconds = {}
    for name, step in steps.items():
        start = time.process_time()
        step()
        seconds[name] = time.process_time() - start
    survivor = {
        (k, r.row): (r.kept_shard, r.kept_row)
        for k in shards
        for r in read_removal_list(removal_list_path(os.path.join(work, "removals"), k))
    }
    return seconds, survivor


def run_reference(docs: list[str]) -> tuple[float, list[int]]:
    """(seconds, root of every document's component) of datasketch's MinHash + LSH."""
    from datasketch import MinHash, MinHashLSH

    from marin_assets.datakit.fuzzy_dedup import FuzzyDedupConfig
    from marin_assets.datakit.minhash import clean_text

    config = FuzzyDedupConfig()
    n = config.ngram
    start = time.process_time()
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
    roots = [find(i) for i in range(len(docs))]
    return time.process_time() - start, roots


@contextlib.contextmanager
def _one_core() -> Iterator[int]:
    """Within: this process pinned to one CPU (its number is yielded) and Arrow to one thread
    (benchmarks/datakit.py calls main() in its own process: it gets its cores back after)."""
    import pyarrow as pa

    cpus, threads, io_threads = os.sched_getaffinity(0), pa.cpu_count(), pa.io_thread_count()
    os.sched_setaffinity(0, {min(cpus)})
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    try:
        yield min(cpus)
    finally:
        os.sched_setaffinity(0, cpus)
        pa.set_cpu_count(threads)
        pa.set_io_thread_count(io_threads)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unique", type=int, default=20_000, help="unique documents")
    parser.add_argument("--near", type=int, default=1_000, help="planted near duplicates (edited copies of unique documents)")
    args = parser.parse_args(argv)

    from marin_assets.datakit.fuzzy_dedup import FuzzyDedupConfig
    from marin_assets.datakit.minhash import jaccard, shingle_keys

    docs, planted = build_corpus(args.unique, args.near)
    # Planted copies whose true Jaccard reaches the threshold: the near duplicates by definition.
    threshold = FuzzyDedupConfig().jaccard_threshold
    eligible = [jaccard(shingle_keys(docs[c]), shingle_keys(docs[o])) >= threshold for c, o in planted]
    with _one_core() as cpu, tempfile.TemporaryDirectory(prefix="datakit_fuzzy_") as work:
        shards, where = write_shards(docs, os.path.join(work, "shards"))
        seconds, survivor = run_ours(shards, os.path.join(work, "ours"))
        ref_s, roots = run_reference(docs)
    ours_s = sum(seconds.values())
    rep = [survivor.get(w, w) for w in where]
    found_ours = [rep[c] == rep[o] for c, o in planted]
    found_ref = [roots[c] == roots[o] for c, o in planted]
    common = {"docs": len(docs), "mb": round(sum(len(d.encode()) for d in docs) / 1e6, 2), "shards": len(shards),
              "planted": len(planted), "planted_at_threshold": sum(eligible), "cpu": cpu}  # fmt: skip
    return [
        emit(
            "fuzzy_dedup",
            "cpu_s",
            ours_s,
            ref_s,
            higher_is_better=False,
            **common,
            ours_steps_s={k: round(v, 3) for k, v in seconds.items()},
            duplicates_ours=len(survivor),
            duplicates_reference=sum(r != i for i, r in enumerate(roots)),
            reference_impl="datasketch MinHash.bulk + MinHashLSH insert/query + union-find (no verification)",
        ),  # fmt: skip
        emit(
            "fuzzy_dedup_recall",
            "fraction",
            _recall(found_ours, eligible),
            _recall(found_ref, eligible),
            higher_is_better=True,
            **common,
            recall_all_planted_ours=_recall(found_ours),
            recall_all_planted_reference=_recall(found_ref),
        ),  # fmt: skip
    ]


def _recall(found: list[bool], among: list[bool] | None = None) -> float:
    """The fraction of `found` that is True, over the entries `among` marks (all by default)."""
    picked = [f for f, a in zip(found, among or [True] * len(found), strict=True) if a]
    return round(sum(picked) / max(1, len(picked)), 4)


if __name__ == "__main__":
    main()
