"""Every private name of Dagster the project uses, in one place.

Private modules (``dagster._core...``) can move in any release; the pin (dagster 1.13.27,
requirements.lock) holds them still, and tests/test_compat.py pins the behaviour each use
relies on, so an upgrade fails there, naming the name, instead of deep inside a run. Nothing
else imports a private module (tests/test_layering.py); JAX's private names are in
marin_assets/compat.py. Names resolve lazily (a module ``__getattr__``).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what a type checker sees; at run time the names resolve lazily (__getattr__)
    from dagster._core.definitions.assets.graph.asset_graph_subset import AssetGraphSubset
    from dagster._core.definitions.data_version import DATA_VERSION_TAG
    from dagster._core.errors import DagsterLaunchFailedError
    from dagster._core.events import JobFailureData, RunFailureReason
    from dagster._core.execution.context.metadata_logging import AssetMetadataHandle, OutputMetadataAccumulator
    from dagster._core.launcher import LaunchRunContext, RunLauncher
    from dagster._core.launcher.base import CheckRunHealthResult, WorkerStatus
    from dagster._core.origin import JobPythonOrigin
    from dagster._core.storage.dagster_run import ACTIVE_RUN_STATUSES
    from dagster._core.storage.tags import GRPC_INFO_TAG, PRIORITY_TAG
    from dagster._grpc.client import DagsterGrpcClient
    from dagster._grpc.types import CanCancelExecutionRequest, CanCancelExecutionResult, ExecuteRunArgs
    from dagster._serdes import ConfigurableClass, ConfigurableClassData
    from dagster._utils.error import serializable_error_info_from_exc_info

__all__ = [
    "ACTIVE_RUN_STATUSES",
    "AssetGraphSubset",
    "AssetMetadataHandle",
    "CanCancelExecutionRequest",
    "CanCancelExecutionResult",
    "CheckRunHealthResult",
    "ConfigurableClass",
    "DATA_VERSION_TAG",
    "ConfigurableClassData",
    "DagsterGrpcClient",
    "DagsterLaunchFailedError",
    "ExecuteRunArgs",
    "GRPC_INFO_TAG",
    "JobFailureData",
    "JobPythonOrigin",
    "LaunchRunContext",
    "OutputMetadataAccumulator",
    "PRIORITY_TAG",
    "RunFailureReason",
    "RunLauncher",
    "WorkerStatus",
    "serializable_error_info_from_exc_info",
    "DAGSTER_NAMES",
    "merge_step_metadata",
]

# name -> the private module it lives in (public names are imported from ``dagster``).
DAGSTER_NAMES: dict[str, str] = {
    # the run launcher contract (orchestration/launcher.py, local_backend.py, k8s_backend.py)
    "RunLauncher": "dagster._core.launcher",
    "LaunchRunContext": "dagster._core.launcher",
    "CheckRunHealthResult": "dagster._core.launcher.base",
    "WorkerStatus": "dagster._core.launcher.base",
    "DagsterLaunchFailedError": "dagster._core.errors",
    "JobFailureData": "dagster._core.events",
    "RunFailureReason": "dagster._core.events",
    "ConfigurableClass": "dagster._serdes",
    "ConfigurableClassData": "dagster._serdes",
    "serializable_error_info_from_exc_info": "dagster._utils.error",
    "ACTIVE_RUN_STATUSES": "dagster._core.storage.dagster_run",
    "GRPC_INFO_TAG": "dagster._core.storage.tags",
    "PRIORITY_TAG": "dagster._core.storage.tags",
    "JobPythonOrigin": "dagster._core.origin",
    # the code server a local run lives in, and the argv of a Kubernetes run worker
    "DagsterGrpcClient": "dagster._grpc.client",
    "CanCancelExecutionRequest": "dagster._grpc.types",
    "CanCancelExecutionResult": "dagster._grpc.types",
    "ExecuteRunArgs": "dagster._grpc.types",
    # a backfill of exact partitions per asset (sensors/user_shards.py)
    "AssetGraphSubset": "dagster._core.definitions.assets.graph.asset_graph_subset",
    # the tag that makes a logged AssetMaterialization carry a data version (a phase's checkpoint assets)
    "DATA_VERSION_TAG": "dagster._core.definitions.data_version",
    # a range run's per-partition metadata in one update (merge_step_metadata below)
    "AssetMetadataHandle": "dagster._core.execution.context.metadata_logging",
    "OutputMetadataAccumulator": "dagster._core.execution.context.metadata_logging",
}


def __getattr__(name: str) -> Any:
    module = DAGSTER_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


# -- Dagster: private attributes ---------------------------------------------------------------


def merge_step_metadata(context: Any, metadata: Mapping[str, Mapping[str, Any]]) -> bool:
    """Merge {partition: metadata} into the step's output metadata accumulator in one update,
    as per-partition ``context.add_asset_metadata`` calls would (each of which copies the whole
    accumulator: quadratic over a range of thousands). Uses two private attributes
    (``_step_execution_context``, ``_metadata_accumulator``); returns False, having changed
    nothing, when they are not what this expects, so the caller falls back to the public call."""
    accumulator_type = __getattr__("OutputMetadataAccumulator")
    handle = __getattr__("AssetMetadataHandle")
    step = getattr(context.op_execution_context, "_step_execution_context", None)
    accumulator = getattr(step, "_metadata_accumulator", None)
    if step is None or accumulator is None or not isinstance(accumulator, accumulator_type):
        return False
    key = context.assets_def.key
    added = {
        handle(asset_key=key, partition_key=p): {**accumulator.get_asset_metadata(key, p), **values}
        for p, values in metadata.items()
    }
    step._metadata_accumulator = accumulator_type(per_output_metadata={**accumulator.per_output_metadata, **added})
    return True
