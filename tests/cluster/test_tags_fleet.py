"""Tag classification (strict allow-lists) and the fleet model/loader."""

from __future__ import annotations

import json

import pytest

from marin_assets.cluster.fleet import Pool, fleet_from_dict, load_fleet
from marin_assets.cluster.tags import JobRequest, classify_tags, request_tags


def test_classify_defaults_and_values():
    assert classify_tags({}) == JobRequest("cpu", 1, None, "batch")
    r = classify_tags(
        {
            "marin/accelerator": "gb200-nvl72",
            "marin/chips": "144",
            "marin/region": "us-central1",
            "marin/priority": "production",
            "dagster/partition": "anything goes here",
        }
    )
    assert r == JobRequest("gb200-nvl72", 144, "us-central1", "production")
    assert r.band > JobRequest(priority="interactive").band > JobRequest(priority="batch").band
    assert classify_tags(request_tags(r)) == r


@pytest.mark.parametrize(
    "tag, value",
    [
        ("marin/accelerator", "tpu-v9"),
        ("marin/accelerator", "cpu; rm -rf /"),
        ("marin/chips", "0"),
        ("marin/chips", "-8"),
        ("marin/chips", "8 && reboot"),
        ("marin/chips", "1e3"),
        ("marin/chips", "99999999"),
        ("marin/region", "us-central1$(id)"),
        ("marin/region", "US-CENTRAL1"),
        ("marin/region", "us central1"),
        ("marin/priority", "urgent"),
        ("marin/priority", "batch\n"),
        ("marin/cluster", "gke|sh"),
    ],
)
def test_bad_tag_values_are_refused_naming_the_tag(tag, value):
    with pytest.raises(ValueError) as err:
        classify_tags({tag: value})
    assert tag in str(err.value)


def test_pool_defaults_and_validation():
    rack = Pool("gb200", "gb200-nvl72", "us-central1", 11, ep_domain_chips=64)
    assert (rack.domain_chips, rack.chips_per_host, rack.hosts_per_domain, rack.capacity) == (72, 4, 18, 792)
    assert rack.fits_one_domain(72) and not rack.fits_one_domain(73) and rack.domains_needed(144) == 2
    v5e = Pool("v5e-256", "tpu-v5e", "us-west4", 1, topology="16x16")
    assert (v5e.domain_chips, v5e.hosts_per_domain, v5e.whole_domain) == (256, 64, True)
    assert not v5e.fits_one_domain(4)
    assert Pool("v4", "tpu-v4", "us-central2", 1, topology="8x8x16").domain_chips == 1024
    with pytest.raises(ValueError, match="need a topology"):
        Pool("t", "tpu-v5p", "us-east5", 1)
    with pytest.raises(ValueError, match="disagrees with topology"):
        Pool("t", "tpu-v5p", "us-east5", 1, topology="4x8x8", domain_chips=512)
    with pytest.raises(ValueError, match="ep_domain_chips"):
        Pool("g", "gb200-nvl72", "us-central1", 1, ep_domain_chips=80)
    with pytest.raises(ValueError, match="ep_domain_chips 6 is neither whole hosts nor part of one .chips_per_host 4"):
        Pool("g", "gb200-nvl72", "us-central1", 1, ep_domain_chips=6)
    assert Pool("g", "gb200-nvl72", "us-central1", 1, ep_domain_chips=2).ep_domain_chips == 2  # half a host
    with pytest.raises(ValueError, match="unknown accelerator"):
        Pool("g", "gb300", "us-central1", 1)
    with pytest.raises(ValueError, match="must divide"):
        Pool("g", "h100x8", "us-east5", 1, domain_chips=8, chips_per_host=3)


def test_fleet_loading_names_the_bad_record(tmp_path):
    ok = {"pools": [{"name": "a", "accelerator": "h100x8", "region": "us-east5", "domains": 2}]}
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(ok))
    assert load_fleet(path).pool("a").capacity == 16
    with pytest.raises(ValueError, match=r"pools\[1\]: .*unknown accelerator"):
        fleet_from_dict({"pools": [ok["pools"][0], {"name": "b", "accelerator": "x", "region": "us-east5", "domains": 1}]})
    with pytest.raises(ValueError, match="appears twice"):
        fleet_from_dict({"pools": ok["pools"] * 2})
    with pytest.raises(ValueError, match="unknown fields"):
        fleet_from_dict({"pools": [{**ok["pools"][0], "gpus": 3}]})


def test_example_fleet_is_the_scenario():
    from pathlib import Path

    fleet = load_fleet(Path(__file__).parents[2] / "examples" / "fleet.yaml")
    gb = [p for p in fleet.pools if p.accelerator == "gb200-nvl72"]
    assert sum(p.domains for p in gb) == 11
    tpus = [p for p in fleet.pools if p.accelerator.startswith("tpu")]
    assert len(tpus) >= 3


@pytest.mark.parametrize(
    "tag, value",
    [
        ("marin/chips", "8\n"),
        ("marin/region", "us-central1\n"),
        ("marin/cluster", "gke\n"),
    ],
)
def test_tag_values_with_a_trailing_newline_are_refused(tag, value):
    """`re.match` with `$` lets "8\\n" through; every check is a full match."""
    with pytest.raises(ValueError, match=tag):
        classify_tags({tag: value})


