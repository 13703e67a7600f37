"""A process reuses a run's jitted init and step for the next run whose computation is the same
(``compile_cache.reuse_jitted``): runs that differ only in seed, schedule or length trace nothing
new and train exactly as a process that never saw the first run; a run whose model differs gets
its own."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import numpy as np
import pytest

from marin_assets.train import compile_cache
from marin_assets.train.config import ScheduleConfig
from marin_assets.train.loop import train
from marin_assets.train.metrics import read_metrics


def _losses(out) -> list[float]:
    return [row["loss"] for row in read_metrics(out / "metrics.jsonl")]


def _kept_keys() -> list:
    return list(compile_cache._JITTED)


@pytest.fixture(scope="module")
def seed_zero_run(caches, jax_cache, tmp_path_factory) -> tuple[OrderedDict, object]:
    """(the jitted functions a seed-0 run of the tiny config kept, starting from an empty cache; its out dir):
    both tests start from this state, so the run is trained once. Each test reuses a copy, as a process would
    after that run."""
    from marin_assets.train.config import config_from_dict
    from tests.support.configs import TINY_TRAIN

    kept, out = compile_cache._JITTED, tmp_path_factory.mktemp("jit_reuse") / "first"
    compile_cache._JITTED = type(kept)()
    try:
        train(config_from_dict(TINY_TRAIN), caches, out)  # seed 0, the config's own schedule and length
        return OrderedDict(compile_cache._JITTED), out
    finally:
        compile_cache._JITTED = kept


def test_a_second_seed_reuses_the_step_and_trains_as_a_fresh_process_would(
    caches, tiny_config, tmp_path, monkeypatch, seed_zero_run
):
    monkeypatch.setattr(compile_cache, "_JITTED", type(compile_cache._JITTED)())  # this test's own, empty
    other = dataclasses.replace(
        tiny_config, seed=7, num_steps=8, schedule=ScheduleConfig(kind="constant", peak_lr=0.001, warmup_steps=2, total_steps=8)
    )
    alone = train(other, caches, tmp_path / "alone")  # the first run of its kind in this cache
    alone_losses = _losses(tmp_path / "alone")
    assert sorted(k[0] for k in _kept_keys()) == ["init_state", "train_step"]  # the test caches hold no validation split

    jitted, first = seed_zero_run
    monkeypatch.setattr(compile_cache, "_JITTED", OrderedDict(jitted))  # as the seed-0 run left it
    first_keys = _kept_keys()
    after = train(other, caches, tmp_path / "after")  # reuses what the seed-0 run built
    assert _kept_keys() == first_keys  # nothing new was built
    assert _losses(tmp_path / "after") == alone_losses  # bit for bit
    assert after.final_step == alone.final_step == 8
    assert np.isfinite(alone_losses).all() and alone_losses != _losses(first)[:8]


def test_another_model_gets_its_own_step(caches, tiny_config, tmp_path, monkeypatch, seed_zero_run):
    monkeypatch.setattr(compile_cache, "_JITTED", OrderedDict(seed_zero_run[0]))  # as the seed-0 run left it
    before = _kept_keys()
    assert sorted(k[0] for k in before) == ["init_state", "train_step"]
    wider = dataclasses.replace(tiny_config, model=dataclasses.replace(tiny_config.model, d_ff=2 * tiny_config.model.d_ff))
    train(wider, caches, tmp_path / "b")
    added = [k for k in _kept_keys() if k not in before]
    assert sorted(k[0] for k in added) == ["init_state", "train_step"]


def test_the_cache_keeps_at_most_its_bound_and_drops_the_least_recent(monkeypatch):
    monkeypatch.setattr(compile_cache, "_JITTED", type(compile_cache._JITTED)())
    built = []
    for i in range(compile_cache.JITTED_KEPT + 2):
        compile_cache.reuse_jitted(("k", i), lambda i=i: built.append(i) or i)
    assert len(compile_cache._JITTED) == compile_cache.JITTED_KEPT
    assert compile_cache.reuse_jitted(("k", 0), lambda: "rebuilt") == "rebuilt"  # dropped first, so built again
    assert compile_cache.reuse_jitted(("k", compile_cache.JITTED_KEPT + 1), lambda: "no") == compile_cache.JITTED_KEPT + 1
