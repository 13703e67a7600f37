"""A context branch: a ``BranchSpec`` with its own ``seq_len``, ``model_changes`` that leave the parameters as they
are (``CONTEXT_MODEL_FIELDS``) and sequence axis; the demo's plan carries one at 4x its first phase's length."""

from __future__ import annotations

import dataclasses

import jax
import pytest

from assets.run_plan import DEMO_BASE, DEMO_PLAN
from marin_assets.model.transformer import init_params
from marin_assets.phases.branches import branch_phase
from marin_assets.phases.job import base_config
from marin_assets.phases.plan import CONTEXT_MODEL_FIELDS, BranchSpec, phase_train_config
from marin_assets.train.config import config_from_dict
from tests.support.configs import TINY_TRAIN

JELLYFISH = dataclasses.replace(DEMO_PLAN.first, name="jellyfish", model_changes={"qk_norm": True})


def test_a_branch_takes_its_context_and_keeps_the_sources_model_changes():
    long = BranchSpec("long", "jellyfish", 1024, seq_len=256, model_changes={"max_seq_len": 256}, sequence_parallel=2)
    phase = branch_phase(long, JELLYFISH)
    assert (phase.seq_len, phase.sequence_parallel) == (256, 2)
    assert phase.model_changes == {"qk_norm": True, "max_seq_len": 256}  # the source's, then the branch's
    plain = branch_phase(BranchSpec("plain", "jellyfish", 1024), JELLYFISH)
    assert (plain.seq_len, plain.sequence_parallel, plain.model_changes) == (None, None, {"qk_norm": True})


def test_a_branch_may_not_change_what_shapes_the_parameters():
    with pytest.raises(ValueError, match=r"model_changes may name only .* not \['d_model', 'qk_norm'\]"):
        BranchSpec("wide", "jellyfish", 1024, model_changes={"d_model": 128, "qk_norm": True})
    with pytest.raises(ValueError, match="not a ModelConfig field"):
        BranchSpec("typo", "jellyfish", 1024, model_changes={"max_seq_lenn": 256})
    with pytest.raises(ValueError, match="seq_len must be >= 2"):
        BranchSpec("short", "jellyfish", 1024, seq_len=1)


@pytest.mark.parametrize(
    "changes",
    [
        {"max_seq_len": 256},
        {"attention_impl": "blockwise"},
        {"sliding_window": 16, "global_attention_every": 2},
        {"rope_per_document": True},
    ],
)
def test_the_context_fields_leave_every_parameter_as_it_is(changes):
    assert set(changes) <= set(CONTEXT_MODEL_FIELDS)
    model = config_from_dict(dict(TINY_TRAIN, model=dict(TINY_TRAIN["model"], n_layers=2))).model

    def shapes(config):
        return jax.tree.map(lambda a: (a.shape, a.dtype), jax.eval_shape(lambda: init_params(config, jax.random.key(0))))

    assert shapes(dataclasses.replace(model, **changes)) == shapes(model)


def test_the_demos_plan_runs_a_context_branch_at_four_times_its_first_phase_on_the_blockwise_kernel():
    (long,) = [b for b in DEMO_PLAN.branches if b.seq_len is not None]
    config = phase_train_config(base_config(DEMO_BASE, 257), branch_phase(long, JELLYFISH))
    first = phase_train_config(base_config(DEMO_BASE, 257), DEMO_PLAN.first)
    assert config.seq_len == 4 * first.seq_len == 256 and config.model.max_seq_len == 256
    assert config.model.attention_impl == "blockwise"
    assert config.tokens_per_step == first.tokens_per_step  # 2 rows of 256: the schedule's tokens mean what they did
    assert config.num_steps == 8 and config.phase == "jellyfish+long"
