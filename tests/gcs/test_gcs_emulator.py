"""The emulator fixture itself: anonymous gcsfs and google-cloud-storage, enforced create-only writes, the env
for child processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import fsspec
import pytest

from tests.gcs.gcs_emulator import BUCKET, emulator_env


def test_create_only_writes_are_enforced_so_cas_tests_mean_something(gcs_prefix):
    fs, root = fsspec.core.url_to_fs(gcs_prefix)
    fs.pipe_file(f"{root}/a.json", b"first", mode="create")
    with pytest.raises(FileExistsError):
        fs.pipe_file(f"{root}/a.json", b"second", mode="create")
    assert fs.cat(f"{root}/a.json") == b"first"
    assert fs.credentials.method == "anon"


def test_a_child_process_given_emulator_env_reads_and_writes_the_same_bucket(gcs_prefix):
    fs, root = fsspec.core.url_to_fs(gcs_prefix)
    fs.pipe_file(f"{root}/from_parent", b"parent")
    code = (
        "import sys, fsspec; fs, root = fsspec.core.url_to_fs(sys.argv[1]); "
        "fs.pipe_file(root + '/from_child', b'child'); "
        "print(fs.credentials.method, fs.cat(root + '/from_parent').decode())"
    )
    env = {"PATH": "/usr/bin:/bin", **emulator_env()}  # nothing inherited but PATH: the helper's env is enough
    done = subprocess.run([sys.executable, "-c", code, gcs_prefix], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["anon", "parent"]
    assert fs.cat(f"{root}/from_child") == b"child"


def test_emulator_env_points_every_client_at_the_running_server(gcs_server):
    env = emulator_env()
    assert env["STORAGE_EMULATOR_HOST"] == env["TENSORSTORE_GCS_HTTP_URL"] == gcs_server.url
    assert gcs_server.url.startswith("http://127.0.0.1:")
    assert all(env[key] == "127.0.0.1:9" for key in ("GCE_METADATA_HOST", "GCE_METADATA_IP", "GCE_METADATA_ROOT"))
    from google.cloud import storage

    client = storage.Client()  # project and anonymous credentials from the env alone (what dagster-gcp calls)
    assert client.project == "test"
    assert BUCKET in [bucket.name for bucket in client.list_buckets()]  # other tests may add their own buckets


def test_a_server_that_exits_at_start_is_an_error_naming_its_exit_code(monkeypatch):
    from tests.gcs import gcs_emulator

    monkeypatch.setattr(gcs_emulator, "fake_gcs_binary", lambda: Path("/bin/false"))
    server = gcs_emulator.FakeGcsServer()
    with pytest.raises(RuntimeError, match=r"^fake-gcs-server exited with code 1 before answering"):
        server.start(timeout_s=10)
    assert server.process is None  # stopped and cleaned up
