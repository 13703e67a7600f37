"""Every float of every DataKit config rejects NaN and infinities, naming the field (issue 10, item 4)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marin_assets.datakit.bloom import bloom_size
from marin_assets.datakit.decontaminate import DecontamConfig
from marin_assets.datakit.dedup_exact import ExactDedupConfig
from marin_assets.datakit.fuzzy_dedup import FuzzyDedupConfig
from marin_assets.datakit.normalize import NormalizeConfig
from marin_assets.datakit.quality import QualityModelConfig, QualityScoreConfig
from marin_assets.datakit.readers import ReaderConfig
from marin_assets.datakit.shard_index import ShardingConfig
from marin_assets.datakit.sources import SourceConfig
from marin_assets.datakit.tokenize import TokenizeConfig
from marin_assets.numeric_checks import check_float, check_int

NON_FINITE = [math.nan, math.inf, -math.inf]

FLOAT_FIELDS = [
    (DecontamConfig, "threshold"),
    (DecontamConfig, "false_positive_rate"),
    (FuzzyDedupConfig, "jaccard_threshold"),
    (QualityModelConfig, "l2"),
    (QualityModelConfig, "holdout_fraction"),
    (QualityScoreConfig, "threshold"),
    (TokenizeConfig, "validation_fraction"),
]
INT_FIELDS = [
    (ReaderConfig, "max_doc_bytes", {}),
    (ReaderConfig, "parquet_batch_rows", {}),
    (NormalizeConfig, "shard_docs", {"source": "s"}),
    (NormalizeConfig, "shard_bytes", {"source": "s"}),
    (ExactDedupConfig, "num_buckets", {}),
    (FuzzyDedupConfig, "max_bucket_size", {}),
    (DecontamConfig, "ngram", {}),
    (TokenizeConfig, "batch_docs", {}),
    (TokenizeConfig, "min_validation_docs", {}),
    (ShardingConfig, "shard_bytes", {}),
    (SourceConfig, "docs_per_shard", {}),
    (QualityScoreConfig, "batch_docs", {}),
]


@pytest.mark.parametrize("value", NON_FINITE, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("cls,field", FLOAT_FIELDS, ids=[f"{c.__name__}.{f}" for c, f in FLOAT_FIELDS])
def test_stage_config_floats_reject_non_finite(cls, field, value):
    with pytest.raises(ValueError, match=f"{field} must be a finite number"):
        cls(**{field: value})


@pytest.mark.parametrize("value", [math.nan, 2.5, True, "8"], ids=["nan", "float", "bool", "str"])
@pytest.mark.parametrize("cls,field,extra", INT_FIELDS, ids=[f"{c.__name__}.{f}" for c, f, _ in INT_FIELDS])
def test_stage_config_ints_must_be_ints(cls, field, extra, value):
    # NaN passes `x < 1`; a float from YAML would become a shard count of 2.5.
    with pytest.raises(ValueError, match=f"{field} must be an integer"):
        cls(**extra, **{field: value})


# The flags of `marin datakit run` are generated from these configs (marin_assets/knobs.py):
# a bad value fails there, named as the flag the user typed (tests/datakit/test_cli.py).
@pytest.mark.parametrize("cls,field,bad,good", [
    (TokenizeConfig, "validation_fraction", 1.0, 0.999), (TokenizeConfig, "validation_fraction", -1e-9, 0.0),
    (DecontamConfig, "threshold", 0.0, 1e-9), (DecontamConfig, "threshold", 1.0 + 1e-9, 1.0),
    (FuzzyDedupConfig, "jaccard_threshold", 0.0, 0.01), (QualityScoreConfig, "threshold", 1.01, 1.0),
    (ShardingConfig, "shard_bytes", 0, 1), (ReaderConfig, "max_doc_bytes", 0, 1), (ExactDedupConfig, "num_buckets", 65537, 65536),
])  # fmt: skip
def test_bounds_on_both_sides(cls, field, bad, good):
    with pytest.raises(ValueError, match=field):
        cls(**{field: bad})
    assert getattr(cls(**{field: good}), field) == good


def test_bloom_size_rejects_nan():
    with pytest.raises(ValueError, match="false_positive_rate must be a finite number"):
        bloom_size(100, math.nan)


@settings(max_examples=200, deadline=None)
@given(
    value=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(), st.booleans(), st.text(max_size=3), st.none())
)
def test_check_float_accepts_exactly_finite_numbers_in_range(value):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and 0 <= value < 1
    if ok:
        assert check_float("x", value, 0.0, 1.0, hi_open=True) == value
    else:
        with pytest.raises(ValueError, match="^x must be"):
            check_float("x", value, 0.0, 1.0, hi_open=True)


@settings(max_examples=200, deadline=None)
@given(value=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(), st.booleans(), st.text(max_size=3)))
def test_check_int_accepts_exactly_ints_in_range(value):
    ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 100
    if ok:
        assert check_int("n", value, 1, 100) == value
    else:
        with pytest.raises(ValueError, match="^n must be"):
            check_int("n", value, 1, 100)
