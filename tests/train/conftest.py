import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from filelock import FileLock

from marin_assets.train.compile_cache import CACHE_ENV
from tests.support.caches import stdlib_module_docs, stdlib_paragraphs, write_cache
from tests.support.configs import TINY_TRAIN


@pytest.fixture(scope="session")
def caches(tmp_path_factory):
    """Two real Levanter caches of byte ids (tests/support/caches.py): "license" (Python's LICENSE)
    and "docs" (stdlib docstrings)."""
    root = tmp_path_factory.mktemp("caches")
    write_cache(root / "license", stdlib_paragraphs())
    write_cache(root / "docs", stdlib_module_docs())
    return {"license": root / "license", "docs": root / "docs"}


@pytest.fixture(scope="session")
def jax_cache():
    """The suite's persistent XLA compile cache (tests/conftest.py): every test that builds the same
    train step, and the `marin train` subprocesses given it, compile it once."""
    return Path(os.environ[CACHE_ENV])


@pytest.fixture
def tiny_config(jax_cache):
    from marin_assets.train.config import config_from_dict

    return config_from_dict(TINY_TRAIN)


# The mesh equivalence runs (tests/train/train_check.py): the one-process meshes share one
# 4-device process; 2x2 is 2 processes x 2 devices. Runs: both transports, and FSDP on ragged.
# "env" is the mesh a pod of a fleet pool with ep_domain_chips=4 builds from its environment on
# 2 processes x 2 devices: an expert axis of 4 across both processes (both transports).
MESH_GROUPS = (
    (1, 4, "1x1,1x4", "ragged,pooled,fsdp_ragged", {}),
    (2, 2, "2x2", "ragged,pooled,fsdp_ragged", {}),
    (2, 2, "env", "ragged,pooled", {"MARIN_EP_DOMAIN_CHIPS": "4"}),
)


def _train_every_layout(caches: dict, root: Path) -> None:
    from tests.train.test_mesh import PROC_TIMEOUT_S, finish, launch_argv
    from tests.train.train_check import STEPS

    root.mkdir(parents=True)
    caches_json = root / "caches.json"
    caches_json.write_text(json.dumps({k: str(v) for k, v in caches.items()}))
    # The groups run at once: a 2-process step waits mostly on its collectives (~0.6 s a step on 2 CPU
    # cores), so the three overlap well; each writes only its own layouts' folders.
    launched = []
    for n_processes, devices, layouts, runs, env in MESH_GROUPS:
        argv = [
            sys.executable,
            "-m",
            "tests.train.train_check",
            "--caches",
            str(caches_json),
            "--out",
            str(root),
            "--steps",
            str(STEPS),
            "--layouts",
            layouts,
            "--runs",
            runs,
        ]
        launched.append(launch_argv(n_processes, devices, argv, **env))
    for procs in launched:
        finish(procs, PROC_TIMEOUT_S)
    (root / "done").write_text("")


@pytest.fixture(scope="session")
def mesh_runs(caches, tmp_path_factory) -> Path:
    """The folder of ``train_check``'s runs on 1x1, 1x4, 2x2 and env (read with ``train_check.load_layout``),
    trained once per ``pytest`` invocation: the equivalence tests of test_mesh.py and test_fsdp.py
    all assert on these. Under xdist the workers share it through their common base temp folder (the
    pytest-xdist docs' pattern): the first to ask trains, under a file lock the others wait on."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        root = tmp_path_factory.mktemp("mesh_runs") / "runs"
        _train_every_layout(caches, root)
        return root
    root = tmp_path_factory.getbasetemp().parent / "mesh_runs"
    with FileLock(f"{root}.lock"):
        if not (root / "done").exists():
            shutil.rmtree(root, ignore_errors=True)  # an earlier worker's failed attempt
            _train_every_layout(caches, root)
    return root
