"""The TrainConfig parser: wrong shapes, wrong types and non-finite numbers are one clear
ConfigError (a ValueError) naming the field; property tests over arbitrary JSON values."""

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marin_assets.model.config import ModelConfig
from marin_assets.train.config import (
    ConfigError,
    GuardConfig,
    OptimizerConfig,
    ScheduleConfig,
    TrainConfig,
    config_from_dict,
    config_to_dict,
    load_config,
    replace,
)

NESTED = {"model": ModelConfig, "optimizer": OptimizerConfig, "schedule": ScheduleConfig, "guards": GuardConfig}


def float_fields():
    for section, cls in [(None, TrainConfig), *NESTED.items()]:
        for f in dataclasses.fields(cls):
            if str(f.type).replace(" ", "") in ("float", "float|None"):
                yield section, f.name


@pytest.mark.parametrize("section,name", list(float_fields()))
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_every_float_rejects_nan_and_inf_by_name(section, name, bad):
    data = {name: bad} if section is None else {section: {name: bad}}
    with pytest.raises(ConfigError, match=rf"\.{name} must be finite, got {bad!r}"):
        config_from_dict(data)


def test_the_issue_examples_are_rejected():
    # before: rc 0 with a NaN loss, or clipping silently off
    for section, name in (("model", "init_std"), ("optimizer", "weight_decay"), ("guards", "grad_clip")):
        with pytest.raises(ConfigError, match=f"config.{section}: .*{name} must be finite"):
            config_from_dict({section: {name: math.nan}})


@pytest.mark.parametrize(
    "data,message",
    [
        ([1, 2], "expected a mapping of TrainConfig fields, got list"),
        ("text", "expected a mapping of TrainConfig fields, got str"),
        ({"model": 5}, "config.model must be a mapping of ModelConfig fields, got int 5"),
        ({"model": [1]}, "config.model must be a mapping"),
        ({"schedule": "wsd", "num_steps": 3}, "config.schedule must be a mapping of ScheduleConfig"),
        ({"seq_len": "64"}, "TrainConfig.seq_len must be int, got str"),
        ({"seq_len": 64.0}, "TrainConfig.seq_len must be int, got float"),
        ({"batch_size": True}, "TrainConfig.batch_size must be int, got bool"),
        ({"wandb": "yes"}, "TrainConfig.wandb must be bool"),
        ({"model": {"d_model": None}}, "ModelConfig.d_model must be int"),
        ({"model": {"init_std": "0.02"}}, "ModelConfig.init_std must be float"),
        ({"model": {"init_std": 0.0}}, "ModelConfig.init_std must be > 0"),
        ({"model": {"grouped_matmul": "fast"}}, "grouped_matmul must be one of"),
        ({"mixture": 5}, "mixture must be"),
        ({"mixture": {"web": -1}}, "weight of 'web' must be finite and >= 0"),
        ({"guards": {"max_skipped_fraction": 1.5}}, "max_skipped_fraction must be in"),
        ({"nope": 1}, r"unknown field\(s\) \['nope'\]"),
    ],
)
def test_wrong_shapes_and_types_name_the_field(data, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict(data)


def test_grouped_matmul_choices_come_from_the_kernel():
    from kernels.grouped_matmul import IMPLS

    for impl in IMPLS:
        assert ModelConfig(grouped_matmul=impl).grouped_matmul == impl


def test_yaml_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml:2:1: invalid YAML: ") as err:
        load_config(bad)
    assert "\n" not in str(err.value)  # one line for the CLI, not PyYAML's multi-line report
    bad.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match=r"bad\.yaml: not UTF-8 text \(byte 0\)"):
        load_config(bad)
    bad.write_text("model: 5\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: config.model must be a mapping"):
        load_config(bad)


def test_vocab_size_from_the_cache_only_when_unset():
    assert config_from_dict({}, vocab_size=4096).model.vocab_size == 4096
    assert config_from_dict({"model": {"d_model": 32}}, vocab_size=4096).model.vocab_size == 4096
    assert config_from_dict({"model": {"vocab_size": 300}}, vocab_size=4096).model.vocab_size == 300
    assert config_from_dict({}).model.vocab_size == ModelConfig().vocab_size


def test_examples_load_and_round_trip():
    config = load_config("examples/tiny_moe.yaml", vocab_size=2311)
    assert config.model.vocab_size == 2311 and config.schedule.total_steps == config.num_steps == 200
    assert config_from_dict(config_to_dict(config)) == config
    staged = replace(config, mixture={"stages": [[0, {"a": 1}], [10, {"b": 3}]]})
    assert config_from_dict(config_to_dict(staged)).mixture == staged.mixture
    assert replace(staged, mixture={"a": 1.0}).mixture.sources == ("a",)


json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4)
json_values = st.recursive(
    json_scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=12
)
field_names = st.sampled_from([f.name for f in dataclasses.fields(TrainConfig)])
section_fields = st.sampled_from(sorted({f.name for cls in NESTED.values() for f in dataclasses.fields(cls)}))


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_json_value_is_a_config_or_a_config_error(value):
    try:
        assert isinstance(config_from_dict(value), TrainConfig)
    except ConfigError:
        pass


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(field_names, json_values, max_size=4),
    st.dictionaries(st.sampled_from(sorted(NESTED)), st.dictionaries(section_fields, json_values, max_size=3), max_size=2),
)
def test_known_fields_with_any_values_never_raise_anything_else(top, nested):
    """Arbitrary values under the real field names reach every __post_init__ check."""
    try:
        config = config_from_dict({**top, **nested})
    except ConfigError as e:
        assert str(e)  # a message, never a TypeError/AttributeError/KeyError
        return
    assert config_from_dict(config_to_dict(config)) == config
