"""The whole sharded DataKit graph (assets/shards/) on a generated corpus of >= 64 shards.

Drives `materialize_waves` (one Dagster run per wave, each a range run over every key of
its partitions, computed on $MARIN_LOCAL_WORKERS forked workers) on a temporary
DagsterInstance and a fresh artifact prefix. The graph's three fixed inputs are stand-ins
with the real keys (quality_model, eval_ngrams, tokenizer: small models trained here, as
tests/assets/test_shard_assets.py builds them); they and the raw source are materialised
before the clock starts, so the timed part is shards/index .. shards/tokenized.

One JSON line per figure (ratio > 1: we are better):
  fanout           seconds for the whole graph, 1 worker (reference) vs --workers (ours)
  shard_increment  seconds: the full pass (reference) vs the pass after one new raw file,
                   i.e. one new shard (ours); extra: which partitions recomputed per asset
  shard_increment_sorts_first  the same with the new file named to sort before every other
                   (shard keys follow their own file, so no shard is renamed; its near copies
                   now come first and survive, so the shards of their originals recompute)
  end_to_end       MB of input text per second: the sharded graph on --workers vs the
                   single-process run_pipeline on the same corpus (same quality model with
                   threshold 0, same tokenizer, same eval set)
  step_overhead    seconds of a pass where every partition is a cache hit, per wave
                   (run start, planning, cache checks, events), and the fresh-process
                   import cost of a step's modules (extra fields); up_to_date_pass_s: the
                   same pass when waves skip up-to-date partitions (the default)
  fuzzy_candidates_peak_rss  peak RSS of one band partition of shards/fuzzy_candidates in
                   a fresh process at two shard counts (ours: the larger, reference: the
                   smaller; ratio ~1 = memory does not grow with the shard count)
Every pass also prints one `wave` line per wave (seconds and recomputed partitions).

Run niced on the shared machine: `nice -n 10 .venv/bin/python benchmarks/datakit_graph.py`.
"""

from __future__ import annotations

import argparse
import hashlib
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
VOCAB = [f"{a}{b}{c}" for a in ("ka", "lo", "mi", "ne", "su", "ta", "vo", "re", "di", "pa", "go", "be")
         for b in ("n", "s", "th", "r", "l", "m", "ck", "ve") for c in ("", "a", "o", "i")]


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


# ---------------------------------------------------------------- the graph and its stand-ins
def stand_ins():
    """quality_model, eval_ngrams and tokenizer with their real keys, small and fixed."""
    import pyarrow as pa

    from marin_assets.datakit.decontaminate import EvalNgramIndex
    from marin_assets.datakit.normalize import doc_id
    from marin_assets.datakit.shards import write_table
    from marin_assets.orchestration import StageContext, versioned_asset

    def parquet(out_dir: str, texts: list[str]) -> str:
        path = f"{out_dir}/part-00000-of-00001.parquet"
        write_table(pa.table({"id": [doc_id(t) for t in texts], "text": texts}), path)
        return path

    def spam(rng: random.Random) -> str:
        return " ".join(rng.choice(["FREE", "$$$", "CLICK", "NOW", "winner", "cheap", "!!!", "offer", "cash"]) for _ in range(40))

    @versioned_asset(key="quality_model", code_version="bench")
    def quality_model(ctx: StageContext):
        from marin_assets.datakit.quality import QualityModelConfig, train_quality_model

        rng = random.Random(1)
        high = parquet(f"{ctx.scratch_dir}/high", [prose(rng, 60) for _ in range(40)])
        low = parquet(f"{ctx.scratch_dir}/low", [spam(rng) for _ in range(40)])
        return train_quality_model([high], [low], ctx.out_dir, QualityModelConfig(num_features=1 << 12, holdout_fraction=0.0))

    @versioned_asset(key="eval_ngrams", code_version="bench")
    def eval_ngrams(ctx: StageContext):
        index = EvalNgramIndex.build([("evalset/1", EVAL_TEXT)])
        index.save(ctx.out_dir)
        return {"ngrams": int(index.num_ngrams)}

    @versioned_asset(key="tokenizer", code_version="bench")
    def tokenizer(ctx: StageContext):
        from marin_assets.datakit.tokenize import TokenizerTrainConfig, train_tokenizer

        rng = random.Random(2)
        train = parquet(f"{ctx.scratch_dir}/docs", [prose(rng, 60) for _ in range(40)])
        return train_tokenizer([train], ctx.out_dir, TokenizerTrainConfig(vocab_size=300))

    return [quality_model, eval_ngrams, tokenizer]


