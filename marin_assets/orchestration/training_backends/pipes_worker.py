"""The training worker as the backends launch it: ``marin_assets.train.distributed.worker`` with process 0
reporting through Dagster Pipes.

    python -m marin_assets.orchestration.training_backends.pipes_worker --spec SPEC

The worker itself (the library side) knows nothing of Dagster; this entry point hands it
``open_dagster_pipes`` (a no-op mock when no Pipes bootstrap variables are set), which
reports an exception raised inside to Dagster as well, and the reader of an ``hf:PATH`` warm
start (``marin_assets.hf.warm_start_weights``: train does not import hf, which sits above it).
"""

from __future__ import annotations

from marin_assets.hf import warm_start_weights
from marin_assets.train.distributed import worker


def open_pipes():
    from dagster_pipes import open_dagster_pipes

    return open_dagster_pipes()


def main(argv: list[str] | None = None) -> int:
    return worker.main(argv, open_reporter=open_pipes, prog=f"python -m {__name__}", read_weights=warm_start_weights)


if __name__ == "__main__":
    raise SystemExit(main())
