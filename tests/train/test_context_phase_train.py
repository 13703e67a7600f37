"""A context phase: ``PhaseSpec.seq_len`` doubles the sequence length at constant tokens per batch, and the phase
warm-starts from its predecessor's checkpoint and trains, reading the data after the predecessor's last token."""

import math

import jax
import pytest

from marin_assets.phases.job import phase_spec
from marin_assets.phases.plan import PhaseSpec, phase_train_config, spec_record
from marin_assets.train.config import replace
from marin_assets.train.data.batches import DataPosition, MixedLoader
from marin_assets.train.loop import train

SPEC = {
    "warm_start_from": None,
    "schedule": "wsd",
    "mixture": {"license": 1.0},
    "batch_size": 4,
    "hardware": "cpu",
    "peak_lr": 3e-3,
}


def test_phase_config_keeps_tokens_per_batch_and_refuses_what_cannot(tiny_config):
    base = replace(tiny_config, model={"max_seq_len": 64})
    long = phase_train_config(base, PhaseSpec(name="long", token_budget=4 * 128, seq_len=64, **SPEC))
    assert (long.seq_len, long.batch_size, long.num_steps) == (64, 2, 4)
    same = phase_train_config(base, PhaseSpec(name="short", token_budget=4 * 128, **SPEC))
    assert (same.seq_len, same.batch_size, same.num_steps) == (32, 4, 4)
    with pytest.raises(ValueError, match="seq_len 96 does not divide the 128 tokens per batch"):
        phase_train_config(replace(base, model={"max_seq_len": 128}), PhaseSpec(name="x", token_budget=512, seq_len=96, **SPEC))
    with pytest.raises(ValueError, match="seq_len 128 exceeds the model's max_seq_len 64"):
        phase_train_config(base, PhaseSpec(name="x", token_budget=512, seq_len=128, **SPEC))


def test_spec_record_omits_an_unset_seq_len():
    import dataclasses

    plain = dataclasses.asdict(PhaseSpec(name="k", token_budget=512, **SPEC))
    assert "seq_len" not in spec_record(plain)
    assert spec_record(dataclasses.asdict(PhaseSpec(name="k", token_budget=512, seq_len=64, **SPEC)))["seq_len"] == 64


def test_model_has_no_parameter_shaped_by_the_context(tiny_config):
    from marin_assets.model.transformer import init_params

    def shapes(max_seq_len):
        config = replace(tiny_config, model={"max_seq_len": max_seq_len}).model
        return jax.tree.map(lambda a: a.shape, init_params(config, jax.random.key(0)))

    assert shapes(32) == shapes(64)  # RoPE and the causal mask are computed from the positions


@pytest.mark.slow  # two phases of the real train loop, ~30 s with compiles
def test_context_phase_warm_starts_and_trains_on_the_next_tokens(caches, tiny_config, tmp_path):
    """4x the first phase's length, on the blockwise (memory linear in S) attention kernel."""
    base = replace(tiny_config, model={"max_seq_len": 32}, checkpoint_every_steps=4)
    short = phase_train_config(base, PhaseSpec(name="kestrel", token_budget=4 * 128, **SPEC))
    first = train(short, {"license": caches["license"]}, tmp_path / "kestrel")
    long_spec = PhaseSpec(
        name="ocelot",
        token_budget=4 * 128,
        seq_len=128,
        **dict(SPEC, warm_start_from="kestrel", model_changes={"max_seq_len": 128, "attention_impl": "blockwise"}),
    )
    long = phase_train_config(base, long_spec)
    assert (long.seq_len, long.batch_size, long.model.attention_impl) == (128, 1, "blockwise")
    second = train(long, {"license": caches["license"]}, tmp_path / "ocelot", warm_start=tmp_path / "kestrel")
    assert second.phase_start_step == 4 and second.final_step == 8 and second.tokens == 8 * 128
    assert second.last_loss is not None and math.isfinite(second.last_loss)
    position = DataPosition.from_json(second.data_position)
    assert position.tokens(128) == {"license": 8 * 128} and position.block_tokens == 32
    # the long phase read the stream on from the short phase's last token: its next batch is the short
    # phase's order continued (the stream from token 1024)
    loader = MixedLoader({"license": caches["license"]}, 32, 4, seed=short.data_seed)
    after_short = DataPosition.from_json(first.data_position)
    for _ in range(4):
        _, _, after_short = loader.next_batch(after_short)
    expected, _, _ = loader.next_batch(after_short)
    got, _, _ = MixedLoader({"license": caches["license"]}, 128, 1, seed=long.data_seed).next_batch(position)
    assert (got.reshape(-1) == expected.reshape(-1)).all()


def test_phase_config_carries_seq_len_and_keeps_older_versions():
    import dataclasses

    from assets.train_base import PhaseSpecConfig

    spec = PhaseSpec(name="long", token_budget=512, seq_len=64, **SPEC)
    assert phase_spec(PhaseSpecConfig.of(spec).model_dump()) == spec
    plain = PhaseSpec(name="k", token_budget=512, **SPEC)
    assert spec_record(PhaseSpecConfig.of(plain).model_dump()) == spec_record(dataclasses.asdict(plain))
    assert "seq_len" not in spec_record(PhaseSpecConfig.of(plain).model_dump())