def raw_source(files: list[Path]):
    """sources/<SOURCE>: a copy of `files`, versioned by their bytes."""
    from marin_assets.orchestration import StageContext, versioned_asset

    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode() + hashlib.sha256(f.read_bytes()).digest())

    @versioned_asset(key=f"sources/{SOURCE}", code_version=digest.hexdigest()[:16])
    def raw(ctx: StageContext):
        for f in files:
            shutil.copyfile(f, Path(ctx.out_dir, f.name))
        return {"files": len(files)}

    return raw


class Graph:
    """One artifact prefix; each pass is a fresh process with a fresh ephemeral instance over
    it (what `marin datakit run` is), so no pass inherits another's threads or imports."""

    def __init__(self, work: Path, shard_bytes: int):
        self.prefix = str(work / "prefix")
        self.shard_bytes = shard_bytes

    def store(self):
        from marin_assets.store import ArtifactStore

        return ArtifactStore(self.prefix)

    def shards(self) -> list[str]:
        from assets.shards.index import index_keys

        return index_keys(self.store().read_pointer("shards/index", None))

    def run(self, files: list[Path], workers: int, label: str, skip_up_to_date: bool = True) -> dict:
        """{seconds, process_s, waves, computed} of one pass over `files` on `workers`;
        skip_up_to_date=False runs every partition (the up-to-date ones as cache hits)."""
        job = {"prefix": self.prefix, "files": [str(f) for f in files], "workers": workers, "label": label,
               "shard_bytes": self.shard_bytes, "skip_up_to_date": skip_up_to_date}
        start, cpu = time.perf_counter(), _children_cpu()
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--pass-child", json.dumps(job)], cwd=ROOT,
                              capture_output=True, text=True, env={**os.environ, "MARIN_LOCAL_WORKERS": str(workers)})
        process_s, cpu_s = time.perf_counter() - start, _children_cpu() - cpu
        lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not lines or "seconds" not in lines[-1]:
            raise RuntimeError(f"pass {label} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
        for line in lines[:-1]:
            print(json.dumps(line), flush=True)
        return {**lines[-1], "process_s": process_s, "cpu_s": cpu_s}


def _children_cpu() -> float:
    """user + sys seconds of every waited-for descendant (a pass and its forked workers)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def pass_child(job: dict) -> None:
    """One pass in this (fresh) process: inputs (untimed), then the shards/ graph, timed:
    the index wave, its keys registered (a cache-hit index does not run its body), the rest."""
    import dagster as dg

    from assets.shards import make_shard_assets
    from assets.shards.index import index_keys, register_shards
    from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource
    from marin_assets.orchestration.waves import materialize_waves

    store = ArtifactStoreResource(prefix=job["prefix"])
    resources = {"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)}
    instance = dg.DagsterInstance.ephemeral()
    assets = [raw_source([Path(f) for f in job["files"]]), *stand_ins(), *make_shard_assets({SOURCE: f"sources/{SOURCE}"})]
    inputs = [a for a in assets if a.key.path[0] != "shards"]
    from assets.shards.run import warm_imports
    warm_imports()
    assert dg.materialize(inputs, instance=instance, resources=resources).success
    index = next(a for a in assets if a.key.to_user_string() == "shards/index")
    rest = [a.key for a in assets if a.key.path[0] == "shards" and a is not index]
    # The console log level `marin datakit run` sets (user_inputs.run_config), so a pass is what
    # the CLI runs (Dagster's default, DEBUG, also prints every event: ~0.1 ms each, profiled).
    loggers = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}
    config = {"ops": {index.op.name: {"config": {"shard_bytes": job["shard_bytes"]}}}, **loggers}
    marks: list[tuple[float, str]] = []
    log = lambda line: marks.append((time.perf_counter(), line))  # noqa: E731
    start = time.perf_counter()
    results = materialize_waves(assets, instance, resources, selection=[index.key], log=log, run_config=config)
    if all(r.success for r in results):
        register_shards(instance, index_keys(store.store.read_pointer("shards/index", None)))
        results += materialize_waves(assets, instance, resources, selection=rest, log=log, run_config=loggers,
                                     skip_up_to_date=job["skip_up_to_date"])
    seconds = time.perf_counter() - start
    if not all(r.success for r in results):
        raise RuntimeError(f"{job['label']}: a wave failed: {[m for _, m in marks]}")
    ends = [t for t, _ in marks[1:]] + [start + seconds]
    ran = [(t0, line, t1) for (t0, line), t1 in zip(marks, ends) if not line.endswith("no run")]
    skipped = [line.split(":", 1)[1].strip().split(":")[0] for _, line in marks if line.endswith("no run")]
    if len(ran) != len(results):
        raise RuntimeError(f"{job['label']}: {len(results)} runs for {len(ran)} wave lines: {[m for _, m in marks]}")
    waves, computed = [], Counter()
    for (t0, line, t1), result in zip(ran, results):
        events = result.get_asset_materialization_events()
        fresh = [e for e in events if not e.materialization.metadata["cache_hit"].value]
        done = Counter(e.asset_key.to_user_string() for e in fresh)
        computed.update(done)
        # busy_s: the partitions' own durations summed; busy_s / s is the wave's achieved parallelism
        busy = Counter()
        for e in fresh:
            busy[e.asset_key.to_user_string()] += e.materialization.metadata["duration_s"].value
        waves.append({"wave": line.split(":", 1)[1].strip().split(" (")[0].split(": ")[0], "s": round(t1 - t0, 2),
                      "busy_s": round(sum(busy.values()), 2), "busy_by_asset": {k: round(v, 2) for k, v in busy.items()},
                      "computed": dict(done), "partitions": len(events)})
        print(json.dumps({"pass": job["label"], "workers": job["workers"], **waves[-1]}), flush=True)
    print(json.dumps({"seconds": seconds, "waves": waves, "computed": dict(computed), "up_to_date_waves": skipped}), flush=True)


# ---------------------------------------------------------------- the reference and overheads
def reference(inputs: list[Path], evals: Path, graph: Graph, prefix: Path) -> dict:
    """The single-process run_pipeline on the same raw files (one dataset), in a fresh process
    (as `marin datakit run` is; this one has forked workers, and tokenize starts jax):
    {"s": seconds of the call, "process_s": with the interpreter and imports}."""
    model = graph.store().read_pointer("quality_model", None).data_path
    tok = graph.store().read_pointer("tokenizer", None).data_path + "/tokenizer.json"
    code = f"""
import json, sys, time
sys.path.insert(0, {ROOT!r})
from marin_assets.datakit.pipeline import PipelineConfig, run_pipeline
config = PipelineConfig(quality_threshold=0.0, quality_model={model!r}, tokenizer={tok!r})
start = time.perf_counter()
summary = run_pipeline({[str(p) for p in inputs]!r}, [{str(evals)!r}], {str(prefix)!r}, config)
print(json.dumps({{"s": time.perf_counter() - start, "docs_in": summary["docs_in"], "docs_out": summary["docs_out"],
                  "removed": summary["removed"]}}))
"""
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    result = {**json.loads(out.splitlines()[-1]), "process_s": time.perf_counter() - start}
    print(json.dumps({"pass": "reference", **{k: round(v, 2) if isinstance(v, float) else v for k, v in result.items()}}), flush=True)
    return result


IMPORTS = {  # what a fresh step process imports before its body runs (a pod per shard range)
    "definitions_shards": "import assets.shards",
    "normalize": "import marin_assets.datakit.normalize",
    "fuzzy": "import marin_assets.datakit.fuzzy_dedup",
    "tokenize": "import marin_assets.datakit.tokenize, tensorstore, tokenizers",
    "levanter_cache": "import levanter.store.cache",  # what tokenize imported before CacheWriter
}


def import_seconds(code: str) -> float:
    """Best of two fresh interpreters: the seconds `code` takes to import."""
    timer = f"import time; t = time.perf_counter(); {code}; print(time.perf_counter() - t)"
    runs = [float(subprocess.run([sys.executable, "-c", timer], cwd=ROOT, check=True, capture_output=True, text=True).stdout.split()[-1])
            for _ in range(2)]
    return min(runs)


def band_rss(graph: Graph, band: str) -> tuple[int, int]:
    """(peak RSS, its growth over the imports) of one shards/fuzzy_candidates band partition
    computed in a fresh process (the body's reduces on the committed map refs, minus Dagster)."""
    code = f"""
import resource, sys
sys.path.insert(0, {ROOT!r})
from assets.shards.fuzzy import CandidatesConfig, MINHASH, roots
from assets.partitions import FUZZY_BANDS, partition_index
from marin_assets.datakit.fuzzy_dedup import band_reduce_ranges, fuzzy_band_reduce
from marin_assets.store import ArtifactStore
store = ArtifactStore({graph.prefix!r})
keys = {graph.shards()!r}
maps = {{k: store.read_pointer('shards/fuzzy_map', k) for k in keys}}
docs = sum(r.counts['docs'] for r in maps.values())
ranges = band_reduce_ranges(docs, CandidatesConfig().docs_per_reduce)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for r in range(ranges):
    fuzzy_band_reduce(partition_index({band!r}, 'band-', FUZZY_BANDS), (r, ranges), roots(maps), {str(Path(graph.prefix).parent / 'rss')!r}, MINHASH)
print(before * 1024, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True).stdout.split()
    return int(out[-1]), int(out[-1]) - int(out[-2])


# ---------------------------------------------------------------- the figures
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=4, help="raw files in the base corpus")
    parser.add_argument("--shards-per-file", type=int, default=16)
    parser.add_argument("--shard-bytes", type=int, default=512 * 1024)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--figures", default="fanout,shard_increment,shard_increment_sorts_first,end_to_end,step_overhead,"
                                             "fuzzy_candidates_peak_rss")
    parser.add_argument("--rss-files", type=int, default=1, help="raw files of the smaller graph for the RSS figure")
    parser.add_argument("--keep", help="keep the work directory here (for profiling)")
    parser.add_argument("--pass-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.pass_child:
        pass_child(json.loads(args.pass_child))
        return 0
    figures = set(args.figures.split(","))

    work = Path(args.keep or tempfile.mkdtemp(prefix="datakit_graph_"))
    try:
        corpus = make_corpus(work / "corpus", args.files, args.shards_per_file, args.shard_bytes)
        base = sorted(corpus["base"].glob("*.jsonl"))
        added = base + sorted(corpus["extra"].glob("*.jsonl"))
        mb = text_bytes(base) / 1e6
        ours = Graph(work / "ours", args.shard_bytes)
        full = ours.run(base, args.workers, "full")
        shards = len(ours.shards())
        common = {"shards": shards, "text_mb": round(mb, 3), "workers": args.workers}
        if "fanout" in figures:
            one = Graph(work / "one", args.shard_bytes).run(base, 1, "full-1-worker")
            emit("fanout", "s", full["seconds"], one["seconds"], higher_is_better=False, **common,
                 waves_1=[w["s"] for w in one["waves"]], waves_n=[w["s"] for w in full["waves"]],
                 busy_1=[w["busy_s"] for w in one["waves"]], busy_n=[w["busy_s"] for w in full["waves"]],
                 process_cpu_s_1=round(one["cpu_s"], 1), process_cpu_s_n=round(full["cpu_s"], 1),
                 process_s_1=round(one["process_s"], 1), process_s_n=round(full["process_s"], 1))
        if "step_overhead" in figures:
            again = ours.run(base, args.workers, "all-cache-hits", skip_up_to_date=False)
            assert not again["computed"], f"a rerun of an unchanged graph computed {again['computed']}"
            per_wave = again["seconds"] / len(again["waves"])
            planned = ours.run(base, args.workers, "up-to-date")
            assert not planned["computed"], f"a rerun of an unchanged graph computed {planned['computed']}"
            imports = {name: round(import_seconds(code), 2) for name, code in IMPORTS.items()}
            # reference: the same pass's share of the full run (what the fixed cost is out of)
            emit("step_overhead", "s/wave", per_wave, full["seconds"] / len(full["waves"]), higher_is_better=False, **common,
                 cached_pass_s=round(again["seconds"], 2), waves=len(again["waves"]), fresh_process_import_s=imports,
                 up_to_date_pass_s=round(planned["seconds"], 2), up_to_date_runs=len(planned["waves"]))
        if "shard_increment" in figures:
            inc = ours.run(added, args.workers, "increment")
            emit("shard_increment", "s", inc["seconds"], full["seconds"], higher_is_better=False, **common,
                 new_shards=len(ours.shards()) - shards, recomputed=inc["computed"])
        if "shard_increment_sorts_first" in figures:
            other = Graph(work / "first", args.shard_bytes)
            other_full = other.run(base, args.workers, "full-for-first")
            inc = other.run(sorted(corpus["first"].glob("*.jsonl")) + base, args.workers, "increment-sorts-first")
            emit("shard_increment_sorts_first", "s", inc["seconds"], other_full["seconds"], higher_is_better=False, **common,
                 new_shards=len(other.shards()) - shards, recomputed=inc["computed"])
        if "end_to_end" in figures:
            ref = reference(base, corpus["evals"], ours, work / "reference")
            emit("end_to_end", "MB/s", mb / full["seconds"], mb / ref["s"], higher_is_better=True, **common,
                 ours_s=round(full["seconds"], 2), reference_s=round(ref["s"], 2),
                 ours_process_s=round(full["process_s"], 2), reference_process_s=round(ref["process_s"], 2))
        if "fuzzy_candidates_peak_rss" in figures:
            small = Graph(work / "small", args.shard_bytes)
            small.run(base[: args.rss_files], args.workers, "rss-small")
            big_shards = len(ours.shards())
            small_shards = len(small.shards())
            rss = {n: max(band_rss(g, f"band-{b:02d}") for b in (0, 13)) for n, g in ((big_shards, ours), (small_shards, small))}
            emit("fuzzy_candidates_peak_rss", "bytes", rss[big_shards][0], rss[small_shards][0], higher_is_better=False,
                 shards_ours=big_shards, shards_reference=small_shards, docs_per_reduce_default=2_000_000,
                 growth_over_imports_ours=rss[big_shards][1], growth_over_imports_reference=rss[small_shards][1])
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
