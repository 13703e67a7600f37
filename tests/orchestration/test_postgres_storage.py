"""The documented PostgreSQL storage option, against a real server started for the test.

The server is Debian's postgresql (installed by .ci/run), run as the `postgres` user in a
temporary directory on a free loopback port; the test skips, saying why, only where the
binaries are absent.
"""

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import dagster as dg
import pytest
import yaml

from marin_assets.orchestration import (
    ArtifactIOManager,
    ArtifactStoreResource,
    StageConfig,
    StageContext,
    versioned,
    versioned_asset,
)

REPO = Path(__file__).resolve().parents[2]


def _pg_bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres():
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not (initdb and pg_ctl and shutil.which("runuser")):
        pytest.skip("PostgreSQL server binaries not installed (apt-get install postgresql; .ci/run does this)")
    # initdb refuses to run as root, and pytest's tmp dirs are private to root: use a
    # directory the postgres user owns.
    root = Path(tempfile.mkdtemp(prefix="marin-pg-"))
    as_postgres = []
    if os.geteuid() == 0:
        as_postgres = ["runuser", "-u", "postgres", "--"]
        shutil.chown(root, user="postgres")
    data = root / "data"
    subprocess.run([*as_postgres, initdb, "-D", str(data), "-A", "trust", "-U", "dagster"], check=True, capture_output=True)
    port = _free_port()
    opts = f"-p {port} -k {data} -c listen_addresses=127.0.0.1"
    subprocess.run(
        [*as_postgres, pg_ctl, "-D", str(data), "-o", opts, "-w", "start", "-l", str(data / "log")],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        ["psql", "-h", "127.0.0.1", "-p", str(port), "-U", "dagster", "-d", "postgres", "-c", "CREATE DATABASE marin"],
        check=True,
        capture_output=True,
    )
    try:
        yield {"hostname": "127.0.0.1", "port": port, "username": "dagster", "password": "unused", "db_name": "marin"}
    finally:
        subprocess.run([*as_postgres, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_documented_postgres_block_runs_versioned_assets(postgres, tmp_path, monkeypatch):
    # The block shipped in dagster.postgres.yaml, resolved from the environment.
    block = yaml.safe_load((REPO / "dagster.postgres.yaml").read_text())["storage"]
    env = {
        "DAGSTER_PG_HOST": postgres["hostname"],
        "DAGSTER_PG_PORT": str(postgres["port"]),
        "DAGSTER_PG_USER": postgres["username"],
        "DAGSTER_PG_PASSWORD": postgres["password"],
        "DAGSTER_PG_DB": postgres["db_name"],
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)

    class Cfg(StageConfig):
        n: int = versioned(4)

    @versioned_asset(key="pg/numbers", code_version="1", config_cls=Cfg)
    def numbers(ctx: StageContext, config: Cfg):
        Path(ctx.out_dir, "n.txt").write_text(",".join(map(str, range(config.n))))
        return {"n": config.n}

    store = ArtifactStoreResource(prefix=str(tmp_path))
    resources = {"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)}
    with dg.instance_for_test(overrides={"storage": block}) as instance:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        for expected_hit in (False, True):
            result = dg.materialize([numbers], resources=resources, instance=instance)
            assert result.success
            assert result.get_asset_materialization_events()[0].materialization.metadata["cache_hit"].value is expected_hit
        event = instance.get_latest_materialization_event(dg.AssetKey(["pg", "numbers"]))
        assert event.asset_materialization.metadata["count/n"].value == 4
    rows = subprocess.run(
        [
            "psql",
            "-h",
            postgres["hostname"],
            "-p",
            str(postgres["port"]),
            "-U",
            "dagster",
            "-d",
            "marin",
            "-tAc",
            "SELECT count(*) FROM runs",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert int(rows) == 2
