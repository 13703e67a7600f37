"""$MARIN_LOCAL_WORKERS and the process counts read from the environment, without Dagster.

The CLI checks --workers and the variable before any work (marin_assets/cli/datakit.py); kept
out of marin_assets.orchestration, whose package imports dagster (~1.3 s of CPU a command
would pay for a number). orchestration.fanout, which uses the count, re-exports it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from marin_assets.settings import setting

WORKERS_ENV = "MARIN_LOCAL_WORKERS"
_COUNT_RE = re.compile(r"[1-9][0-9]{0,3}")


def env_count(env: Mapping[str, str] | None, name: str, default: int | None) -> int | None:
    """$name as an integer in [1, 1024]; ``default`` when unset or empty; ValueError naming it."""
    text = setting(name, env)  # None when unset or empty
    if text is None:
        return default
    if not _COUNT_RE.fullmatch(text) or int(text) > 1024:
        raise ValueError(f"{name}={text[:40]!r} is not an integer in [1, 1024]")
    return int(text)


def local_workers(env: Mapping[str, str] | None = None) -> int:
    """$MARIN_LOCAL_WORKERS, else the number of cores; ValueError naming the variable."""
    return env_count(env, WORKERS_ENV, os.cpu_count() or 1)  # type: ignore[return-value]
