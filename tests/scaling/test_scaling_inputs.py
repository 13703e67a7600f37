"""Bad scaling inputs: partition keys, CSV values, CLI flags, data a fit cannot identify."""

import pytest

from marin_assets.scaling.sweep import parse_partition_key, partition_key


@pytest.mark.parametrize("key", ["C2e11-d48\n", "C2e11-d48\r", "C2e11-d1_0", "C2e11-d 48", " C2e11-d48",
                                 "Cnan-d4", "Cinf-d4", "C2e11-d0", "C2e11-d-4"])
def test_partition_key_must_match_in_full(key):
    with pytest.raises(ValueError, match="sweep partition key"):
        parse_partition_key(key)


@pytest.mark.parametrize("budget, width", [(2e11, 48), (2.5e11, 3), (5e-05, 7), (1e21, 4096)])
def test_partition_keys_round_trip(budget, width):
    key = partition_key(budget, width)
    assert parse_partition_key(key) == (float(f"{budget:.2g}"), width)
