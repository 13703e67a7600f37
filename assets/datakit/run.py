"""`python -m assets.datakit.run --spec JSON`: the driver `marin datakit run` starts.

It materialises the DataKit graph (assets/datakit/) over the user's files on an ephemeral
Dagster instance, one run per wave (marin_assets.orchestration.waves); each range run
computes its partitions on --workers processes (the store resource's local_workers). Artifacts, the
per-shard Levanter caches included, go to the content-versioned store PREFIX/store, so a
rerun into the same prefix recomputes only what changed. Then it writes what the CLI
promises, and nothing else under the prefix:
  PREFIX/cache/dataset.json    one dataset over every input's shard caches (they stay in the
                               store and are read in place: `marin train --cache PREFIX/cache`)
  PREFIX/cache/tokenizer.json  the tokenizer they were written with
  PREFIX/summary.json          the summary, per-dataset counts and the runs
  PREFIX/run.json              the run's spec (run_location.py rebuilds its graph for the UI)
and prints the summary as one JSON line. With $DAGSTER_HOME set the runs are recorded in that
instance, on shard partitions of the run's own (the demo's datakit_shards are left alone). A
run holds PREFIX/.datakit.lease while it works: a second run into the same prefix is refused,
never interleaved. Exit 1 for bad input, a failed
wave, a prefix in use, or a run that kept nothing. It lives in the definition layer (it
imports assets/); the library CLI runs it as a process.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import warnings

import dagster as dg

from assets.datakit.common import merge_counts
from assets.datakit.datasets import dataset_key
from assets.datakit.index import INDEX_KEY, index_keys, register_shards
from assets.datakit.user_inputs import run_config, user_graph
from marin_assets.datakit.datasets import combine, read_dataset, write_dataset
from marin_assets.datakit.run_spec import (
    CACHE_ENTRY,
    LEASE_ENTRY,
    REMOVAL_REASONS,
    RUN_FILE,
    STORE_ENTRY,
    SUMMARY_FILE,
    RunSpec,
    check_run_inputs,
    dataset_names,
    display_path,
)
from marin_assets.datakit.shards import copy_file, join
from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource
from marin_assets.orchestration.waves import materialize_waves
from marin_assets.store.fsutil import StoreUnusable, check_bucket, filesystem, write_json_atomic
from marin_assets.store.lease import Lease, LeaseDamaged, SystemClock

PROG = "marin datakit run"


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
    for evaluation in result.get_asset_check_evaluations():
        if not evaluation.passed:
            meta = {k: v.value for k, v in evaluation.metadata.items()}
            lines.append(f"check {evaluation.check_name} of {evaluation.asset_key.to_user_string()} failed: {meta}")
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


def recording_instance() -> dg.DagsterInstance:
    """$DAGSTER_HOME's instance when it is set (the runs and their materializations appear in
    its UI: see run_location.py for the lineage), else an ephemeral one. A $DAGSTER_HOME that
    does not exist yet is made, as `make` and `marin demo` do (Dagster would refuse it)."""
    home = os.environ.get("DAGSTER_HOME")
    if not home:
        return dg.DagsterInstance.ephemeral()
    os.makedirs(home, exist_ok=True)
    return dg.DagsterInstance.get()


def materialize(spec: RunSpec, store: ArtifactStoreResource, log) -> list[str]:
    """Every wave of the run's graph; returns the run ids."""
    assets, checks, shards = user_graph(spec)
    warm_imports()
    resources = {"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)}
    config = run_config(spec, assets)
    with recording_instance() as instance:
        return _waves(assets, checks, shards, instance, resources, config, store, log)


def _waves(assets, checks, shards, instance, resources, config, store, log) -> list[str]:
    keys = {spec_.key for a in assets for spec_ in a.specs}
    # First the sources, the fixed inputs and the index (its shard keys become the partitions
    # of the rest), then everything after it.
    after_index = _downstream(assets, dg.AssetKey(INDEX_KEY.split("/")))
    first = {k for a in assets if a.partitions_def is None for k in a.keys if k not in after_index}
    run_ids: list[str] = []
    for selection in (first, keys - first):
        results = materialize_waves([*assets, *checks], instance, resources, selection=selection, log=log, run_config=config)
        run_ids += [r.run_id for r in results]
        if results and not results[-1].success:
            raise RunFailed(failure(results[-1]))
        if selection is first:  # on a cache hit the index body (which registers keys) did not run
            register_shards(instance, index_keys(store.store.read_pointer(INDEX_KEY, None)), shards)
    return run_ids


def _downstream(assets, root: dg.AssetKey) -> set[dg.AssetKey]:
    """Every key that depends on ``root``, directly or not."""
    parents = {spec.key: {dep.asset_key for dep in spec.deps} for a in assets for spec in a.specs}
    found: set[dg.AssetKey] = set()
    grew = True
    while grew:
        grew = False
        for key, ups in parents.items():
            if key not in found and (root in ups or ups & found):
                found.add(key)
                grew = True
    return found


def summarize(spec: RunSpec, store, run_ids: list[str]) -> dict:
    """Write the dataset index and the tokenizer under PREFIX/cache, and summary.json; return the summary."""
    names = dataset_names(spec.inputs)
    keys = index_keys(store.read_pointer(INDEX_KEY, None))
    per_shard = {k: dict(store.read_pointer("shards/final", k).counts) for k in keys}
    sources = [store.read_pointer(f"sources/{name}", None).counts for name in names]
    unread = sum(c["quarantined"] for c in sources)  # files of a format no reader reads
    reasons = merge_counts(
        *(store.read_pointer("shards/normalized", k).counts["quarantine_reasons"] for k in keys),
        *(c["quarantine_reasons"] for c in sources),
    )
    datasets = {name: store.read_pointer(dataset_key(name), None) for name in names}
    combined = combine("cache", [read_dataset(ref.data_path) for ref in datasets.values()])
    cache_dir = join(spec.prefix, CACHE_ENTRY)
    write_dataset(combined, cache_dir)
    copy_file(join(store.read_pointer("tokenizer", None).data_path, "tokenizer.json"), join(cache_dir, "tokenizer.json"))
    masked = [store.read_pointer("shards/pii", k).counts for k in keys]
    languages = merge_counts(*(store.read_pointer("shards/language", k).counts["languages"] for k in keys))
    removed = {r: 0 for r in REMOVAL_REASONS}
    removed.update(merge_counts(*(c["removed"] for c in per_shard.values())))
    summary = {
        "docs_in": sum(c["docs_in"] for c in per_shard.values()) + unread,
        "docs_out": sum(c["docs_out"] for c in per_shard.values()),
        "removed": removed,
        "quarantined": sum(c["quarantined"] for c in per_shard.values()) + unread,
        "tokens": {"train": combined.train_tokens, "validation": combined.validation_tokens},
        "shards": len(combined.shards),
        "cache": display_path(cache_dir),
        "tokenizer": spec.tokenizer.tokenizer,
        "vocab_size": combined.vocab_size,
        "store": display_path(join(spec.prefix, STORE_ENTRY)),
        "quarantine_reasons": reasons,
        "pii_masked": merge_counts(*(c["pii"] for c in masked)),
        "languages": languages,
        "skipped_files": {f"{name}/{entry}": why for name, c in zip(names, sources) for entry, why in c["skip_reasons"].items()},
    }
    if summary["docs_in"] != summary["docs_out"] + sum(removed.values()) + summary["quarantined"]:
        raise AssertionError(f"document accounting broken: {summary}")
    detail = {
        name: {
            "shards": ref.counts["shards"],
            "train_tokens": ref.counts["train_tokens"],
            "validation_tokens": ref.counts["validation_tokens"],
            "version": ref.version,
        }
        for name, ref in datasets.items()
    }
    fs, summary_path = filesystem(join(spec.prefix, SUMMARY_FILE))
    write_json_atomic(fs, summary_path, {"summary": summary, "datasets": detail, "shards": per_shard, "runs": run_ids})
    write_json_atomic(fs, filesystem(join(spec.prefix, RUN_FILE))[1], json.loads(spec.to_json()))
    return summary


class PrefixBusy(RuntimeError):
    """Another run holds the prefix's lease and is alive."""


def hold_prefix(spec: RunSpec, clock=None) -> Lease:
    """PREFIX/.datakit.lease, held. A crashed run's lease on an object store is taken over once this
    process has watched it unrenewed for the stale window (90 s; progress lines say so), since no
    kernel frees it. PrefixBusy when a live run holds it; LeaseDamaged for a lease folder or lock
    file that is something else."""
    fs, prefix = filesystem(spec.prefix)
    lease = Lease(fs, join(prefix, LEASE_ENTRY), clock=clock or SystemClock())
    if not lease.acquire_waiting(say):
        raise PrefixBusy(
            f"another {PROG} is working on {spec.prefix} (its lease: {join(spec.prefix, LEASE_ENTRY)}); "
            "wait for it to finish or use another --prefix"
        )
    return lease


def run(spec: RunSpec) -> int:
    """0 with the summary printed; 1 for bad input, a failed wave, a busy prefix or a run that kept
    nothing; 2 for a prefix no run can use (no such bucket, a missing credentials file, a damaged lease)."""
    log = (lambda message: None) if spec.quiet else say
    try:
        check_bucket(spec.prefix)  # before check_run_inputs, whose first look at a gs:// prefix would retry for a minute
    except StoreUnusable as e:
        say(str(e))
        return 2
    try:
        check_run_inputs(spec)
    except (FileNotFoundError, ValueError) as e:
        say(str(e))
        return 1
    try:
        lease = hold_prefix(spec)
    except PrefixBusy as e:
        say(str(e))
        return 1
    except LeaseDamaged as e:
        say(str(e))
        return 2
    try:
        # --workers travels in the resource every range run receives, not in our environment
        store = ArtifactStoreResource(prefix=join(spec.prefix, STORE_ENTRY), local_workers=spec.workers)
        run_ids = materialize(spec, store, log)
        log("writing the dataset index")
        summary = summarize(spec, store.store, run_ids)
    except (RunFailed, OSError, ValueError) as e:  # OSError: a full disk, a file-size limit (EFBIG), ...
        say(f"{type(e).__name__}: {e}" if isinstance(e, OSError) and not isinstance(e, FileNotFoundError) else str(e))
        return 1
    finally:
        lease.release()
    print(json.dumps(summary, sort_keys=True), flush=True)
    if summary["docs_out"] == 0:
        say(
            f"no documents left ({summary['docs_in']} read, {summary['quarantined']} quarantined, "
            f"removed {summary['removed']}); the cache is empty"
        )
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m assets.datakit.run", description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--spec", required=True, help="the run, as RunSpec.to_json() writes it")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=dg.BetaWarning)
    warnings.filterwarnings("ignore", category=dg.PreviewWarning)
    # What is imported by now lives as long as the process: out of the collector's sight, the
    # run's collections skip its ~10^6 objects and forked workers do not copy its pages by
    # scanning them (gc.freeze's documented use before fork). Frozen again at the end, the exit
    # does not walk the run's heap either: ~0.5 s of a 9 s run, measured, for nothing.
    gc.freeze()
    try:
        return run(RunSpec.from_json(args.spec))
    finally:
        gc.freeze()


if __name__ == "__main__":
    sys.exit(main())
