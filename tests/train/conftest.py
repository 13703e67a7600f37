import pytest

from cachebuild import stdlib_module_docs, stdlib_paragraphs, write_cache


@pytest.fixture(scope="session")
def caches(tmp_path_factory):
    """Two real Levanter caches: "license" (Python's LICENSE) and "docs" (stdlib docstrings)."""
    root = tmp_path_factory.mktemp("caches")
    return {"license": write_cache(root / "license", stdlib_paragraphs()),
            "docs": write_cache(root / "docs", stdlib_module_docs())}
