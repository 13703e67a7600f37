"""`marin datakit run --prefix gs://...` that cannot work says why in one line, exit 2, before any work
(issue 35): a bucket that does not exist (was: a traceback naming the emulator's upload URL), and
$GOOGLE_APPLICATION_CREDENTIALS naming a missing file (was: gcsfs went anonymous and retried)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gcs.gcs_emulator import emulator_env

pytestmark = pytest.mark.slow
PROG = "marin datakit run"
MARIN = shutil.which("marin", path=str(Path(sys.executable).parent)) or "marin"


def datakit_run(tmp_path, prefix: str, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "in").mkdir(exist_ok=True)
    (tmp_path / "in" / "a.jsonl").write_text('{"id": "1", "text": "hello world"}\n')
    argv = [MARIN, "datakit", "run", "--input", str(tmp_path / "in"), "--prefix", prefix, "--tokenizer", "bytes", "--json"]
    return subprocess.run(argv, env={**os.environ, **emulator_env(), **env}, capture_output=True, text=True, timeout=300)


def test_a_missing_bucket_is_named_in_one_line(gcs_server, tmp_path):
    done = datakit_run(tmp_path, "gs://no-such-bucket/run")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"{PROG}: gs://no-such-bucket: no such bucket (create it, or fix the bucket name in gs://no-such-bucket/run)\n"
    )


def test_a_credentials_file_that_is_not_there_is_refused_up_front(gcs_prefix, tmp_path):
    missing = tmp_path / "key.json"
    done = datakit_run(tmp_path, gcs_prefix, GOOGLE_APPLICATION_CREDENTIALS=str(missing))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"{PROG}: GOOGLE_APPLICATION_CREDENTIALS={missing}: no such file (point it at a "
        "service-account key file, or unset it to use the default credentials)\n"
    )


def test_the_driver_refuses_a_missing_bucket_too(gcs_server, capsys):
    """`python -m assets.datakit.run` (what the CLI starts) checks for itself."""
    from assets.datakit.run import run
    from marin_assets.datakit.run_spec import RunSpec

    assert run(RunSpec(("/nonexistent-input",), (), "gs://no-such-bucket/run")) == 2
    assert (
        capsys.readouterr().err
        == f"{PROG}: gs://no-such-bucket: no such bucket (create it, or fix the bucket name in gs://no-such-bucket/run)\n"
    )


def test_a_bucket_that_cannot_be_read_is_named_with_the_reason(gcs_server, monkeypatch):
    """A 403 (gcsfs raises HttpError, which is no OSError) is one line naming the bucket too."""
    import gcsfs.retry

    from marin_assets.store.fsutil import StoreUnusable, check_bucket, filesystem

    fs, _ = filesystem("gs://marin-test/x")

    def forbidden(path, **kwargs):
        raise gcsfs.retry.HttpError({"code": 403, "message": "caller does not have storage.objects.list access"})

    monkeypatch.setattr(fs, "info", forbidden)
    with pytest.raises(
        StoreUnusable,
        match=r"^gs://marin-test: cannot read the bucket \(HttpError: caller does not "
        r"have storage.objects.list access, 403\)$",
    ):
        check_bucket("gs://marin-test/x")


def test_train_names_a_missing_out_bucket_before_any_work(gcs_server, tmp_path):
    """The sibling of the datakit prefix: `marin train --out gs://no-such-bucket/...` named the upload
    URL of its first metrics write, after loading the caches and compiling."""
    config = Path(__file__).resolve().parents[2] / "examples" / "tiny_moe.yaml"
    done = subprocess.run(
        [
            MARIN,
            "train",
            "--cache",
            str(tmp_path / "no-cache"),
            "--config",
            str(config),
            "--out",
            "gs://no-such-bucket/run",
            "--steps",
            "2",
        ],
        env={**os.environ, **emulator_env()},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "marin train: gs://no-such-bucket: no such bucket (create it, or fix the bucket name in gs://no-such-bucket/run)\n"
    )


@pytest.mark.parametrize("command", ["compact", "query"])
def test_telemetry_names_a_missing_root_bucket(gcs_server, command):
    done = subprocess.run(
        [MARIN, "telemetry", command, "--root", "gs://no-such-bucket/telemetry"],
        env={**os.environ, **emulator_env()},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"marin telemetry {command}: gs://no-such-bucket: no such bucket (create it, or fix the "
        "bucket name in gs://no-such-bucket/telemetry)\n"
    )
