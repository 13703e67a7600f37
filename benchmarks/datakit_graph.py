"""The whole sharded DataKit graph (assets/datakit/) on a generated corpus of >= 64 shards.

Each pass builds the graph `marin datakit run` builds (``user_graph``: the input folder as
``sources/bench``, no quality model (threshold 0, the CLI's default), the --eval file's
n-gram index, the pinned tokenizer (--tokenizer, default "olmo" as the CLI), the shard
steps and ``datasets/bench``, the dataset index) and drives ``materialize_waves`` over it
(one Dagster run per wave, each a range run over every key of its partitions, computed on
$MARIN_LOCAL_WORKERS forked workers) on an ephemeral DagsterInstance in a fresh process,
its store under PREFIX/store as the CLI's. A pass's seconds cover every wave: the source and
the fixed inputs (inputs_s), then shards/index .. datasets/bench (graph_s).

One JSON line per figure (ratio > 1: we are better):
  fanout           seconds for the whole graph, 1 worker (reference) vs --workers (ours)
  shard_increment  seconds: the full pass (reference) vs the pass after one new raw file,
                   i.e. one new shard (ours); extra: which partitions recomputed per asset
  shard_increment_sorts_first  the same with the new file named to sort before every other
                   (shard keys follow their own file, so no shard is renamed; its near copies
                   now come first and survive, so the shards of their originals recompute)
  end_to_end       MB of input text per second from the raw files to the dataset index: the
                   graph on --workers (ours; it also dedups and decontaminates, so < 1 is
                   expected) vs a bare single process on the same files (reference): pyarrow's
                   JSON reader, the same tokenizer's encode_batch_fast, the token ids and
                   document ends written as .npy. Extra: cli_mb_s, `marin datakit run` on the
                   same files (its whole process: interpreter, imports, every wave, summary)
  step_overhead    seconds of a pass where every partition is a cache hit, per wave
                   (run start, planning, cache checks, events), and the fresh-process
                   import cost of a step's modules (extra fields); up_to_date_pass_s: the
                   same pass when waves skip up-to-date partitions (the default)
  fuzzy_candidates_peak_rss  peak RSS of one band partition of shards/fuzzy_candidates in
                   a fresh process at two shard counts (ours: the larger, reference: the
                   smaller; ratio ~1 = memory does not grow with the shard count)
Every pass also prints one `wave` line per wave (seconds and recomputed partitions).

Run niced on the shared machine: `nice -n 10 .venv/bin/python benchmarks/datakit_graph.py`;
`--quick` checks that every figure runs on a tiny corpus (its numbers are noise).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import emit  # noqa: E402

SOURCE = "bench"
EVAL_TEXT = " ".join(f"evalword{i}" for i in range(30)) + " what is the capital of the answer."
VOCAB = [
    f"{a}{b}{c}"
    for a in ("ka", "lo", "mi", "ne", "su", "ta", "vo", "re", "di", "pa", "go", "be")
    for b in ("n", "s", "th", "r", "l", "m", "ck", "ve")
    for c in ("", "a", "o", "i")
]


# ---------------------------------------------------------------- the corpus
def prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(VOCAB) for _ in range(words)) + "."


def near(text: str, rng: random.Random) -> str:
    """`text` with two words changed: 5-gram Jaccard well above the 0.8 threshold."""
    words = text.split()
    for i in rng.sample(range(len(words)), 2):
        words[i] = "zq" + words[i]
    return " ".join(words)


def make_docs(rng: random.Random, target_bytes: int, prefix: str, earlier: list[str]) -> list[dict]:
    """Records of ~0.5-1 KB until target_bytes: 3% exact copies and 3% near copies of
    earlier documents (often in another file, so another shard), 0.5% eval-contaminated."""
    records, size = [], 0
    while size < target_bytes:
        roll = rng.random()
        if earlier and roll < 0.03:
            text = rng.choice(earlier)
        elif earlier and roll < 0.06:
            text = near(rng.choice(earlier), rng)
        elif roll < 0.065:
            text = prose(rng, 60) + "\n" + EVAL_TEXT
        else:
            text = prose(rng, rng.randint(80, 160))
            earlier.append(text)
        record = {"id": f"{prefix}-{len(records):06d}", "text": text}
        records.append(record)
        size += len(json.dumps(record)) + 1
    return records


def write_jsonl(path: Path, records: list[dict]) -> int:
    blob = "".join(json.dumps(r) + "\n" for r in records)
    path.write_text(blob)
    return len(blob.encode())


def make_corpus(root: Path, files: int, shards_per_file: int, shard_bytes: int) -> dict:
    """`files` raw JSONL files of ~shards_per_file shards each, plus one extra file of one
    shard (copies of earlier documents and new ones) for the increment."""
    rng, earlier = random.Random(12), []
    base = root / "base"
    base.mkdir(parents=True)
    for f in range(files):
        # 0.97: the greedy line-boundary split fills shards to just under shard_bytes
        write_jsonl(base / f"raw-{f:05d}.jsonl", make_docs(rng, int(shards_per_file * shard_bytes * 0.97), f"f{f}", earlier))
    extra = root / "extra"
    extra.mkdir()
    write_jsonl(extra / f"raw-{files:05d}.jsonl", make_docs(rng, int(shard_bytes * 0.9), f"f{files}", earlier))
    first = root / "first"
    first.mkdir()
    shutil.copyfile(extra / f"raw-{files:05d}.jsonl", first / "0-extra.jsonl")  # sorts before raw-*
    evals = root / "evals.jsonl"
    write_jsonl(evals, [{"id": "evalset/1", "text": EVAL_TEXT}])
    return {"base": base, "extra": extra, "first": first, "evals": evals}


def text_bytes(paths: list[Path]) -> int:
    """Bytes of document text (what MB/s counts), not of the JSON around it."""
    return sum(len(json.loads(line)["text"].encode()) for p in paths for line in p.read_text().splitlines())


# ---------------------------------------------------------------- the graph
class Graph:
    """One prefix (PREFIX/store, as `marin datakit run` lays it out) and its input folder
    PREFIX/../input/bench; each pass is a fresh process with a fresh ephemeral instance over
    it (what `marin datakit run` is), so no pass inherits another's threads or imports."""

    def __init__(self, work: Path, shard_bytes: int, tokenizer: str):
        self.prefix = str(work / "prefix")
        self.input = work / "input" / SOURCE
        self.shard_bytes, self.tokenizer = shard_bytes, tokenizer

    def store(self):
        from marin_assets.datakit.run_spec import STORE_ENTRY
        from marin_assets.store import ArtifactStore

        return ArtifactStore(os.path.join(self.prefix, STORE_ENTRY))

    def shards(self) -> list[str]:
        from assets.datakit.index import INDEX_KEY, index_keys

        return index_keys(self.store().read_pointer(INDEX_KEY, None))

    def run(self, files: list[Path], evals: Path, workers: int, label: str, skip_up_to_date: bool = True) -> dict:
        """{seconds, inputs_s, graph_s, process_s, cpu_s, waves, computed} of one pass over `files`
        on `workers`; skip_up_to_date=False runs every partition (the up-to-date ones as cache hits)."""
        shutil.rmtree(self.input, ignore_errors=True)
        self.input.mkdir(parents=True)
        for f in files:
            os.link(f, self.input / f.name)  # the input folder holds exactly `files` (links: no copy)
        job = {
            "prefix": self.prefix,
            "input": str(self.input),
            "evals": str(evals),
            "workers": workers,
            "label": label,
            "shard_bytes": self.shard_bytes,
            "tokenizer": self.tokenizer,
            "skip_up_to_date": skip_up_to_date,
        }
        lines, process_s, cpu_s = child(
            [sys.executable, os.path.abspath(__file__), "--pass-child", json.dumps(job)],
            f"pass {label}",
            env={"MARIN_LOCAL_WORKERS": str(workers)},
        )
        if "seconds" not in lines[-1]:
            raise RuntimeError(f"pass {label} printed no result: {lines[-1]}")
        for line in lines[:-1]:
            print(json.dumps(line), flush=True)
        return {**lines[-1], "process_s": process_s, "cpu_s": cpu_s}


