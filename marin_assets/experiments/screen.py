"""Run a whole screen in process: the corpus (a DataKit run), every (arm, budget, seed) run, the analysis.

The Dagster assets (``assets/experiments.py``) run the same steps as partitions; this is
the CLI's path (``marin experiment screen``). Both go through the artifact store, so runs
done by either are cache hits for the other.
"""

from __future__ import annotations

from collections.abc import Callable

from marin_assets.experiments.analysis import analyze
from marin_assets.experiments.data import materialize_corpus
from marin_assets.experiments.lock import check_lock
from marin_assets.experiments.record import ExperimentRecord
from marin_assets.experiments.runs import materialize_run, plan_runs
from marin_assets.store import ArtifactStore


def run_screen(record: ExperimentRecord, store: ArtifactStore, log: Callable[[str], None] = print) -> dict:
    """The analysis dict of ``analysis.analyze``, plus {"cache_hits", "computed"} counts.

    CorpusError when the DataKit run that makes the corpus fails.
    """
    check_lock(store, record)  # an edited started record is refused before anything runs
    corpus = materialize_corpus(store, record.data_files, log)
    specs = plan_runs(record, corpus.vocab_size)  # every config is built (and validated) before the first run
    rows, hits = [], 0
    for spec in specs:
        row, hit = materialize_run(store, record, spec, corpus, log)
        rows.append(row)
        hits += hit
    result = analyze(record, rows)
    result["cache_hits"], result["computed"] = hits, len(specs) - hits
    return result
