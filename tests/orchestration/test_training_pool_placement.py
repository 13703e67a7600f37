"""The Kubernetes training backend trains on the pool the launcher's capacity admission placed
the run on (the run's marin/placement tag), not merely the first pool that fits."""

from __future__ import annotations

import pytest

from marin_assets.cluster.fleet import fleet_from_dict
from marin_assets.cluster.routing import Placement
from marin_assets.orchestration.admission import placement_tag
from marin_assets.orchestration.training_backends.kubernetes import choose_pool

REQUEST = {"marin/accelerator": "gb200-nvl72", "marin/chips": "8"}


def _fleet():
    pool = lambda name, region: {
        "name": name,
        "accelerator": "gb200-nvl72",
        "region": region,
        "domains": 2,  # noqa: E731
        "domain_chips": 72,
        "chips_per_host": 4,
        "ep_domain_chips": 64,
    }
    return fleet_from_dict({"pools": [pool("east", "us-east1"), pool("west", "us-west1")]})


def test_without_a_placement_the_first_pool_that_fits():
    assert choose_pool(_fleet(), REQUEST)[0].name == "east"


def test_the_placed_pool_wins():
    placed = placement_tag(Placement("r1", "west", (1,), (8,), 1.0))
    assert choose_pool(_fleet(), {**REQUEST, "marin/placement": placed})[0].name == "west"


def test_a_placement_that_contradicts_marin_pool_or_is_damaged_is_refused():
    placed = placement_tag(Placement("r1", "west", (1,), (8,), 1.0))
    with pytest.raises(ValueError, match="placed the run on 'west'"):
        choose_pool(_fleet(), {**REQUEST, "marin/placement": placed, "marin/pool": "east"})
    with pytest.raises(ValueError, match="is not JSON"):
        choose_pool(_fleet(), {**REQUEST, "marin/placement": "{"})
