"""`python -m assets.shards.run --spec JSON`: the driver `marin datakit run` starts.

It materialises the sharded DataKit graph (assets/shards/) over the user's files on an
ephemeral Dagster instance, one run per wave (marin_assets.orchestration.waves); each range
run computes its partitions on $MARIN_LOCAL_WORKERS processes (--workers). Artifacts go to a
content-versioned store under PREFIX/store, so a rerun into the same prefix recomputes only
what changed. Then it writes what the CLI promises:
  PREFIX/final_documents   every shards/final partition, re-chunked into --shard-docs Parquet shards
  PREFIX/tokenizer/        the trained tokenizer (the `tokenizer` asset), when none was given
  PREFIX/cache/{train,validation}, stats.json   ONE Levanter cache of the final documents
  PREFIX/summary.json      the summary, per-shard counts and the runs
and prints the summary as one JSON line. Exit 1 for a failed wave or a run that kept nothing.
It lives in the definition layer (it imports assets/); the library CLI runs it as a process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

import dagster as dg

from assets.shards.common import merge_counts, shard_file
from assets.shards.index import INDEX_KEY, index_keys, register_shards
from assets.shards.user_inputs import copy_file, run_config, user_graph
from marin_assets.datakit.pipeline import (
    REMOVAL_REASONS,
    STORE_ENTRY,
    RunSpec,
    apply_filters,
    check_run_inputs,
    display_path,
    merge_reasons,
    remove_prefix_entries,
)
from marin_assets.datakit.shards import join, list_shards, write_json
from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource
from marin_assets.orchestration.fanout import WORKERS_ENV
from marin_assets.orchestration.waves import materialize_waves

PROG = "marin datakit run"
SKIPPED = {"shards/tokenized"}  # per-shard caches: the CLI writes one cache of all final documents


class RunFailed(RuntimeError):
    pass


def say(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def failure(result: dg.ExecuteInProcessResult) -> str:
    """The failed steps of a run and their errors (the user's exception, not Dagster's wrapper)."""
    lines = []
    for event in result.get_step_failure_events():
        error = event.step_failure_data.error
        while error is not None and error.cause is not None and "Error occurred while executing" in error.message:
            error = error.cause
        message = (error.message if error is not None else "unknown error").strip().splitlines()
        lines.append(f"{event.step_key} failed: {' '.join(message[:3])}")
    return "; ".join(lines) or f"run {result.run_id} failed"


def warm_imports() -> None:
    """Import what the step bodies import lazily, once, before the range runs fork their
    workers: a forked worker then starts with them loaded instead of paying each import
    once per step (about 2 s a step on 2 cores, more than the steps' own work on small shards).
    pandas too: pa.array() on numpy or Python values imports it (~0.35 s), and the quality,
    exact, decontamination and filter steps call that; imported here, no worker pays it."""
    import pandas  # noqa: F401
    import pyarrow.compute  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    from marin_assets.datakit import decontaminate, dedup_exact, fuzzy_dedup, normalize, quality, readers, removals  # noqa: F401


def materialize(spec: RunSpec, store: ArtifactStoreResource, log) -> list[str]:
    """Every wave of the run's graph (shards/tokenized excepted); returns the run ids."""
    assets = user_graph(spec)
    warm_imports()
    resources = {"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)}
    config = run_config(spec, assets)
    instance = dg.DagsterInstance.ephemeral()
    keys = {spec_.key for a in assets for spec_ in a.specs}
    # First the unpartitioned roots and the index: its shard keys become the partitions of the rest.
    first = {k for a in assets if a.partitions_def is None and not a.keys_by_input_name for k in a.keys}
    first.add(dg.AssetKey(INDEX_KEY.split("/")))
    rest = keys - first - {dg.AssetKey(k.split("/")) for k in SKIPPED}
    run_ids: list[str] = []
    for selection in (first, rest):
        results = materialize_waves(assets, instance, resources, selection=selection, log=log, run_config=config)
        run_ids += [r.run_id for r in results]
        if results and not results[-1].success:
            raise RunFailed(failure(results[-1]))
        if selection is first:  # on a cache hit the index body (which registers keys) did not run
            register_shards(instance, index_keys(store.store.read_pointer(INDEX_KEY, None)))
    return run_ids


def summarize(spec: RunSpec, store, run_ids: list[str]) -> dict:
    """Write final_documents, tokenizer and the cache; return the summary (also in summary.json)."""
    from marin_assets.datakit.pipeline import dataset_names
    from marin_assets.datakit.tokenize import tokenize

    prefix, config = spec.prefix, spec.config
    keys = index_keys(store.read_pointer(INDEX_KEY, None))
    finals = {k: store.read_pointer("shards/final", k) for k in keys}
    per_shard = {k: dict(ref.counts) for k, ref in finals.items()}
    sources = [store.read_pointer(f"sources/{name}", None).counts for name in dataset_names(spec.inputs)]
    unread = sum(c["quarantined"] for c in sources)  # files of a format no reader reads
    reasons = merge_reasons([*(store.read_pointer("shards/normalized", k).counts["quarantine_reasons"] for k in keys),
                             *(c["quarantine_reasons"] for c in sources)])
    final_dir = join(prefix, "final_documents")
    written = apply_filters({"": [shard_file(ref) for ref in finals.values()]}, [], final_dir, config.shard_docs, columns=["id", "text"])
    tokenizer_path = config.tokenizer
    if tokenizer_path is None:  # the trained one: the `tokenizer` asset's files, copied out of the store
        trained = store.read_pointer("tokenizer", None)
        for file in trained.files():
            copy_file(file, join(prefix, "tokenizer", file[len(trained.data_path.rstrip("/")) + 1:]))
        tokenizer_path = join(prefix, "tokenizer", "tokenizer.json")
    stats = tokenize(list_shards(final_dir), tokenizer_path, join(prefix, "cache"), config.tokenization())
    removed = {r: 0 for r in REMOVAL_REASONS}
    removed.update(merge_counts(*(c["removed"] for c in per_shard.values())))
    summary = {
        "docs_in": sum(c["docs_in"] for c in per_shard.values()) + unread,
        "docs_out": written["docs_out"],
        "removed": removed,
        "quarantined": sum(c["quarantined"] for c in per_shard.values()) + unread,
        "tokens": {"train": stats["train"]["tokens"], "validation": stats["validation"]["tokens"]},
        "final_documents": display_path(final_dir),
        "cache": display_path(join(prefix, "cache")),
        "tokenizer": display_path(tokenizer_path),
        "quarantine_reasons": reasons,
    }
    if summary["docs_in"] != summary["docs_out"] + sum(removed.values()) + summary["quarantined"]:
        raise AssertionError(f"document accounting broken: {summary}")
    write_json({"summary": summary, "shards": per_shard, "store": display_path(store.prefix), "runs": run_ids},
               join(prefix, "summary.json"))
    return summary


def run(spec: RunSpec) -> int:
    """0 with the summary printed; 1 for bad input, a failed wave, or a run that kept nothing."""
    log = (lambda message: None) if spec.quiet else say
    try:
        check_run_inputs(spec.inputs, spec.evals, spec.prefix, spec.config)
    except (FileNotFoundError, ValueError) as e:
        say(str(e))
        return 1
    os.environ[WORKERS_ENV] = str(spec.workers)  # read by every range run (fanout.local_workers)
    remove_prefix_entries(spec.prefix)
    store = ArtifactStoreResource(prefix=join(spec.prefix, STORE_ENTRY))
    try:
        run_ids = materialize(spec, store, log)
        log("writing final_documents, the tokenizer and the cache")
        summary = summarize(spec, store.store, run_ids)
    except (RunFailed, FileNotFoundError, ValueError) as e:
        say(str(e))
        return 1
    print(json.dumps(summary, sort_keys=True), flush=True)
    if summary["docs_out"] == 0:
        say(f"no documents left ({summary['docs_in']} read, {summary['quarantined']} quarantined, "
            f"removed {summary['removed']}); the cache is empty")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m assets.shards.run", description=__doc__.split("\n")[0])
    parser.add_argument("--spec", required=True, help="the run, as RunSpec.to_json() writes it")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=dg.BetaWarning)
    warnings.filterwarnings("ignore", category=dg.PreviewWarning)
    return run(RunSpec.from_json(args.spec))


if __name__ == "__main__":
    sys.exit(main())
