import os
from pathlib import Path

import pytest

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
