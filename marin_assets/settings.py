"""Every ``MARIN_*`` environment variable the project reads or sets, with its default and meaning.

One list, so a newcomer (and tests/test_settings.py, which fails on any ``MARIN_*`` name in
the code that is missing here) finds them all in one place. Code reads them with
``setting(name)``, which refuses a name that is not listed; the modules that own a variable
still parse and check its value (naming the variable in their errors).

``artifact_prefix()`` is the one default of the artifact store root.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    name: str
    default: str  # in words: what holds when the variable is unset or empty
    meaning: str
    kind: str = "user"  # user: set by people; internal: set by our own launchers for child processes


def _settings(*items: Setting) -> dict[str, Setting]:
    return {s.name: s for s in items}


SETTINGS: dict[str, Setting] = _settings(
    # Where things live
    Setting("MARIN_PREFIX", "./artifacts (absolute)", "root of the artifact store: a path or an fsspec URL (gs://bucket/x)"),
    Setting("MARIN_USER_DATA_DIR", "unset: sources/user is empty", "the watched folder whose files become sources/user"),
    Setting("MARIN_DATAKIT_CACHE", "~/.cache/marin/datakit", "where the pinned sources' package downloads are kept"),
    Setting("MARIN_DATAKIT_PREFIX", "required by that module", "the datakit run prefix that run_location shows in the UI"),
    Setting("MARIN_EXPERIMENTS_DIR", "the repository's experiments/", "folder of experiment records (<name>.yaml)"),
    Setting("MARIN_BUDGET_FILE", "$MARIN_PREFIX/budget.yaml", "the compute budget the phase controller reads"),
    # How work runs
    Setting("MARIN_LOCAL_WORKERS", "the core count", "processes that compute one range run's partitions; 1 = in process"),
    Setting("MARIN_SHARDS_PER_RUN", "unset: one run per backfill", "cluster: shard partitions per Dagster run (one pod each)"),
    Setting("MARIN_TRAINING_BACKEND", "local", "where a train/<run> phase runs: local | processes | kubernetes"),
    Setting("MARIN_TRAIN_PROCESSES", "2", "processes backend: worker processes of one training mesh"),
    Setting("MARIN_TRAIN_DEVICES_PER_PROCESS", "JAX's default", "processes backend: CPU devices per worker process"),
    Setting("MARIN_FLEET_FILE", "unset: no fleet check", "kubernetes backend: the fleet YAML a run's tags are checked against"),
    # Read by training processes (set by our launchers)
    Setting("MARIN_PROCESS_OFFSET", "0", "process id = offset + JOB_COMPLETION_INDEX (offset = domain * hosts)", "internal"),
    Setting("MARIN_DEVICES_PER_PROCESS", "JAX's default", "CPU only: host devices per training process", "internal"),
    Setting("MARIN_EXPERT_PARALLEL", "the largest divisor of the expert count that fits", "the expert axis size"),
    Setting(
        "MARIN_EP_DOMAIN_CHIPS",
        "one process's devices",
        "devices of one EP domain: the expert axis's bound (the fleet pool's ep_domain_chips, written into the pod's env)",
        "internal",
    ),
    Setting("MARIN_HEARTBEAT_TIMEOUT_S", "30", "a silent peer fails every training process after this many seconds"),
    Setting("MARIN_INIT_TIMEOUT_S", "120", "how long training processes wait for each other at start"),
    Setting("MARIN_HOSTS_PER_DOMAIN", "set per pod", "hosts of one compute domain (written into the pod's env)", "internal"),
    Setting("MARIN_NUM_DOMAINS", "set per pod", "compute domains of one training job (written into the pod's env)", "internal"),
    # Cluster
    Setting("MARIN_CLUSTER", "set by the run launcher", "the cluster a run was routed to", "internal"),
    Setting("MARIN_K8S_NAMESPACE", "default", "namespace of the training pods (the launcher sets it from its cluster)"),
    Setting("MARIN_K8S_IMAGE", "the run worker's image", "image of the training pods (the launcher sets it)"),
    Setting("MARIN_LOG_BUCKET", "required by dagster.cluster.yaml", "GCS bucket of the cluster instance's compute logs"),
    # Tests
    Setting("MARIN_TEST_IN_FRESH_PROCESS", "unset", "tests: set in the fresh interpreter of a test marked so", "internal"),
    Setting("MARIN_TEST_OUTCOMES", "unset", "tests: where that fresh interpreter writes each test's outcome", "internal"),
)


def setting(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The value of a listed variable, None when unset or empty; KeyError for an unlisted name."""
    if name not in SETTINGS:
        raise KeyError(f"{name} is not listed in marin_assets/settings.py")
    value = (os.environ if env is None else env).get(name)
    return value or None


def artifact_prefix(env: Mapping[str, str] | None = None) -> str:
    """$MARIN_PREFIX, else ./artifacts as an absolute path: the artifact store root."""
    return setting("MARIN_PREFIX", env) or os.path.abspath("artifacts")
