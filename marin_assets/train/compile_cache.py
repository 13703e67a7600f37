"""JAX's persistent compilation cache, on for every process that trains or scores.

A training step, a held-out loss or an eval's scorer compiles in seconds on CPU, and the
demo and the ladder build the same computations again and again (a train() call jits a new
closure, so JAX's in-memory cache never hits across calls; the persistent cache finds a
computation by its HLO). Measured on one IsoFLOP sweep point: 16 of its 25 s were tracing,
lowering and compiling.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"


def default_cache_dir() -> str:
    return str(Path.home() / ".cache" / "marin-assets" / "jax")


def ensure_compile_cache() -> str:
    """Point JAX at the persistent cache ($JAX_COMPILATION_CACHE_DIR, else ~/.cache/marin-assets/jax)
    unless something already did, and cache every compile (the default skips those under 1 s:
    most of ours); returns the directory in use."""
    import jax

    current = jax.config.jax_compilation_cache_dir  # pyright: ignore[reportAttributeAccessIssue] (flags are dynamic attributes)
    if not current:
        current = os.environ.get(CACHE_ENV) or default_cache_dir()
        jax.config.update("jax_compilation_cache_dir", current)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return current
