"""dagster.cluster.yaml: the production instance example validates offline and matches the fleet."""

import shutil
from pathlib import Path

import pytest
import yaml
from dagster._config import process_config
from dagster._core.errors import DagsterInvalidConfigError
from dagster._core.instance.config import dagster_instance_config
from dagster._serdes.config_class import class_from_code_pointer

from marin_assets.cluster.fleet import fleet_from_dict, load_fleet
from marin_assets.orchestration.launcher import RoutingRunLauncher, pool_run_slots, run_concurrency_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "dagster.cluster.yaml"
FLEET = ROOT / "examples" / "fleet.yaml"


@pytest.fixture
def env(monkeypatch):
    for name, value in {
        "DAGSTER_PG_HOST": "pg.invalid",
        "DAGSTER_PG_PORT": "5432",
        "DAGSTER_PG_USER": "dagster",
        "DAGSTER_PG_PASSWORD": "not-a-secret",
        "DAGSTER_PG_DB": "dagster",
        "MARIN_LOG_BUCKET": "marin-logs",
        "MARIN_FLEET_FILE": str(FLEET),
    }.items():
        monkeypatch.setenv(name, value)


def _load(tmp_path, text=None):
    if text is None:
        shutil.copy(EXAMPLE, tmp_path / "dagster.yaml")
    else:
        (tmp_path / "dagster.yaml").write_text(text)
    config, _ = dagster_instance_config(str(tmp_path))
    return config


def _class_config(section: dict):
    """Validate a configurable class's own config against its schema, as the instance would."""
    cls = class_from_code_pointer(section["module"], section["class"])
    result = process_config(cls.config_type(), section.get("config") or {})
    assert result.success, [e.message for e in result.errors]
    return cls, result.value


def test_cluster_instance_example_validates_offline(env, tmp_path):
    config = _load(tmp_path)
    assert set(config["storage"]) == {"postgres"}
    assert config["run_retries"]["enabled"] is True and config["run_retries"]["max_retries"] == 3
    cls, logs = _class_config(config["compute_logs"])
    assert cls.__name__ == "GCSComputeLogManager" and logs["bucket"] == "marin-logs"
    _class_config(config["run_coordinator"])
    cls, launcher_config = _class_config(config["run_launcher"])
    launcher = cls.from_config_value(None, launcher_config)  # builds no API client: nothing is contacted
    assert isinstance(launcher, RoutingRunLauncher)
    assert sorted(launcher.clusters) == ["gke-tpu", "gke-us-central1"]
    assert launcher.fleet == load_fleet(FLEET)
    for cluster in launcher.clusters.values():  # run worker pods: CPU and memory, never a chip
        resources = cluster.run_worker_k8s_config()["container_config"]["resources"]
        assert set(resources["requests"]) == set(resources["limits"]) == {"cpu", "memory"}


def test_pool_limits_match_the_fleet(env, tmp_path):
    config = _load(tmp_path)
    limits = config["concurrency"]["runs"]["tag_concurrency_limits"]
    assert limits == run_concurrency_config(load_fleet(FLEET))["runs"]["tag_concurrency_limits"]
    by_pool = {entry["value"]: entry["limit"] for entry in limits}
    # One run per TPU slice; one per host on shared pools (11 GB200 racks x 18 trays, 4 CPU nodes).
    assert by_pool == {"gb200": 198, "v5e-256": 1, "v5p-512": 1, "v4-2048": 1, "cpu": 4}


def test_pool_run_slots_rules():
    fleet = fleet_from_dict(
        {
            "pools": [
                {"name": "v5p", "accelerator": "tpu-v5p", "region": "us-east5", "domains": 3, "topology": "2x2x4"},
                {"name": "h100", "accelerator": "h100x8", "region": "us-east5", "domains": 5},
                {"name": "gb", "accelerator": "gb200-nvl72", "region": "us-east5", "domains": 2, "whole_domain": True},
            ]
        }
    )
    assert [pool_run_slots(p) for p in fleet.pools] == [3, 5, 2]


def test_mistakes_in_the_instance_file_are_refused(env, tmp_path):
    text = EXAMPLE.read_text()
    bad_launcher = yaml.safe_load(text)
    bad_launcher["run_launcher"]["config"]["clusters"][0]["run_worker_cpus"] = "2"
    result = process_config(RoutingRunLauncher.config_type(), bad_launcher["run_launcher"]["config"])
    assert not result.success and "run_worker_cpus" in str([e.message for e in result.errors])
    both = yaml.safe_load(text)
    both["run_queue"] = {"tag_concurrency_limits": []}
    del both["run_coordinator"]
    with pytest.raises(DagsterInvalidConfigError, match="incompatible with the `concurrency > runs`"):
        _load(tmp_path, yaml.safe_dump(both))
    with pytest.raises(ValueError, match="run_worker_cpu '2 cores'"):
        RoutingRunLauncher.from_config_value(
            None, {"clusters": [{**bad_launcher["run_launcher"]["config"]["clusters"][1], "run_worker_cpu": "2 cores"}]}
        )
