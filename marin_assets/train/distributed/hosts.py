"""The job's processes: who this process is, joining the others, and host-side agreement.

    setup = init_distributed()       # before anything touches a JAX backend (marin_assets/train/distributed/mesh.py then
                                     # lays the global devices out as a mesh)
    if agree(time_to_save): ...      # process 0's host decision, on every process
    barrier("checkpoint-written")    # every process reaches it before any goes on
    if is_writer(): ...              # only process 0 writes metrics, results and markers

Every sync here goes through the coordination service (its key-value store and barriers), not
a device collective: the first collective over a device group builds a gloo context that waits
only a fixed 30 s for its peers, which a peer still loading data or compiling on a loaded host
misses (measured: a 2 x 2 run failed so at load 11 on 2 cores). A dead peer still fails every
process, through the service's heartbeats.

Environment (what the pod env of marin_assets/cluster/jax_env.py sets):
  JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JOB_COMPLETION_INDEX (+ MARIN_PROCESS_OFFSET)
      -> jax.distributed.initialize (absent or JAX_NUM_PROCESSES=1: single process)
  MARIN_DEVICES_PER_PROCESS  CPU only: host devices per process
      (--xla_force_host_platform_device_count, set before the backend starts)
  MARIN_HEARTBEAT_TIMEOUT_S  a peer silent this long fails every process (default 30)
  MARIN_INIT_TIMEOUT_S       how long processes wait for each other at start (default 120)
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import re
from collections.abc import Mapping

import numpy as np

from marin_assets.cluster.jax_env import jax_distributed_args
from marin_assets.compat import cache_writes_from_every_cpu_process, distributed_client, xla_backends_started
from marin_assets.settings import setting

log = logging.getLogger(__name__)

DEFAULT_HEARTBEAT_S = 30
DEFAULT_INIT_TIMEOUT_S = 120
_FORCE_FLAG = "--xla_force_host_platform_device_count"


@dataclasses.dataclass(frozen=True)
class Distributed:
    """Who this process is. ``coordinator`` is None for a single process."""

    process_id: int = 0
    num_processes: int = 1
    coordinator: str | None = None

    def __post_init__(self) -> None:
        if self.num_processes < 1 or not 0 <= self.process_id < self.num_processes:
            raise ValueError(f"Distributed: process_id {self.process_id} outside [0, {self.num_processes})")
        if self.num_processes > 1 and not self.coordinator:
            raise ValueError("Distributed: several processes need a coordinator address")


def _env_value(env: Mapping[str, str], name: str) -> str | None:
    """Our MARIN_* variables through settings (empty reads as unset); JAX's and the Job's as they are."""
    return setting(name, env) if name.startswith("MARIN_") else env.get(name)


def _int_env(env: Mapping[str, str], name: str, default: int | None, least: int = 1) -> int | None:
    raw = _env_value(env, name)
    if raw is None or raw == "":
        return default
    if not re.fullmatch(r"[0-9]+", raw) or int(raw) < least:
        kind = "a positive integer" if least == 1 else f"an integer >= {least}"
        raise ValueError(f"environment variable {name} must be {kind}, got {raw!r}")
    return int(raw)


def positive_env(env: Mapping[str, str], name: str, default: int | None) -> int | None:
    return _int_env(env, name, default, least=1)


def distributed_from_env(env: Mapping[str, str]) -> Distributed:
    """The process's place in the job, from the manifests' environment (pure: no JAX)."""
    if positive_env(env, "JAX_NUM_PROCESSES", 1) == 1 and "JAX_COORDINATOR_ADDRESS" not in env:
        return Distributed()
    for name in ("JOB_COMPLETION_INDEX", "MARIN_PROCESS_OFFSET", "JAX_NUM_PROCESSES"):
        raw = _env_value(env, name)
        if raw is not None and not re.fullmatch(r"[0-9]+", raw):  # before jax_distributed_args's int()
            raise ValueError(f"environment variable {name} must be a non-negative integer, got {raw!r}")
    args = jax_distributed_args(env)
    return Distributed(args["process_id"], args["num_processes"], args["coordinator_address"])


def local_env(
    process_id: int, num_processes: int, port: int, devices_per_process: int | None = None, host: str = "127.0.0.1"
) -> dict[str, str]:
    """The variables a manifest would set, for process ``process_id`` of a job on this host
    (the ``processes`` backend, tests, benchmarks)."""
    env = {
        "JAX_COORDINATOR_ADDRESS": f"{host}:{port}",
        "JAX_NUM_PROCESSES": str(num_processes),
        "JOB_COMPLETION_INDEX": str(process_id),
        "MARIN_PROCESS_OFFSET": "0",
    }
    if devices_per_process is not None:
        env["MARIN_DEVICES_PER_PROCESS"] = str(devices_per_process)
    distributed_from_env(env)  # validates
    return env


def force_host_devices(count: int) -> None:
    """Ask XLA:CPU for ``count`` devices; must run before the first JAX backend starts."""
    # XLA reads its flags from this process's environment when the backend starts: no other way in.
    flags = re.sub(rf"{_FORCE_FLAG}=\S+", "", os.environ.get("XLA_FLAGS", "")).strip()
    os.environ["XLA_FLAGS"] = f"{flags} {_FORCE_FLAG}={count}".strip()
    if xla_backends_started():
        import jax

        if jax.local_device_count() != count and jax.default_backend() == "cpu":
            raise RuntimeError(
                f"MARIN_DEVICES_PER_PROCESS={count} came after JAX started its backend "
                f"with {jax.local_device_count()} devices; set it before importing/using jax"
            )


def init_distributed(env: Mapping[str, str] | None = None) -> Distributed:
    """Join the job described by ``env`` (default os.environ); call before any JAX computation.

    CPU: gloo collectives, MARIN_DEVICES_PER_PROCESS host devices, and compile-cache entries
    written by every process, not process 0 alone (``compat.cache_writes_from_every_cpu_process``:
    a CPU process finds only its own). A peer that dies makes the others fail after
    MARIN_HEARTBEAT_TIMEOUT_S instead of hanging in a collective (the coordination service
    stops every process).
    """
    import jax

    env = os.environ if env is None else env
    setup = distributed_from_env(env)
    per_process = positive_env(env, "MARIN_DEVICES_PER_PROCESS", None)
    if per_process is not None:
        force_host_devices(per_process)
    if setup.num_processes == 1:
        return setup
    platforms = env.get("JAX_PLATFORMS", os.environ.get("JAX_PLATFORMS", ""))
    if platforms in ("", "cpu") or per_process is not None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        cache_writes_from_every_cpu_process()
    jax.distributed.initialize(
        coordinator_address=setup.coordinator,
        num_processes=setup.num_processes,
        process_id=setup.process_id,
        # positive_env never returns None when given a default: the `or` only tells the type checker so
        initialization_timeout=positive_env(env, "MARIN_INIT_TIMEOUT_S", DEFAULT_INIT_TIMEOUT_S) or DEFAULT_INIT_TIMEOUT_S,
        heartbeat_timeout_seconds=positive_env(env, "MARIN_HEARTBEAT_TIMEOUT_S", DEFAULT_HEARTBEAT_S) or DEFAULT_HEARTBEAT_S,
    )
    log.info(
        "process %d of %d joined %s (%d global devices)",
        setup.process_id,
        setup.num_processes,
        setup.coordinator,
        jax.device_count(),
    )
    return setup


def is_writer() -> bool:
    """Only process 0 writes checkpoints, metrics and results."""
    import jax

    return jax.process_index() == 0


def agree(value):
    """Process 0's value of a small host value (bool/int/float) on every process."""
    import jax

    if jax.process_count() == 1:
        return value
    return json.loads(_exchange(json.dumps(np.asarray(value).item()))[0])


