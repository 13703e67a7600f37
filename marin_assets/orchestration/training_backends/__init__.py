"""Training backends: where a ``train/<run>`` phase runs, chosen as a Dagster resource.

* ``LocalTrainingBackend``: in-process ``marin_assets.train.loop.train`` (the demo's path).
* ``ProcessesTrainingBackend``: N worker processes on this machine, joined by
  ``jax.distributed`` (gloo collectives on CPU); what CI tests.
* ``KubernetesTrainingBackend``: the headless Service and one Indexed Job per interconnect
  domain from ``marin_assets.cluster.manifests``, created through the cluster's own API
  client from inside the (small, CPU-only) Dagster run worker pod. Its size comes from the
  run's ``marin/accelerator`` and ``marin/chips`` tags, validated against the fleet file.

All three return a ``TrainOutcome``; the asset turns it into materialisation metadata.

The worker contract (``marin_assets.train.distributed.worker`` implements it; the backends launch it
through ``pipes_worker``, which adds the Pipes context)::

    python -m marin_assets.orchestration.training_backends.pipes_worker --spec SPEC

SPEC is a JSON file or fsspec URL holding ``TrainSpec.to_json_dict()`` (one class for both
sides, ``marin_assets.train.spec``, which names its keys). Each process gets
JAX_COORDINATOR_ADDRESS (host:port), JAX_NUM_PROCESSES, JOB_COMPLETION_INDEX,
MARIN_PROCESS_OFFSET (process id = offset + index, see
``cluster.jax_env.jax_distributed_args``), MARIN_DEVICES_PER_PROCESS when set, and Dagster
Pipes' bootstrap variables. Process 0 alone opens Pipes (``open_dagster_pipes()``):

* logs: ``pipes.log.info(...)`` (forwarded to the step's log);
* per-step metrics: ``pipes.report_custom_message({"metrics": row})``, ``row`` a metrics
  row with at least an int ``step`` and a float ``loss``;
* final counts, once: ``pipes.report_asset_materialization(metadata=...)`` with the keys of
  ``OUTCOME_FIELDS`` (``final_step``, ``tokens``, ``phase_start_step``, ``last_loss``,
  ``tokens_left`` {source: int}, ``counts`` {guard event: int}); Pipes wants the two
  mappings typed: ``{"raw_value": {...}, "type": "json"}``.

A worker that exits 0 without the final report fails the step: nothing useful happened.

Message readers: a temp file for local processes (``PipesTempFileMessageReader``: no ports,
nothing to clean up beyond a temp dir). On Kubernetes the rank-0 pod's log stream, read
through the same API client that created the pods (``PipesK8sPodLogsMessageReader``), so a
training job needs no bucket, credentials or network path back to the run worker beyond
the API server it already talks to; a GCS reader would also work but adds a bucket and its
IAM to every cluster for a few kilobytes of messages.

Modules: ``base`` (outcome, base resource), ``local``, ``launch`` (local worker processes),
``processes``, ``kubernetes``.
"""

from marin_assets.orchestration.training_backends.base import (
    OUTCOME_FIELDS,
    WORKER_MODULE,
    TrainingBackend,
    TrainingFailed,
    TrainOutcome,
    outcome_from_report,
    outcome_from_session,
)
from marin_assets.orchestration.training_backends.kubernetes import (
    KubeApis,
    KubernetesTrainingBackend,
    KubeTrainingJob,
    choose_pool,
    pool_tags,
)
from marin_assets.orchestration.training_backends.launch import launch_workers, worker_env
from marin_assets.orchestration.training_backends.local import LocalTrainingBackend
from marin_assets.orchestration.training_backends.processes import ProcessesTrainingBackend
from marin_assets.train.spec import TrainSpec

__all__ = [
    "OUTCOME_FIELDS",
    "WORKER_MODULE",
    "KubeApis",
    "KubeTrainingJob",
    "KubernetesTrainingBackend",
    "LocalTrainingBackend",
    "ProcessesTrainingBackend",
    "TrainOutcome",
    "TrainSpec",
    "TrainingBackend",
    "TrainingFailed",
    "choose_pool",
    "launch_workers",
    "outcome_from_report",
    "outcome_from_session",
    "pool_tags",
    "worker_env",
]
