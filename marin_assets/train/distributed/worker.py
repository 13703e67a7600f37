"""The training worker: one process of a (possibly multi-process) training phase.

    python -m marin_assets.train.distributed.worker --spec SPEC.json

SPEC: ``TrainSpec.to_json_dict()`` (``marin_assets/train/spec.py`` names its keys), in a
local file or at an fsspec URL; the orchestration side builds the same ``TrainSpec``.

Environment: see marin_assets/train/distributed/hosts.py (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
JOB_COMPLETION_INDEX, MARIN_PROCESS_OFFSET, MARIN_DEVICES_PER_PROCESS,
MARIN_EXPERT_PARALLEL, MARIN_HEARTBEAT_TIMEOUT_S, MARIN_INIT_TIMEOUT_S) and Dagster
Pipes' (DAGSTER_PIPES_CONTEXT, DAGSTER_PIPES_MESSAGES).

This module imports nothing of Dagster: the backends launch it through
``marin_assets.orchestration.training_backends.pipes_worker``, which hands ``main`` the
Pipes context. ``marin train --processes`` launches it through ``marin_assets.cli._train_worker``:
without reports. Both entry points hand ``main`` the reader of an ``hf:PATH`` warm start
(``marin_assets.hf.warm_start_weights``; train does not import hf, which sits above it); run
directly, the worker refuses one.

With Pipes, process 0 reports: log lines, one
custom message per step ``{"metrics": {...}}`` (the metrics.jsonl row), and at the end one
asset materialization whose metadata is the run's counts (final_step, tokens,
phase_start_step, last_loss, tokens_left, counts, data_position, ...): the contract of
marin_assets/orchestration/training_backends/. Other processes report
nothing. Exit codes: 0 done, 2 bad spec, 1 anything else (the traceback is on stderr and,
on process 0, in the Pipes closed message).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from marin_assets.train.distributed import hosts as distributed
from marin_assets.train.distributed import mesh as meshlib
from marin_assets.train.spec import TrainSpec, load_spec

if TYPE_CHECKING:  # the module stays light until main runs: restore imports JAX
    from marin_assets.train.restore import WeightsReader

log = logging.getLogger("marin_assets.train.distributed.worker")

EXIT_BAD_SPEC = 2


def result_metadata(result, mesh) -> dict:
    """The materialisation's metadata: the run's final counts (JSON-able values only)."""
    meta = {
        "final_step": result.final_step,
        "tokens": result.tokens,
        "counts": dict(result.counts),
        "data_position": result.data_position,
        "tokens_left": dict(result.tokens_left),
        "phase_start_step": result.phase_start_step,
        "metrics_path": str(result.metrics_path),
        "checkpoint_dir": str(result.checkpoint_dir) if result.checkpoint_dir else "",
        "mesh": {k: int(v) for k, v in mesh.shape.items()},
        "devices": int(mesh.size),
        "stopped_by": result.stopped_by or "",
    }
    # Pipes infers scalars and strings; mappings (and a missing loss) must say what they are.
    typed = {k: {"raw_value": v, "type": "json"} if isinstance(v, Mapping) else v for k, v in meta.items()}
    typed["last_loss"] = {"raw_value": None, "type": "null"} if result.last_loss is None else float(result.last_loss)
    return typed


def run(spec: TrainSpec, pipes=None, read_weights: WeightsReader | None = None) -> int:
    """Train the phase in this process; ``pipes``: the Pipes context on process 0, else None;
    ``read_weights``: what reads an ``hf:PATH`` warm start (``train``'s argument)."""
    from marin_assets.train.loop import train_spec  # deferred (import cost): jax, optax, polars, pyarrow

    config = spec.config
    mesh = meshlib.train_mesh(config)
    meshlib.check_fits(mesh, config.model, config.batch_size, config.seq_len, config.microbatches, config.sequence_parallel)

    def report(row: dict) -> None:
        if pipes is not None:
            pipes.report_custom_message({"metrics": row})

    starting = f"training {config.phase}: {config.num_steps} steps on mesh {dict(mesh.shape)}"
    log.info(starting)  # the worker's own log (marin train --processes: OUT/workers/process-<i>.log)
    if pipes is not None:
        pipes.log.info(starting)
    result = train_spec(spec, log_fn=report, mesh=mesh, read_weights=read_weights)
    if pipes is not None:
        pipes.log.info(
            result.stop_message if result.stopped_by else f"done at step {result.final_step}, last loss {result.last_loss}"
        )
        pipes.report_asset_materialization(metadata=result_metadata(result, mesh))
    return 0


def main(
    argv: list[str] | None = None,
    open_reporter: Callable[[], AbstractContextManager] | None = None,
    prog: str = "python -m marin_assets.train.distributed.worker",
    read_weights: WeightsReader | None = None,
) -> int:
    """open_reporter: opens process 0's reporter (the Pipes context, given by the entry point
    the backends launch: marin_assets/orchestration/training_backends/pipes_worker.py); None
    trains without reports (`marin train --processes`). read_weights: ``run``'s."""
    ap = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", required=True, help="the worker spec JSON file")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        spec = load_spec(args.spec)
    except ValueError as e:
        print(f"marin train worker: bad spec: {e}", file=sys.stderr)
        return EXIT_BAD_SPEC

    setup = distributed.init_distributed()  # before anything starts a JAX backend
    if setup.process_id != 0 or open_reporter is None:
        return run(spec, read_weights=read_weights)
    with open_reporter() as pipes:  # reports an exception raised inside (to Dagster)
        return run(spec, pipes, read_weights)


if __name__ == "__main__":
    raise SystemExit(main())
