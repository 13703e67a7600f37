"""phases/job.py: one phase -> the TrainSpec a backend runs (what the train/demo asset used to assemble
in its body), checked field by field without training."""

from __future__ import annotations

import dataclasses

import pytest

from marin_assets.datakit.mixture import Mixture
from marin_assets.phases.job import TOKENIZER_VOCAB, base_config, phase_job, phase_mixture, phase_spec
from marin_assets.phases.plan import PhaseSpec
from marin_assets.train.budget import Budget, write_budget
from tests.support.configs import PHASE_BASE

SCHEDULE = Mixture([(0, {"web": 0.5, "code": 0.5}), (100, {"web": 0.0, "code": 1.0})])
DATASETS = {
    "web": {"index": "/data/web/dataset.json", "train_tokens": 4096},
    "code": {"index": "/data/code/dataset.json", "train_tokens": 2048},
    "books": {"index": "/data/books/dataset.json", "train_tokens": 1024},  # in the mixture, weighted by no stage
}
SPEC = dict(
    name="ocelot",
    warm_start_from=None,
    schedule="wsd",
    mixture=None,
    batch_size=4,
    hardware="cpu",
    token_budget=16 * 4 * 32,
    peak_lr=1e-3,
)


def _base(vocab: int = 257):
    return base_config(PHASE_BASE, vocab)


def test_a_phase_without_its_own_mix_trains_on_the_schedule_and_records_its_first_stage():
    spec = phase_spec(SPEC, SCHEDULE)
    assert spec.mixture == {"web": 0.5, "code": 0.5}
    assert phase_mixture(None, SCHEDULE) is SCHEDULE
    with pytest.raises(ValueError, match="phase ocelot names no mixture and none was given"):
        phase_spec(SPEC)
    own = phase_spec({**SPEC, "mixture": {"books": 1.0}})
    assert phase_mixture(own.mixture, SCHEDULE).weighted == ("books",)


def test_the_job_trains_the_phase_on_the_sources_its_mixture_weights():
    spec = phase_spec(SPEC, SCHEDULE)
    job = phase_job(spec, _base(), SCHEDULE, DATASETS, out_dir="/scratch/ocelot", run="demo", attempt=2)
    assert dict(job.caches) == {"code": "/data/code/dataset.json", "web": "/data/web/dataset.json"}  # not books
    assert job.config.mixture is SCHEDULE and job.config.phase == "ocelot"
    assert job.config.num_steps == 16 and job.config.schedule.peak_lr == 1e-3  # the budget over 4 x 32 tokens a step
    assert job.config.seed == _base().seed + 2  # a roll-back's retry draws fresh randomness
    assert (job.out_dir, job.resume, job.warm_start) == ("/scratch/ocelot", True, None)
    assert job.telemetry_run == "demo-ocelot" and job.budget_file is None


def test_a_source_without_training_tokens_is_refused_before_any_compute():
    empty = {**DATASETS, "code": {**DATASETS["code"], "train_tokens": 0}}
    with pytest.raises(ValueError, match=r"phase ocelot's mixture names unknown sources \['code'\]"):
        phase_job(phase_spec(SPEC, SCHEDULE), _base(), SCHEDULE, empty, out_dir="/s", run="demo")


def test_a_warm_started_phase_needs_its_warm_start_and_a_named_budget_file_must_exist(tmp_path):
    spec = phase_spec({**SPEC, "warm_start_from": "kestrel"}, SCHEDULE)
    with pytest.raises(ValueError, match="warm-starts from 'kestrel' but no warm start was given"):
        phase_job(spec, _base(), SCHEDULE, DATASETS, out_dir="/s", run="demo")
    with pytest.raises(FileNotFoundError):
        phase_job(spec, _base(), SCHEDULE, DATASETS, out_dir="/s", run="demo", warm_start="/w", budget_file=str(tmp_path / "no"))
    write_budget(tmp_path / "budget.yaml", Budget(10_000))
    job = phase_job(
        spec, _base(), SCHEDULE, DATASETS, out_dir="/s", run="demo", warm_start="/w", budget_file=str(tmp_path / "budget.yaml")
    )
    assert (job.warm_start, job.budget_file) == ("/w", str(tmp_path / "budget.yaml"))


def test_the_base_takes_the_tokenizers_vocabulary_unless_it_names_one():
    tokenizer = {**PHASE_BASE, "model": {**PHASE_BASE["model"], "vocab_size": TOKENIZER_VOCAB}}
    assert base_config(tokenizer, 300).model.vocab_size == 300
    assert base_config({**PHASE_BASE, "model": {**PHASE_BASE["model"], "vocab_size": 512}}, 300).model.vocab_size == 512
    unset = {k: v for k, v in PHASE_BASE.items() if k != "model"} | {"model": {"d_model": 32, "n_heads": 2, "n_kv_heads": 1}}
    assert base_config(unset, 300).model.vocab_size == 300


def test_a_context_phase_keeps_the_tokens_per_batch():
    spec = dataclasses.replace(phase_spec(SPEC, SCHEDULE), seq_len=16)
    job = phase_job(spec, _base(), SCHEDULE, DATASETS, out_dir="/s", run="demo")
    assert (job.config.seq_len, job.config.batch_size) == (16, 8)  # 4 x 32 tokens as 8 x 16
    assert isinstance(spec, PhaseSpec)
