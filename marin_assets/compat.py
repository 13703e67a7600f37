"""Every private name of JAX the project uses, in one place.

Private modules (``jax._src...``) can move in any release; the pin (jax 0.7.2,
requirements.lock) holds them still, and tests/test_compat.py pins the behaviour each use
relies on. Nothing else imports a private module (tests/test_layering.py); Dagster's private
names are in marin_assets/orchestration/compat.py. Importing this module imports no JAX.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["distributed_client", "xla_backends_started"]


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
