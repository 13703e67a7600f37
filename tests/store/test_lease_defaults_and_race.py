"""Two lease behaviours the README claims and no other test pinned (found by mutation probes):
the defaults (heartbeat 30 s, stale after 90 s, one declaration for the store and its Dagster
resource) and the re-check after winning the lease (another run may commit in between)."""

from __future__ import annotations

from marin_assets.orchestration import ArtifactStoreResource
from marin_assets.store import ArtifactStore, LeaseConfig, compute_version


def test_lease_defaults_are_30_and_90_seconds_for_the_store_and_the_resource(tmp_path):
    assert (LeaseConfig().heartbeat_s, LeaseConfig().stale_after_s) == (30.0, 90.0)
    resource = ArtifactStoreResource(prefix=str(tmp_path))
    assert resource.store.lease_config == LeaseConfig()


def test_a_version_committed_while_we_won_the_lease_is_a_cache_hit(tmp_path):
    """The first look finds nothing; by the time this run holds the lease, another run has
    committed the version: the body must not run again."""
    store = ArtifactStore(str(tmp_path))
    version = compute_version("a/b", "1", {})

    def write(out_dir: str) -> dict:
        (tmp_path / "marker").write_text(out_dir)
        return {"rows": 1}

    committed = store.materialize("a/b", None, version, write, {})
    real_load, looks = store.load, []

    def load_missing_once(*args, **kwargs):
        looks.append(args)
        return None if len(looks) == 1 else real_load(*args, **kwargs)

    store.load = load_missing_once  # type: ignore[method-assign]

    def must_not_run(out_dir: str) -> dict:
        raise AssertionError("computed a version another run had committed")

    again = store.materialize("a/b", None, version, must_not_run, {})
    assert again.cache_hit and again.ref.version == committed.ref.version and len(looks) == 2
