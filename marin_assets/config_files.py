"""Reading config files (YAML or JSON): one home for turning every way a file can be
unreadable into one ValueError line naming the file (and line:column), never a traceback.
Cluster fleet and job files, training configs and experiment records all load through here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MAX_CONFIG_BYTES = 64 << 20  # a 1000-job stream is ~150 KB


def load_structured(path: str | Path) -> Any:
    """Read a YAML or JSON file (by suffix; YAML is a superset of JSON anyway).

    Every way the file can be unreadable becomes one ValueError line naming the file (and
    the line and column, when the parser knows them), never a traceback.
    """
    import yaml

    path = Path(path)
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ValueError(f"{path}: {size} bytes is more than the limit of {MAX_CONFIG_BYTES}")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text (byte {err.start})") from None
    try:
        if path.suffix == ".json":
            return json.loads(text)
        return yaml.safe_load(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{err.lineno}:{err.colno}: invalid JSON: {err.msg}") from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        at = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = " ".join(str(err.problem or err.context or "syntax error").split())
        raise ValueError(f"{path}{at}: invalid YAML: {problem}") from None
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: invalid YAML: {' '.join(str(err).split())[:200]}") from None
    except RecursionError:
        raise ValueError(f"{path}: nested too deeply to be a config file") from None
