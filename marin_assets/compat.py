"""Every private name of JAX the project uses, in one place.

Private modules (``jax._src...``) can move in any release; the pin (jax 0.7.2,
requirements.lock) holds them still, and tests/test_compat.py pins the behaviour each use
relies on. Nothing else imports a private module (tests/test_layering.py); Dagster's private
names are in marin_assets/orchestration/compat.py. Importing this module imports no JAX.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

__all__ = ["cache_writes_from_every_cpu_process", "distributed_client", "xla_backends_started"]


def xla_backends_started() -> bool:
    """Whether this process has started an XLA backend (its threads make forking unsafe, and
    host-device flags are fixed from then on). Reads ``jax._src.xla_bridge._backends`` without
    importing JAX: a process that never imported it has started nothing."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    return bool(getattr(bridge, "_backends", None))


def distributed_client() -> Any:
    """The coordination-service client of ``jax.distributed`` (``jax._src.distributed.global_state``),
    for host-side barriers; None before ``jax.distributed.initialize``."""
    from jax._src import distributed

    return distributed.global_state.client


def cache_writes_from_every_cpu_process() -> None:
    """Let every process of a multi-process CPU job write its own persistent compile-cache entries.

    JAX writes them from process 0 only (``jax._src.compiler._cache_write``): on TPU and GPU every
    process computes the same key, and one writer keeps a shared (GCS) cache free of racing writes.
    On CPU the key holds the process's own devices (its "accelerator_config" part differs per
    process), so no other process ever found an entry: each compiled every step of every run anew
    (measured on tests/train's 2 x 2 runs, cache warm: 133 CPU-s on process 1, 29 on process 0). Such a key
    is written only by processes of that index, as process 0's are today. Idempotent."""
    from jax._src import compilation_cache, compiler, config, distributed

    real = compiler._cache_write
    if getattr(real, "every_cpu_process", False):
        return

    def write(cache_key, compile_time_secs, module_name, backend, executable, host_callbacks):
        if distributed.global_state.process_id == 0 or backend.platform != "cpu" or host_callbacks:
            return real(cache_key, compile_time_secs, module_name, backend, executable, host_callbacks)
        if compile_time_secs < config.persistent_cache_min_compile_time_secs.value:
            return None
        try:
            compilation_cache.put_executable_and_time(cache_key, module_name, executable, backend, int(compile_time_secs))
        except Exception as ex:  # as JAX's own write: a cache that cannot be written is not an error
            if config.raise_persistent_cache_errors.value:
                raise
            warnings.warn(
                f"Error writing persistent compilation cache entry for {module_name!r}: {type(ex).__name__}: {ex}", stacklevel=2
            )
        return None

    write.every_cpu_process = True  # pyright: ignore[reportFunctionMemberAccess]
    compiler._cache_write = write