def child(argv: list[str], what: str, env: dict[str, str] | None = None) -> tuple[list[dict], float, float]:
    """(its JSON lines, wall seconds, CPU seconds of it and its descendants) of a fresh process."""
    start, cpu = time.perf_counter(), _children_cpu()
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env={**os.environ, **(env or {})})
    process_s, cpu_s = time.perf_counter() - start, _children_cpu() - cpu
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{what} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return lines, process_s, cpu_s


def _children_cpu() -> float:
    """user + sys seconds of every waited-for descendant (a pass and its forked workers)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def pass_child(job: dict) -> None:
    """One pass in this (fresh) process over the graph `marin datakit run` builds: the source and
    the fixed inputs, the index wave, its keys registered (a cache-hit index does not run its
    body), the rest; each part timed."""
    import dagster as dg

    from assets.datakit.index import INDEX_KEY, index_keys, register_shards
    from assets.datakit.run import warm_imports
    from assets.datakit.user_inputs import run_config, user_graph
    from marin_assets.datakit.run_spec import STORE_ENTRY, RunSpec
    from marin_assets.datakit.shard_index import ShardingConfig
    from marin_assets.datakit.tokenize import TokenizerChoice
    from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource
    from marin_assets.orchestration.waves import materialize_waves

    spec = RunSpec(
        (job["input"],),
        (job["evals"],),
        job["prefix"],
        tokenizer=TokenizerChoice(job["tokenizer"]),
        sharding=ShardingConfig(shard_bytes=job["shard_bytes"]),
        workers=job["workers"],
    )
    assets, checks, shards = user_graph(spec)
    store = ArtifactStoreResource(prefix=os.path.join(job["prefix"], STORE_ENTRY))
    resources = {"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)}
    config = run_config(spec, assets)  # INFO on the console, as the CLI without --json
    instance = dg.DagsterInstance.ephemeral()
    warm_imports()
    index = dg.AssetKey(INDEX_KEY.split("/"))
    inputs = {a.key for a in assets if a.partitions_def is None and a.key.path[0] not in ("shards", "datasets")}
    rest = {k for a in assets for k in a.keys} - inputs - {index}
    marks: list[tuple[float, str]] = []
    log = lambda line: marks.append((time.perf_counter(), line))  # noqa: E731
    start = time.perf_counter()
    results = materialize_waves([*assets, *checks], instance, resources, selection=inputs, log=log, run_config=config)
    inputs_s = time.perf_counter() - start
    if all(r.success for r in results):
        results += materialize_waves([*assets, *checks], instance, resources, selection=[index], log=log, run_config=config)
    if all(r.success for r in results):
        register_shards(instance, index_keys(store.store.read_pointer(INDEX_KEY, None)), shards)
        results += materialize_waves(
            [*assets, *checks],
            instance,
            resources,
            selection=rest,
            log=log,
            run_config=config,
            skip_up_to_date=job["skip_up_to_date"],
        )
    seconds = time.perf_counter() - start
    if not all(r.success for r in results):
        raise RuntimeError(f"{job['label']}: a wave failed: {[m for _, m in marks]}")
    waves, computed, skipped = wave_lines(job, marks, results, start + seconds)
    print(
        json.dumps(
            {
                "seconds": seconds,
                "inputs_s": inputs_s,
                "graph_s": seconds - inputs_s,
                "waves": waves,
                "computed": dict(computed),
                "up_to_date_waves": skipped,
            }
        ),
        flush=True,
    )


def wave_lines(job: dict, marks: list[tuple[float, str]], results, end: float) -> tuple[list[dict], Counter, list[str]]:
    """One line per wave that ran (seconds, busy seconds, recomputed partitions per asset),
    printed; the recomputed partitions of the pass; the waves that were up to date."""
    ends = [t for t, _ in marks[1:]] + [end]
    ran = [(t0, line, t1) for (t0, line), t1 in zip(marks, ends, strict=True) if not line.endswith("no run")]
    skipped = [line.split(":", 1)[1].strip().split(":")[0] for _, line in marks if line.endswith("no run")]
    if len(ran) != len(results):
        raise RuntimeError(f"{job['label']}: {len(results)} runs for {len(ran)} wave lines: {[m for _, m in marks]}")
    waves, computed = [], Counter()
    for (t0, line, t1), result in zip(ran, results, strict=True):
        events = result.get_asset_materialization_events()
        fresh = [e for e in events if not e.materialization.metadata["cache_hit"].value]
        done = Counter(e.asset_key.to_user_string() for e in fresh)
        computed.update(done)
        # busy_s: the partitions' own durations summed; busy_s / s is the wave's achieved parallelism
        busy = Counter()
        for e in fresh:
            busy[e.asset_key.to_user_string()] += e.materialization.metadata["duration_s"].value
        waves.append(
            {
                "wave": line.split(":", 1)[1].strip().split(" (")[0].split(": ")[0],
                "s": round(t1 - t0, 2),
                "busy_s": round(sum(busy.values()), 2),
                "busy_by_asset": {k: round(v, 2) for k, v in busy.items()},
                "computed": dict(done),
                "partitions": len(events),
            }
        )
        print(json.dumps({"pass": job["label"], "workers": job["workers"], **waves[-1]}), flush=True)
    return waves, computed, skipped


# ---------------------------------------------------------------- the references and overheads
def reference_child(job: dict) -> None:
    """The bare single-process path, in this (fresh) process: each raw file read by pyarrow's
    JSON reader, its texts encoded by the tokenizer's encode_batch_fast in batches (TokenizeConfig's
    batch_docs, EOS after each document, as the caches hold them), every token id and document
    end written as one .npy each. Prints the seconds of each part."""
    import numpy as np
    import pyarrow.json as pj
    from tokenizers import Tokenizer

    from marin_assets.datakit.tokenize import EOS, TokenizeConfig, tokenizer_text

    start = time.perf_counter()
    tokenizer = Tokenizer.from_str(tokenizer_text(job["tokenizer"]))
    tokenizer.encode_special_tokens = True  # text is data, as in our Encoder
    eos = np.array([tokenizer.token_to_id(EOS)], np.int32)
    loaded = time.perf_counter()
    pieces, lengths, read_s, docs = [], [], 0.0, 0
    batch = TokenizeConfig().batch_docs
    for path in job["files"]:
        t = time.perf_counter()
        texts = pj.read_json(path, read_options=pj.ReadOptions(block_size=64 << 20)).column("text").to_pylist()
        read_s += time.perf_counter() - t
        docs += len(texts)
        for lo in range(0, len(texts), batch):
            for encoding in tokenizer.encode_batch_fast(texts[lo : lo + batch], add_special_tokens=False):
                pieces += [np.asarray(encoding.ids, np.int32), eos]
                lengths.append(len(encoding.ids) + 1)
    encoded = time.perf_counter()
    np.save(os.path.join(job["out"], "tokens.npy"), np.concatenate(pieces))
    np.save(os.path.join(job["out"], "ends.npy"), np.cumsum(lengths, dtype=np.int64))
    end = time.perf_counter()
    print(
        json.dumps(
            {
                "s": end - start,
                "load_s": loaded - start,
                "read_s": read_s,
                "encode_s": encoded - loaded - read_s,
                "write_s": end - encoded,
                "docs": docs,
                "tokens": int(sum(lengths)),
            }
        ),
        flush=True,
    )


def reference(files: list[Path], tokenizer: str, out: Path) -> dict:
    out.mkdir(parents=True)
    job = {"files": [str(f) for f in files], "tokenizer": tokenizer, "out": str(out)}
    lines, process_s, _ = child([sys.executable, os.path.abspath(__file__), "--reference-child", json.dumps(job)], "reference")
    result = {**lines[-1], "process_s": process_s}
    rounded = {k: round(v, 2) if isinstance(v, float) else v for k, v in result.items()}
    print(json.dumps({"pass": "reference", **rounded}), flush=True)
    return result


def cli_run(folder: Path, evals: Path, prefix: Path, workers: int, shard_bytes: int, tokenizer: str) -> dict:
    """`marin datakit run` on the same folder, a fresh prefix: its summary and its process's seconds."""
    argv = [
        sys.executable,
        "-c",
        "import sys; from marin_assets.cli import main; sys.exit(main())",
        "datakit",
        "run",
        "--input",
        str(folder),
        "--eval",
        str(evals),
        "--prefix",
        str(prefix),
        "--workers",
        str(workers),
        "--shard-bytes",
        str(shard_bytes),
        "--tokenizer",
        tokenizer,
        "--json",
    ]
    lines, process_s, _ = child(argv, "marin datakit run")
    return {**lines[-1], "process_s": process_s}


