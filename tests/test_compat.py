"""marin_assets/orchestration/compat.py and marin_assets/compat.py: the private Dagster and JAX
names we use still exist and behave as the code relies on (an upgrade fails here, naming what moved)."""

from __future__ import annotations

import inspect
import subprocess
import sys

import dagster as dg
import pytest

import marin_assets.orchestration.compat as compat


def test_importing_the_jax_compat_module_loads_neither_library():
    code = "import sys, marin_assets.compat as c; print(sorted({m.split('.')[0] for m in sys.modules} & {'dagster', 'jax'}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("name", sorted(compat.DAGSTER_NAMES))
def test_every_dagster_name_resolves(name):
    assert getattr(compat, name) is not None


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        compat.Nope  # noqa: B018


def test_the_run_launcher_contract_we_implement():
    abstract = compat.RunLauncher.__abstractmethods__
    assert {"launch_run", "terminate"} <= abstract
    assert list(inspect.signature(compat.RunLauncher.launch_run).parameters) == ["self", "context"]
    assert list(inspect.signature(compat.RunLauncher.check_run_worker_health).parameters) == ["self", "run"]
    fields = {
        f
        for f in ("dagster_run", "workspace")
        if hasattr(compat.LaunchRunContext, f)
        or f in getattr(compat.LaunchRunContext, "__annotations__", {})
        or f in inspect.signature(compat.LaunchRunContext).parameters
    }
    assert fields == {"dagster_run", "workspace"}
    health = compat.CheckRunHealthResult(compat.WorkerStatus.FAILED, "gone")
    assert (health.status, health.msg) == (compat.WorkerStatus.FAILED, "gone")
    assert {"RUNNING", "SUCCESS", "FAILED", "UNKNOWN"} <= {s.name for s in compat.WorkerStatus}


def test_failure_and_requeue_events_the_launcher_reports():
    data = compat.JobFailureData(error=None, failure_reason=compat.RunFailureReason.UNEXPECTED_TERMINATION)
    assert data.failure_reason == compat.RunFailureReason.UNEXPECTED_TERMINATION
    assert callable(dg.DagsterEvent.job_enqueue)
    assert list(inspect.signature(dg.DagsterEvent.job_enqueue).parameters)[:1] == ["run"]
    try:
        raise ValueError("boom")
    except ValueError:
        info = compat.serializable_error_info_from_exc_info(sys.exc_info())
    assert "boom" in info.message


def test_tags_statuses_and_run_worker_argv():
    assert compat.PRIORITY_TAG == "dagster/priority"
    assert compat.GRPC_INFO_TAG == ".dagster/grpc_info"
    assert {dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING} <= set(
        compat.ACTIVE_RUN_STATUSES
    )
    assert not {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.QUEUED} & set(
        compat.ACTIVE_RUN_STATUSES
    )
    assert {"job_origin", "run_id", "instance_ref"} <= set(inspect.signature(compat.ExecuteRunArgs).parameters)
    assert callable(compat.ExecuteRunArgs.get_command_args)
    assert compat.CanCancelExecutionRequest(run_id="r1").run_id == "r1"
    assert {"port", "socket", "host", "use_ssl"} <= set(inspect.signature(compat.DagsterGrpcClient).parameters)


def test_asset_graph_subset_takes_partitions_per_key():
    key = dg.AssetKey("x")
    subset = compat.AssetGraphSubset(partitions_subsets_by_asset_key={}, non_partitioned_asset_keys={key})
    assert subset.asset_keys == {key}


def test_merge_step_metadata_reaches_the_materialization():
    merged = {}

    @dg.asset(partitions_def=dg.StaticPartitionsDefinition(["a", "b"]))
    def ranged(context) -> None:
        merged["ok"] = compat.merge_step_metadata(context, {p: {"rows": i} for i, p in enumerate(context.partition_keys)})

    result = dg.materialize(
        [ranged],
        partition_key=None,
        instance=dg.DagsterInstance.ephemeral(),
        tags={"dagster/asset_partition_range_start": "a", "dagster/asset_partition_range_end": "b"},
    )
    assert merged["ok"] is True
    rows = {e.partition: e.materialization.metadata["rows"].value for e in result.get_asset_materialization_events()}
    assert rows == {"a": 0, "b": 1}


def test_jax_backend_and_distributed_client_in_a_fresh_process():
    code = (
        "from marin_assets.compat import xla_backends_started, distributed_client\n"
        "before = xla_backends_started()\n"
        "import jax.numpy as jnp; jnp.ones(2).block_until_ready()\n"
        "print(before, xla_backends_started(), distributed_client())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
    ).stdout
    assert out.split() == ["False", "True", "None"]


def test_a_cpu_process_other_than_0_writes_its_own_compile_cache_entries(tmp_path):
    """JAX writes persistent-cache entries from process 0 only; with
    ``cache_writes_from_every_cpu_process`` a CPU process of another index writes its own (a CPU key
    holds the process's devices, so process 0's never serve it: tests/train's 2-process runs)."""
    code = (
        "import os, sys, jax, jax.numpy as jnp\n"
        "from jax._src import distributed\n"
        "from marin_assets.compat import cache_writes_from_every_cpu_process\n"
        "jax.config.update('jax_compilation_cache_dir', sys.argv[1])\n"
        "jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)\n"
        "distributed.global_state.process_id = 1\n"
        "jax.jit(lambda x: x * 2 + 1)(jnp.ones(3)).block_until_ready()\n"
        "before = len(os.listdir(sys.argv[1]))\n"
        "cache_writes_from_every_cpu_process(); cache_writes_from_every_cpu_process()\n"
        "jax.jit(lambda x: x * 3 - 1)(jnp.ones(3)).block_until_ready()\n"
        "print(before, len(os.listdir(sys.argv[1])))\n"
    )
    cache = tmp_path / "cache"
    cache.mkdir()
    out = subprocess.run(
        [sys.executable, "-c", code, str(cache)],
        capture_output=True,
        text=True,
        check=True,
        env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
    ).stdout
    assert out.split() == ["0", "1"]