@pytest.mark.parametrize(
    "field, value, needle",
    [
        ("name", "gb200\n", "pool name"),
        ("region", "us-central1\n", "region"),
        ("topology", "16x16\n", "topology"),
    ],
)
def test_fleet_names_with_a_trailing_newline_are_refused(field, value, needle):
    pool = {"name": "v5e", "accelerator": "tpu-v5e", "region": "us-central1", "domains": 2, "topology": "16x16"}
    with pytest.raises(ValueError, match=needle):
        fleet_from_dict({"pools": [{**pool, field: value}]}, source="fleet.yaml")


# ---- marin/cpu, marin/memory, marin/pool: pod size and pool from asset tags ----------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from marin_assets.cluster.tags import (  # noqa: E402
    PodResources,
    asset_run_tags,
    check_resource_tags,
    cpu_millicores,
    memory_bytes,
    pod_resources,
)

DEFAULT_POD = PodResources("1", "4Gi")


def test_pod_resources_from_tags_else_the_defaults():
    assert pod_resources({}, DEFAULT_POD) == DEFAULT_POD
    assert pod_resources({"marin/cpu": "500m"}, DEFAULT_POD) == PodResources("500m", "4Gi")
    assert pod_resources({"marin/memory": "512Mi"}, DEFAULT_POD) == PodResources("1", "512Mi")
    both = pod_resources({"marin/cpu": "16", "marin/memory": "64Gi", "marin/chips": "8"}, DEFAULT_POD)
    assert both.as_k8s() == {"cpu": "16", "memory": "64Gi"}  # CPU and memory only, never a chip
    assert (cpu_millicores("2"), cpu_millicores("250m")) == (2000, 250)
    assert (memory_bytes("2Gi"), memory_bytes("512Mi")) == (2 * 2**30, 512 * 2**20)


@pytest.mark.parametrize(
    "tag, value",
    [
        ("marin/cpu", "0"),
        ("marin/cpu", "1.5"),
        ("marin/cpu", "1e3"),
        ("marin/cpu", "2\n"),
        ("marin/cpu", "10000"),
        ("marin/cpu", "2 cores"),
        ("marin/cpu", "-1"),
        ("marin/cpu", "0m"),
        ("marin/cpu", "1m; id"),
        ("marin/memory", "2GB"),
        ("marin/memory", "2G"),
        ("marin/memory", "2Gi\n"),
        ("marin/memory", "0Gi"),
        ("marin/memory", "2gi"),
        ("marin/memory", "2048"),
        ("marin/memory", "1Ti"),
        ("marin/memory", ""),
    ],
)
def test_bad_cpu_and_memory_tags_are_refused_naming_the_tag(tag, value):
    with pytest.raises(ValueError, match=tag):
        pod_resources({tag: value}, DEFAULT_POD)
    with pytest.raises(ValueError, match=tag):
        check_resource_tags({tag: value})


@settings(max_examples=300, deadline=None)
@given(
    cpu=st.one_of(st.text(max_size=12), st.from_regex(r"[0-9]{1,8}m?", fullmatch=True)),
    memory=st.one_of(st.text(max_size=12), st.from_regex(r"[0-9]{1,8}(Mi|Gi|M|G)", fullmatch=True)),
)
def test_resource_tags_either_parse_exactly_or_are_refused(cpu, memory):
    """Whatever the value: a valid k8s quantity that round-trips, or a ValueError naming the tag."""
    try:
        resources = pod_resources({"marin/cpu": cpu, "marin/memory": memory}, DEFAULT_POD)
    except ValueError as err:
        assert "marin/cpu" in str(err) or "marin/memory" in str(err)
        return
    assert resources.as_k8s() == {"cpu": cpu, "memory": memory}
    millis = cpu_millicores(cpu)
    assert 1 <= millis <= 9_999_999 and (cpu.endswith("m") or millis % 1000 == 0)
    assert memory_bytes(memory) >= 2**20 and memory.isascii() and memory[:-2].isdigit()


def test_asset_run_tags_take_the_largest_ask_and_one_pool():
    chain = {
        "shards/normalized": {"marin/pool": "datakit", "marin/cpu": "1", "marin/memory": "2Gi"},
        "shards/filtered": {"marin/pool": "datakit", "marin/cpu": "1500m", "marin/memory": "1536Mi"},
        "shards/tokenized": {"marin/pool": "datakit", "marin/cpu": "500m", "marin/memory": "1Gi", "x": "y"},
    }
    assert asset_run_tags(chain) == {"marin/pool": "datakit", "marin/cpu": "1500m", "marin/memory": "2Gi"}
    assert asset_run_tags({"a": {"marin/memory": "3072Mi"}, "b": {"marin/memory": "2Gi"}}) == {"marin/memory": "3072Mi"}
    assert asset_run_tags({"a": {}, "b": {"owner": "me"}}) == {}
    assert asset_run_tags({}) == {}
    with pytest.raises(ValueError, match=r"different pools \(a=datakit, b=other\)"):
        asset_run_tags({"a": {"marin/pool": "datakit"}, "b": {"marin/pool": "other"}})
    with pytest.raises(ValueError, match="asset shards/tokenized: tag marin/memory"):
        asset_run_tags({**chain, "shards/tokenized": {"marin/memory": "2GB"}})
    with pytest.raises(ValueError, match="asset b: tag marin/pool"):
        asset_run_tags({"b": {"marin/pool": "Data Kit"}})
