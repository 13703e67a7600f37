"""Every bad value a train config can hold is refused by load_config, before any work starts, with one
ConfigError naming the field: integers past what the device keeps (int32 ids and steps, 32-bit seeds),
non-finite or overflowing floats, and a model whose state cannot fit this host's memory."""

import dataclasses
import functools
import math
import time
import tracemalloc

import jax
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from marin_assets.model.config import ModelConfig
from marin_assets.train.config import (
    ConfigError,
    GuardConfig,
    OptimizerConfig,
    ScheduleConfig,
    TrainConfig,
    check_state_fits,
    config_from_dict,
    load_config,
    state_bytes,
)
from tests.support.configs import TINY_TRAIN
from tests.train.test_cli_datakit import marin_train

I32 = 2**31 - 1
# Every integer field and its allowed [lo, hi] (hi None: bounded by another field only).
INT_RANGES = {
    (None, "seq_len"): (2, I32),
    (None, "batch_size"): (1, I32),
    (None, "num_steps"): (1, I32),
    (None, "seed"): (0, 2**32 - 1),
    (None, "data_seed"): (0, 2**32 - 1),
    (None, "data_block_tokens"): (1, I32),
    (None, "checkpoint_every_steps"): (1, I32),
    (None, "prefetch"): (1, I32),
    (None, "microbatches"): (1, I32),
    (None, "sequence_parallel"): (1, I32),
    **{
        ("model", name): (lo, I32)
        for name, lo in (
            ("vocab_size", 1),
            ("d_model", 1),
            ("n_layers", 1),
            ("n_heads", 1),
            ("n_kv_heads", 1),
            ("head_dim", 1),
            ("d_ff", 1),
            ("n_routed_experts", 0),
            ("n_shared_experts", 0),
            ("top_k", 0),
            ("expert_d_ff", 0),
            ("latent_dim", 1),
            ("max_seq_len", 1),
            ("histogram_bins", 1),
            ("sliding_window", 1),
            ("global_attention_every", 1),
        )
    },
    ("optimizer", "muon_ns_steps"): (1, 100),
    **{("schedule", name): (0, I32) for name in ("warmup_steps", "decay_steps", "cycle_steps", "rewarm_steps")},
    ("schedule", "total_steps"): (1, I32),
    ("guards", "window"): (2, I32),
    ("guards", "min_history"): (2, None),
    ("guards", "max_consecutive_spikes"): (0, I32),
}
SECTIONS = {
    None: TrainConfig,
    "model": ModelConfig,
    "optimizer": OptimizerConfig,
    "schedule": ScheduleConfig,
    "guards": GuardConfig,
}


def _fields(kind: str):
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            if str(f.type).replace(" ", "").removesuffix("|None") == kind:
                yield section, f.name


def _load(tmp_path, section, name, value):
    cfg = tmp_path / "cfg.yaml"
    data = {name: value} if section is None else {section: {name: value}}
    cfg.write_text(yaml.safe_dump(data))
    return load_config(cfg)


def test_the_table_lists_every_integer_field():
    assert set(INT_RANGES) == set(_fields("int"))


def test_a_seed_past_32_bits_is_refused_with_the_range(tmp_path):
    # Before: accepted, then jax.random.PRNGKey(2**70) raised OverflowError in the first step's setup;
    # 2**32 was silently seed 0's key.
    for seed in (2**70, 2**64, 2**32, -1):
        with pytest.raises(ConfigError, match=r"cfg\.yaml: config: TrainConfig\.seed must be in \[0, 4294967295\]"):
            _load(tmp_path, None, "seed", seed)
    assert _load(tmp_path, None, "seed", 2**32 - 1).seed == 2**32 - 1
    assert list(jax.random.PRNGKey(2**32 - 1)) != list(jax.random.PRNGKey(0))


def test_a_vocab_past_int32_ids_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"ModelConfig\.vocab_size must be in \[1, 2147483647\], got 17179869184"):
        _load(tmp_path, "model", "vocab_size", 2**34)


