"""dagster.cluster.yaml's compute_logs block (dagster-gcp's GCSComputeLogManager), as written,
against the GCS emulator: a run's step output ends up as objects in the log bucket, and the
instance reads it back from there."""

from __future__ import annotations

import dagster as dg
import yaml

from tests.cluster.test_instance_config import EXAMPLE
from tests.gcs.gcs_emulator import FakeGcsServer

LOG_BUCKET = "marin-logs-test"
MARKER = "compute log marker 7f3a"


@dg.asset
def talkative() -> int:
    print(MARKER, flush=True)
    return 1


def test_step_output_is_uploaded_to_the_log_bucket(gcs_server: FakeGcsServer, tmp_path, monkeypatch):
    gcs_server.create_bucket(LOG_BUCKET)
    monkeypatch.setenv("MARIN_LOG_BUCKET", LOG_BUCKET)
    block = yaml.safe_load(EXAMPLE.read_text())["compute_logs"]
    assert block["module"] == "dagster_gcp.gcs.compute_log_manager"
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump({"compute_logs": block, "telemetry": {"enabled": False}}))
    with dg.instance_for_test(temp_dir=str(home), overrides={"compute_logs": block}) as instance:
        manager = instance.compute_log_manager
        assert type(manager).__name__ == "GCSComputeLogManager"
        result = dg.materialize([talkative], instance=instance)
        assert result.success

        from google.cloud import storage

        blobs = {b.name: b for b in storage.Client().bucket(LOG_BUCKET).list_blobs(prefix="dagster/storage/")}
        stdout = [name for name in blobs if name.endswith(".out")]
        assert stdout, f"no stdout objects in gs://{LOG_BUCKET}: {sorted(blobs)}"
        assert any(MARKER in blobs[name].download_as_text() for name in stdout)
