"""JAX's persistent compilation cache, on for every process that trains or scores.

A training step, a held-out loss or an eval's scorer compiles in seconds on CPU, and the
demo and the ladder build the same computations again and again (a train() call jits a new
closure, so JAX's in-memory cache never hits across calls; the persistent cache finds a
computation by its HLO). Measured on one IsoFLOP sweep point: 16 of its 25 s were tracing,
lowering and compiling.

The persistent cache saves XLA's compile, not JAX's tracing and lowering, which is most of a
small run's fixed cost (measured on the tests' tiny MoE: ~8 of a 10 s, 12-step run).
``reuse_jitted`` keeps a process's jitted step for the next run whose computation is the same,
so a sweep's runs after its first trace nothing.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, TypeVar

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


T = TypeVar("T")
_JITTED: OrderedDict[Hashable, Any] = OrderedDict()
_JITTED_LOCK = threading.Lock()
JITTED_KEPT = 8  # each holds its compiled executables; a sweep cycles through a few shapes


def reuse_jitted(key: Hashable, build: Callable[[], T]) -> T:
    """The jitted function (or what holds it) built for ``key`` earlier in this process, else ``build()`` (kept, least
    recently used dropped past ``JITTED_KEPT``). ``key`` must name everything the function's closure
    reads: two calls with one key must trace to the same computation. Only for one-process runs: a
    multi-process step meets its peers after its first compile (``mesh.jit_step``), once per build."""
    with _JITTED_LOCK:
        if key in _JITTED:
            _JITTED.move_to_end(key)
            return _JITTED[key]
    jitted = build()
    with _JITTED_LOCK:
        _JITTED[key] = jitted
        while len(_JITTED) > JITTED_KEPT:
            _JITTED.popitem(last=False)
    return jitted