def test_a_model_whose_state_cannot_fit_this_host_is_refused_naming_the_field(tmp_path):
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, "model", "vocab_size", 2**30)  # within int32; 1.5 TiB of params and Adam moments
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{tmp_path / 'cfg.yaml'}: config: ")
    assert "need at least 1,536.0 GiB" in message and "GiB of memory this host has" in message
    assert "model.vocab_size=1073741824 x model.d_model=64" in message
    deep = config_from_dict({"model": {"n_layers": 100_000, "d_model": 1024, "n_heads": 8, "n_kv_heads": 4}})
    with pytest.raises(ConfigError, match=r"of them in the layers \(model\.n_layers=100000\)"):
        check_state_fits(deep, available=2**40)


def test_a_normal_config_fits_and_the_estimate_is_cheap_and_a_lower_bound(tmp_path):
    from marin_assets.train.optimizers import make_optimizer
    from marin_assets.train.state import init_state, moe_model

    config = load_config("examples/tiny_moe.yaml", vocab_size=4096)  # not refused
    check_state_fits(config, available=state_bytes(config))
    with pytest.raises(ConfigError, match="more than the 0.0 GiB"):
        check_state_fits(config, available=state_bytes(config) - 1)
    model = moe_model()
    for name in ("adamw", "adamh", "muon"):
        c = config_from_dict({**TINY_TRAIN, "optimizer": {"name": name}})
        shapes = jax.eval_shape(functools.partial(model.init_params, c.model), jax.random.PRNGKey(0))
        state = jax.eval_shape(functools.partial(init_state, c, make_optimizer(c.optimizer, shapes), model))
        params_and_opt = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves((state.params, state.opt_state)))
        batches = (c.prefetch + 1) * c.batch_size * c.seq_len * 4 + 3 * c.guards.window * 4
        assert state_bytes(c) - batches <= params_and_opt  # never refuses a state that fits
    huge = config_from_dict({"model": {"vocab_size": I32, "d_model": 2**30, "n_layers": I32}})
    tracemalloc.start()
    began = time.perf_counter()
    assert state_bytes(huge) > 2**90
    assert time.perf_counter() - began < 0.1 and tracemalloc.get_traced_memory()[1] < 2**20
    tracemalloc.stop()


@pytest.mark.slow
@pytest.mark.parametrize(
    "text,message",
    [
        ("seed: 1180591620717411303424\n", "TrainConfig.seed must be in [0, 4294967295], got 1180591620717411303424"),
        ("model:\n  vocab_size: 1073741824\n", "model.vocab_size=1073741824 x model.d_model=64"),
        ("model:\n  init_std: 1" + "0" * 400 + "\n", "config.model.init_std must be a finite number"),
    ],
)
def test_marin_train_refuses_in_one_line_with_exit_2(caches, tmp_path, text, message):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(text)
    r = marin_train(caches["license"], cfg, tmp_path / "out", timeout=120)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.startswith(f"marin train: {cfg}: ") and message in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def _out_of_range(lo, hi):
    below = st.integers(max_value=lo - 1) if lo is not None else st.nothing()
    above = st.integers(min_value=hi + 1) if hi is not None else st.nothing()
    return below | above | st.sampled_from([2**70, -(2**70), 2**63, 2**64])


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_every_integer_field_refuses_out_of_range_values_by_name(data):
    section, name = data.draw(st.sampled_from(sorted(INT_RANGES, key=str)))
    lo, hi = INT_RANGES[section, name]
    value = data.draw(_out_of_range(lo, hi).filter(lambda v: hi is not None or v < lo) | st.booleans())
    where = {"cycle_steps": {"kind": "wsd_s"}}.get(name, {})  # the field the other checks would reach first
    raw = {name: value} if section is None else {section: {**where, name: value}}
    with pytest.raises(ConfigError, match=rf"\b{name}\b") as err:
        config_from_dict(raw)
    assert "\n" not in str(err.value)


def _bad_floats():
    # non-finite, a YAML integer literal past float range, a bool
    return st.sampled_from([math.nan, math.inf, -math.inf, 10**400, -(10**400), True])


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(_fields("float"), key=str)), _bad_floats())
def test_every_float_field_refuses_non_finite_and_overflowing_values_by_name(field, value):
    section, name = field
    raw = {name: value} if section is None else {section: {name: value}}
    with pytest.raises(ConfigError, match=rf"\b{name}\b"):
        config_from_dict(raw)
