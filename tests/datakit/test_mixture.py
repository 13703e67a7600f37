"""The Mixture type: validation, normalisation, stage lookup, config spellings, round trip."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marin_assets.datakit.mixture import Mixture


def test_normalises_and_switches_at_steps():
    mix = Mixture([(0, {"web": 3, "code": 1}), (100, {"web": 1, "math": 1})])
    assert mix.sources == ("code", "math", "web")
    assert mix.weights_at(0) == {"code": 0.25, "math": 0.0, "web": 0.75}
    assert mix.weights_at(99) == mix.weights_at(0)
    assert mix.weights_at(100) == {"code": 0.0, "math": 0.5, "web": 0.5}
    assert mix.weights_at(10**9) == mix.weights_at(100)
    assert mix.steps == (0, 100)


def test_config_spellings_are_one_mixture():
    plain = Mixture.from_dict({"a": 2, "b": 6})
    assert plain == Mixture.constant({"a": 0.25, "b": 0.75})
    assert plain.to_dict() == {"stages": [[0, {"a": 0.25, "b": 0.75}]]}
    staged = Mixture.from_dict({"stages": [[0, {"a": 1}], [5, {"b": 1}]]})
    assert staged == Mixture.from_dict([[0, {"a": 1}], [5, {"b": 1}]])
    assert Mixture.from_dict(staged) is staged
    assert Mixture.from_dict(json.loads(json.dumps(staged.to_dict()))) == staged


@pytest.mark.parametrize(
    "stages, message",
    [
        ([], "at least one"),
        ([(5, {"a": 1})], "start at step 0"),
        ([(0, {"a": 1}), (10, {"a": 1}), (10, {"a": 2})], "strictly ascending"),
        ([(0, {"a": -1, "b": 2})], "'a' must be finite and >= 0"),
        ([(0, {"a": float("nan")})], "finite"),
        ([(0, {"a": float("inf")})], "finite"),
        ([(0, {"a": True})], "finite"),
        ([(0, {"a": 0.0})], "sum to zero"),
        ([(0, {})], "non-empty mapping"),
        ([(0.5, {"a": 1})], "non-negative integer"),
        ([(0, {"": 1})], "non-empty strings"),
        ([(0, {"a": 1}, 3)], "pair"),
    ],
)
def test_validation(stages, message):
    with pytest.raises(ValueError, match=message):
        Mixture(stages)


def test_from_dict_rejects_other_shapes():
    for bad in (5, "web", None, {"stages": [[0, {"a": 1}]], "extra": 1}, {"a": "x"}):
        with pytest.raises(ValueError, match="mixture"):
            Mixture.from_dict(bad)


def test_check_sources_names_the_unknown_ones():
    mix = Mixture([(0, {"a": 1, "zero": 0}), (3, {"b": 1})])
    mix.check_sources(["a", "b"])  # a zero-weight source need not exist
    with pytest.raises(ValueError, match=r"unknown sources \['b'\]"):
        mix.check_sources(["a"])


weights = st.dictionaries(st.text(min_size=1, max_size=4), st.floats(0, 1e6), min_size=1, max_size=4)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**6), weights), min_size=1, max_size=4))
def test_round_trip_and_normalised_or_a_clear_error(raw):
    try:
        mix = Mixture(raw)
    except ValueError:
        return  # e.g. steps not ascending or a zero-sum stage: a ValueError, nothing else
    assert Mixture.from_dict(mix.to_dict()) == mix
    for step in mix.steps:
        assert math.isclose(sum(mix.weights_at(step).values()), 1.0)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=3),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_json_value_is_a_mixture_or_a_value_error(value):
    try:
        Mixture.from_dict(value)
    except ValueError:
        pass


def test_normalising_is_idempotent_where_a_float_sum_falls_one_ulp_short():
    """Hypothesis found it: these weights normalise to values summing to 0.9999999999999999, and
    dividing by that again moved each weight by one ulp, so a mixture read back from its own
    to_dict() differed from itself."""
    mix = Mixture([(0, {"0": 16.0, "/": 251.0, "00": 1.0})])
    assert Mixture.from_dict(mix.to_dict()) == mix
    assert dict(mix.stages[0][1]) == {"/": 251.0 / 268.0, "0": 16.0 / 268.0, "00": 1.0 / 268.0}