def all_processes(flag: bool) -> bool:
    """True only if ``flag`` is true on every process (e.g. each process's rows of a batch
    were clean, so the step's batch_ok is the same everywhere)."""
    import jax

    if jax.process_count() == 1:
        return bool(flag)
    return all(v == "1" for v in _exchange("1" if flag else "0"))


_HOST_SYNCS = itertools.count()


def _exchange(value: str) -> list[str]:
    """Every process's ``value`` for this call (the n-th host exchange: every process makes the
    same calls in the same order), through the coordination service's key-value store. Not a
    device collective: the first collective over a device group builds a gloo context that
    waits only a fixed 30 s for its peers, which a peer still loading data or compiling on a
    loaded host misses (measured: a 2 x 2 run failed so at load 11 on 2 cores)."""
    import jax

    client, me, n = distributed_client(), jax.process_index(), next(_HOST_SYNCS)
    client.key_value_set(f"marin/sync/{n}/{me}", value)
    if n >= 2:  # every process has read it: each set its key of n - 1 only after reading those of n - 2
        client.key_value_delete(f"marin/sync/{n - 2}/{me}")
    timeout_ms = int(BARRIER_TIMEOUT_S * 1000)
    return [client.blocking_key_value_get(f"marin/sync/{n}/{p}", timeout_ms) for p in range(jax.process_count())]


BARRIER_TIMEOUT_S = 600.0


def barrier(name: str, timeout_s: float = BARRIER_TIMEOUT_S) -> None:
    """Every process reaches ``name`` before any goes on (e.g. after a checkpoint is written).

    A host-side barrier of the coordination service, not a device collective: a collective's
    first use builds a gloo context whose key-value wait is fixed at 30 s, which a peer that
    is still compiling on a loaded host can miss. A dead peer still fails it (heartbeats).
    """
    import jax

    if jax.process_count() > 1:
        distributed_client().wait_at_barrier(name, int(timeout_s * 1000))
