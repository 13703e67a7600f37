"""The tests' tiny model and training configs (dicts, as config files and ``config_from_dict``
take them): one base model, the others derived from it with what differs said.

Models that train on the test caches (tests/support/caches.py, tests/support/datasets.py) use
the byte tokenizer's vocabulary, ``VOCAB_SIZE`` 257 (EOS 256). Standard library and
``marin_assets.experiments.data`` only, so subprocess scripts import it cheaply.
"""

from __future__ import annotations

from marin_assets.experiments.data import VOCAB_SIZE as SCREEN_CORPUS_VOCAB_SIZE
from tests.support.byte_tokens import VOCAB_SIZE

# A one-layer MoE: 4 routed experts (top-2) and one shared expert, 32 wide.
TINY_MODEL = {
    "vocab_size": VOCAB_SIZE,
    "d_model": 32,
    "n_layers": 1,
    "n_heads": 2,
    "n_kv_heads": 1,
    "d_ff": 64,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "top_k": 2,
    "expert_d_ff": 32,
    "max_seq_len": 32,
}

# The `base` config of a train/demo phase (the phase's own fields replace schedule, steps, mixture):
# 8 steps of 4 x 32 tokens, a checkpoint every 4.
PHASE_BASE = {
    "model": TINY_MODEL,
    "seq_len": 32,
    "batch_size": 4,
    "num_steps": 8,
    "checkpoint_every_steps": 4,
    "schedule": {"kind": "wsd", "peak_lr": 3e-3, "warmup_steps": 2, "decay_steps": 2},
}

# What tests/train trains: 12 steps (checkpoints at 4 and 8, so a kill at 10 resumes from 8), a
# 4-step decay, and loss-spike guards that have a history after 4 steps.
TINY_TRAIN = dict(
    PHASE_BASE, num_steps=12, schedule=dict(PHASE_BASE["schedule"], decay_steps=4), guards={"window": 16, "min_history": 4}
)

# Half as wide, 2 routed experts (top-1), 16-token sequences: the cheapest MoE that still routes.
NARROW_MODEL = dict(TINY_MODEL, d_model=16, d_ff=32, n_routed_experts=2, top_k=1, expert_d_ff=16, max_seq_len=16)

# Experiment records train on the screens' own corpus (marin_assets/experiments/data.py), whose
# vocabulary the record loader requires: taken from there, so the two cannot drift apart.
SCREEN_MODEL = dict(NARROW_MODEL, vocab_size=SCREEN_CORPUS_VOCAB_SIZE)

# The training-backend tests' spec: 5 steps, one checkpoint at the end, no shared expert.
BACKEND_TRAIN = {
    "model": dict(NARROW_MODEL, n_shared_experts=0),
    "seq_len": 16,
    "batch_size": 4,
    "num_steps": 5,
    "checkpoint_every_steps": 5,
    "schedule": {"kind": "wsd", "warmup_steps": 1, "decay_steps": 1},
}

# The untrained checkpoint the evaluation tests score: dense (the expert fields are unused), 64
# tokens of context, and the 256 ids of evaluate()'s default tokenizer (byte_encode, bos_id 0).
EVAL_CHECKPOINT = {
    "model": dict(TINY_MODEL, vocab_size=256, n_routed_experts=0, max_seq_len=64),
    "seq_len": 64,
    "num_steps": 10,
    "schedule": {"warmup_steps": 1, "decay_steps": 1},
}