IMPORTS = {  # what a fresh step process imports before its body runs (a pod per shard range)
    "definitions_datakit": "import assets.datakit",
    "normalize": "import marin_assets.datakit.normalize",
    "fuzzy": "import marin_assets.datakit.fuzzy_dedup",
    "tokenize": "import marin_assets.datakit.tokenize, tensorstore, tokenizers",
    "levanter_cache": "import levanter.store.cache",  # what CacheWriter spares the tokenize step
}


def import_seconds(code: str) -> float:
    """Best of two fresh interpreters: the seconds `code` takes to import."""
    timer = f"import time; t = time.perf_counter(); {code}; print(time.perf_counter() - t)"
    runs = [subprocess.run([sys.executable, "-c", timer], cwd=ROOT, check=True, capture_output=True, text=True) for _ in range(2)]
    return min(float(run.stdout.split()[-1]) for run in runs)


def band_rss(graph: Graph, band: str) -> tuple[int, int]:
    """(peak RSS, its growth over the imports) of one shards/fuzzy_candidates band partition
    computed in a fresh process (the body's reduces on the committed map refs, minus Dagster)."""
    code = f"""
import resource, sys
sys.path.insert(0, {ROOT!r})
from assets.datakit.common import roots
from assets.datakit.fuzzy import MINHASH
from assets.partitions import FUZZY_BANDS, partition_index
from marin_assets.datakit.fuzzy_dedup import band_reduce_ranges, fuzzy_band_reduce
from marin_assets.store import ArtifactStore
store = ArtifactStore({graph.store().prefix!r})
keys = {graph.shards()!r}
maps = {{k: store.read_pointer('shards/fuzzy_map', k) for k in keys}}
docs = sum(r.counts['docs'] for r in maps.values())
ranges = band_reduce_ranges(docs, MINHASH.docs_per_reduce)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for r in range(ranges):
    fuzzy_band_reduce(partition_index({band!r}, 'band-', FUZZY_BANDS), (r, ranges), roots(maps),
                      {str(Path(graph.prefix).parent / "rss")!r}, MINHASH)
print(before * 1024, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True).stdout.split()
    return int(out[-1]), int(out[-1]) - int(out[-2])


# ---------------------------------------------------------------- the figures
FIGURES = ("fanout", "shard_increment", "shard_increment_sorts_first", "end_to_end", "step_overhead", "fuzzy_candidates_peak_rss")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=4, help="raw files in the base corpus")
    parser.add_argument("--shards-per-file", type=int, default=16)
    parser.add_argument("--shard-bytes", type=int, default=512 * 1024)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tokenizer", default="olmo", help="the pinned tokenizer (a name or a tokenizer.json), both sides")
    parser.add_argument("--figures", default=",".join(FIGURES))
    parser.add_argument("--no-cli", action="store_true", help="end_to_end without the `marin datakit run` pass")
    parser.add_argument("--rss-files", type=int, default=1, help="raw files of the smaller graph for the RSS figure")
    parser.add_argument("--keep", help="keep the work directory here (for profiling)")
    parser.add_argument("--quick", action="store_true", help="a tiny corpus: checks every figure runs (numbers are noise)")
    parser.add_argument("--pass-child", help=argparse.SUPPRESS)
    parser.add_argument("--reference-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.pass_child:
        pass_child(json.loads(args.pass_child))
        return 0
    if args.reference_child:
        reference_child(json.loads(args.reference_child))
        return 0
    if args.quick:
        args.files, args.shards_per_file, args.shard_bytes = 2, 1, 16 * 1024
    figures = set(args.figures.split(","))
    if figures - set(FIGURES):
        parser.error(f"unknown figures: {sorted(figures - set(FIGURES))}")

    work = Path(args.keep or tempfile.mkdtemp(prefix="datakit_graph_"))
    try:
        run_figures(args, figures, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def run_figures(args, figures: set[str], work: Path) -> None:
    from assets.datakit.datasets import dataset_key

    corpus = make_corpus(work / "corpus", args.files, args.shards_per_file, args.shard_bytes)
    evals = corpus["evals"]
    base = sorted(corpus["base"].glob("*.jsonl"))
    added = base + sorted(corpus["extra"].glob("*.jsonl"))
    mb = text_bytes(base) / 1e6
    ours = Graph(work / "ours", args.shard_bytes, args.tokenizer)
    full = ours.run(base, evals, args.workers, "full")
    full["dataset"] = dict(ours.store().read_pointer(dataset_key(SOURCE), None).counts)  # before any increment changes it
    shards = len(ours.shards())
    common = {"shards": shards, "text_mb": round(mb, 3), "workers": args.workers, "tokenizer": args.tokenizer}
    if "fanout" in figures:
        one = Graph(work / "one", args.shard_bytes, args.tokenizer).run(base, evals, 1, "full-1-worker")
        emit(
            "fanout",
            "s",
            full["seconds"],
            one["seconds"],
            higher_is_better=False,
            **common,
            waves_1=[w["s"] for w in one["waves"]],
            waves_n=[w["s"] for w in full["waves"]],
            busy_1=[w["busy_s"] for w in one["waves"]],
            busy_n=[w["busy_s"] for w in full["waves"]],
            process_cpu_s_1=round(one["cpu_s"], 1),
            process_cpu_s_n=round(full["cpu_s"], 1),
            process_s_1=round(one["process_s"], 1),
            process_s_n=round(full["process_s"], 1),
        )
    if "step_overhead" in figures:
        again = ours.run(base, evals, args.workers, "all-cache-hits", skip_up_to_date=False)
        assert not again["computed"], f"a rerun of an unchanged graph computed {again['computed']}"
        per_wave = again["seconds"] / len(again["waves"])
        planned = ours.run(base, evals, args.workers, "up-to-date")
        assert not planned["computed"], f"a rerun of an unchanged graph computed {planned['computed']}"
        imports = {name: round(import_seconds(code), 2) for name, code in IMPORTS.items()}
        # reference: the same pass's share of the full run (what the fixed cost is out of)
        emit(
            "step_overhead",
            "s/wave",
            per_wave,
            full["seconds"] / len(full["waves"]),
            higher_is_better=False,
            **common,
            cached_pass_s=round(again["seconds"], 2),
            waves=len(again["waves"]),
            fresh_process_import_s=imports,
            up_to_date_pass_s=round(planned["seconds"], 2),
            up_to_date_runs=len(planned["waves"]),
        )
    if "shard_increment" in figures:
        inc = ours.run(added, evals, args.workers, "increment")
        emit(
            "shard_increment",
            "s",
            inc["seconds"],
            full["seconds"],
            higher_is_better=False,
            **common,
            new_shards=len(ours.shards()) - shards,
            recomputed=inc["computed"],
        )
    if "shard_increment_sorts_first" in figures:
        other = Graph(work / "first", args.shard_bytes, args.tokenizer)
        other_full = other.run(base, evals, args.workers, "full-for-first")
        inc = other.run(sorted(corpus["first"].glob("*.jsonl")) + base, evals, args.workers, "increment-sorts-first")
        emit(
            "shard_increment_sorts_first",
            "s",
            inc["seconds"],
            other_full["seconds"],
            higher_is_better=False,
            **common,
            new_shards=len(other.shards()) - shards,
            recomputed=inc["computed"],
        )
    if "end_to_end" in figures:
        end_to_end(args, full, base, evals, mb, common, work)
    if "fuzzy_candidates_peak_rss" in figures:
        small = Graph(work / "small", args.shard_bytes, args.tokenizer)
        small.run(base[: args.rss_files], evals, args.workers, "rss-small")
        big_shards, small_shards = len(ours.shards()), len(small.shards())
        rss = {n: max(band_rss(g, f"band-{b:02d}") for b in (0, 13)) for n, g in ((big_shards, ours), (small_shards, small))}
        emit(
            "fuzzy_candidates_peak_rss",
            "bytes",
            rss[big_shards][0],
            rss[small_shards][0],
            higher_is_better=False,
            shards_ours=big_shards,
            shards_reference=small_shards,
            docs_per_reduce_default=2_000_000,
            growth_over_imports_ours=rss[big_shards][1],
            growth_over_imports_reference=rss[small_shards][1],
        )


def end_to_end(args, full: dict, base: list[Path], evals: Path, mb: float, common: dict, work: Path) -> None:
    """The graph's full pass vs the bare reference (and `marin datakit run`) on the same raw files."""
    ref = reference(base, args.tokenizer, work / "reference")
    extra = {}
    if not args.no_cli:
        folder = work / "cli_input" / SOURCE
        folder.mkdir(parents=True)
        for f in base:
            os.link(f, folder / f.name)
        cli = cli_run(folder, evals, work / "cli", args.workers, args.shard_bytes, args.tokenizer)
        extra = {
            "cli_mb_s": round(mb / cli["process_s"], 4),
            "cli_process_s": round(cli["process_s"], 2),
            "cli_docs_out": cli["docs_out"],
        }
    emit(
        "end_to_end",
        "MB/s",
        mb / full["seconds"],
        mb / ref["s"],
        higher_is_better=True,
        **common,
        ours_s=round(full["seconds"], 2),
        ours_inputs_s=round(full["inputs_s"], 2),
        ours_graph_s=round(full["graph_s"], 2),
        reference_s=round(ref["s"], 2),
        ours_process_s=round(full["process_s"], 2),
        reference_process_s=round(ref["process_s"], 2),
        reference_parts_s={k: round(ref[k], 2) for k in ("load_s", "read_s", "encode_s", "write_s")},
        docs_in=ref["docs"],
        dataset_train_tokens=full["dataset"]["train_tokens"],
        reference_tokens=ref["tokens"],
        **extra,
        reference_impl="pyarrow.json.read_json + tokenizers encode_batch_fast + numpy.save, one process",
    )


if __name__ == "__main__":
    sys.exit(main())
