"""The HF layouts checked by code we did not write: Levanter's HFCheckpointConverter and models.

Export: our checkpoint -> export_hf -> Levanter loads it -> its logits within 1e-4 of ours (fp32).
Import: Levanter's random init -> its save_pretrained -> import_hf -> our logits within 1e-4 of Levanter's.
Dense (Llama; Qwen3 with QK-norm and head_dim != d_model / heads) and MoE (Mixtral, softmax gating)."""

from __future__ import annotations

import pytest

from marin_assets.hf import export_hf, import_hf
from tests.hf.support import LLAMA_MODEL, MIXTRAL_MODEL, QWEN3_MODEL, fixed_tokens, our_logits, save_checkpoint

pytestmark = pytest.mark.slow  # importing Levanter ~10 s, a Levanter load and forward per layout

TOLERANCE = 1e-4
MODELS = {"llama": LLAMA_MODEL, "qwen3": QWEN3_MODEL, "mixtral": MIXTRAL_MODEL}


@pytest.mark.parametrize("layout", sorted(MODELS))
def test_levanter_loads_our_export_and_gives_our_logits(tmp_path, layout):
    import numpy as np

    from marin_assets.train.restore import load_model_from_checkpoint
    from tests.hf import levanter_reference as lev

    run = save_checkpoint(tmp_path / "run", MODELS[layout])
    assert export_hf(run, tmp_path / "hf", tokenizer="bytes")["layout"] == layout
    params, config, _, _ = load_model_from_checkpoint(run)
    tokens = fixed_tokens(config.vocab_size, seq=config.max_seq_len)
    ours = our_logits(params, config, tokens)
    theirs = lev.logits(lev.load(layout, tmp_path / "hf"), tokens)
    diff = float(np.max(np.abs(ours - theirs)))
    print(f"export {layout}: max |logit diff| {diff:.3g} (logits up to {float(np.max(np.abs(ours))):.3g})")
    assert diff <= TOLERANCE
    assert float(np.std(ours)) > 0.5  # logits far from uniform: a wrong mapping could not hide in them


LEVANTER_FIELDS = {
    "llama": dict(
        seq_len=32, hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=4, num_kv_heads=2, layer_norm_epsilon=1e-5
    ),
    "qwen3": dict(
        seq_len=32,
        hidden_dim=32,
        intermediate_dim=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=12,
        layer_norm_epsilon=1e-6,
    ),
    "mixtral": dict(
        seq_len=32,
        hidden_dim=32,
        intermediate_dim=24,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        n_routed_experts=4,
        num_experts_per_tok=2,
    ),
}


@pytest.mark.parametrize("layout", sorted(LEVANTER_FIELDS))
def test_we_import_a_levanter_checkpoint_and_give_its_logits(tmp_path, layout):
    import numpy as np

    from tests.hf import levanter_reference as lev

    reference = lev.random_init_saved(layout, tmp_path / "hf", **LEVANTER_FIELDS[layout])
    params, config = import_hf(f"hf:{tmp_path / 'hf'}")
    assert config.qk_norm == (layout == "qwen3") and config.is_moe == (layout == "mixtral")
    tokens = fixed_tokens(config.vocab_size, seq=config.max_seq_len)
    theirs = lev.logits(reference, tokens)
    ours = our_logits(params, config, tokens)
    diff = float(np.max(np.abs(ours - theirs)))
    print(f"import {layout}: max |logit diff| {diff:.3g} (logits up to {float(np.max(np.abs(theirs))):.3g})")
    assert diff <= TOLERANCE
    assert float(np.std(theirs)) > 0.5
