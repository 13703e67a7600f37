"""Run a whole screen in process: the corpus, every (arm, budget, seed) run, the analysis.

The Dagster assets (``assets/experiments.py``) run the same steps as partitions; this is
the CLI's path (``marin experiment screen``). Both go through the artifact store, so runs
done by either are cache hits for the other.
"""

from __future__ import annotations

from typing import Callable

from marin_assets.experiments.analysis import analyze
from marin_assets.experiments.lock import check_lock
from marin_assets.experiments.record import ExperimentRecord
from marin_assets.experiments.runs import materialize_corpus, materialize_run, plan_runs
from marin_assets.store import ArtifactStore


def run_screen(record: ExperimentRecord, store: ArtifactStore, log: Callable[[str], None] = print) -> dict:
    """The analysis dict of ``analysis.analyze``, plus {"cache_hits", "computed"} counts."""
    check_lock(store, record)  # an edited started record is refused before anything runs
    specs = plan_runs(record)  # every config is built (and validated) before the first run
    corpus_ref = materialize_corpus(store, record.data_files, log)
    rows, hits = [], 0
    for spec in specs:
        row, hit = materialize_run(store, record, spec, corpus_ref, log)
        rows.append(row)
        hits += hit
    result = analyze(record, rows)
    result["cache_hits"], result["computed"] = hits, len(specs) - hits
    return result
