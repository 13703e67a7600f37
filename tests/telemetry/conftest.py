import uuid

import pytest

from marin_assets.telemetry import TelemetryStore


@pytest.fixture(params=["local", "memory"])
def root(request, tmp_path):
    """A fresh store root on disk and on fsspec's memory:// filesystem."""
    url = str(tmp_path / "telemetry") if request.param == "local" else f"memory://telemetry-{uuid.uuid4().hex}"
    yield url
    store = TelemetryStore(url)
    if not store.local and store.fs.exists(store.root):
        store.fs.rm(store.root, recursive=True)
