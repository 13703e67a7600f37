"""What ``marin train`` (cli/train.py) and its checkpoint tools (cli/train_tools.py) share: in a module of
their own so that neither imports the other's helpers (train.py registers the tools at its top)."""

from __future__ import annotations

import logging
import math
import sys


def named_caches(specs: list[str]) -> dict[str, str]:
    """{source name: path} of the ``--cache [NAME=]DIR`` flags (a lone unnamed one is "train", else a path's last part)."""
    out = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            path = spec
            name = "train" if len(specs) == 1 else path.rstrip("/").split("/")[-1]
        if name in out:
            raise ValueError(f"--cache: source name {name!r} given twice")
        out[name] = path
    return out


class _StderrLines(logging.Handler):
    """The training library's INFO lines and warnings as ``marin train: ...`` on the current
    sys.stderr (looked up per line, so in-process callers that swap it still see them)."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"marin train: {record.getMessage()}", file=sys.stderr)


def show_library_log() -> None:
    # Without a handler, INFO lines such as "resumed from .../step-000000100 at step 100"
    # were dropped, and warnings came out with no prefix through logging's last resort.
    logger = logging.getLogger("marin_assets.train")
    if not any(isinstance(h, _StderrLines) for h in logger.handlers):
        logger.addHandler(_StderrLines())
    logger.setLevel(logging.INFO)


def json_safe(value):
    """JSON has no NaN/inf: print null for them (``json.dumps`` would print bare NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    return value
