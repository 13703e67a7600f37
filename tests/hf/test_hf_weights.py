"""HF export and import without Levanter: round trips, sharding, the card, and every refusal in one line.
(tests/hf/test_levanter_*.py check the layouts against code we did not write.)"""

from __future__ import annotations

import json

import numpy as np
import pytest

from marin_assets.cli import main
from marin_assets.hf import ImportMismatch, NotExportable, export_hf, first_architecture_difference, import_hf
from tests.hf.support import LLAMA_MODEL, MIXTRAL_MODEL, QWEN3_MODEL, QWEN3_MOE_MODEL, fixed_tokens, our_logits, save_checkpoint
from tests.support.configs import TINY_MODEL

LAYOUT_MODELS = {"llama": LLAMA_MODEL, "qwen3": QWEN3_MODEL, "mixtral": MIXTRAL_MODEL, "qwen3_moe": QWEN3_MOE_MODEL}


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text
    return text


@pytest.mark.parametrize("layout", sorted(LAYOUT_MODELS))
def test_ours_to_hf_to_ours_is_bit_identical(tmp_path, layout):
    from marin_assets.train.restore import load_model_from_checkpoint

    run = save_checkpoint(tmp_path / "run", LAYOUT_MODELS[layout])
    result = export_hf(run, tmp_path / "hf", tokenizer="bytes", shard_bytes=20_000)  # forces shards
    assert result["layout"] == layout
    assert "model.safetensors.index.json" in result["files"] and len(result["files"]) > 8
    params, config, _, _ = load_model_from_checkpoint(run)
    back, imported = import_hf(f"hf:{tmp_path / 'hf'}")
    assert first_architecture_difference(imported, config) is None
    import jax

    ours, theirs = jax.tree_util.tree_leaves_with_path(params), jax.tree_util.tree_leaves_with_path(back)
    assert [p for p, _ in ours] == [p for p, _ in theirs]
    for (path, a), (_, b) in zip(ours, theirs, strict=True):
        if not config.qk_norm and jax.tree_util.keystr(path).endswith(("['q_norm']", "['k_norm']")):
            continue  # unused without QK-norm: no HF tensor carries them (they come back as their init, ones)
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), jax.tree_util.keystr(path)
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(str(tmp_path / "hf"))  # transformers reads our config.json as its own class
    assert cfg.model_type == layout and cfg.rms_norm_eps == config.norm_eps and cfg.num_hidden_layers == 2
    assert cfg.rope_theta == config.rope_theta and cfg.head_dim == config.resolved_head_dim
    if layout == "qwen3_moe":
        assert cfg.norm_topk_prob and cfg.num_experts == 4 and cfg.moe_intermediate_size == 32


def test_imported_unused_qk_norm_gains_are_ones_not_zeros(tmp_path):
    """Without QK-norm the q/k gains are in our tree but unused; an import gives them their init (ones), so a
    later phase that turns QK-norm on starts from the identity, as a fresh model would."""
    export_hf(save_checkpoint(tmp_path / "run", LLAMA_MODEL), tmp_path / "hf", tokenizer="bytes")
    params, _ = import_hf(tmp_path / "hf")
    assert np.all(params["layers"]["q_norm"] == 1.0) and np.all(params["layers"]["k_norm"] == 1.0)


def test_one_file_under_the_shard_size_and_the_imported_model_gives_our_logits(tmp_path):
    from marin_assets.train.restore import load_model_from_checkpoint

    run = save_checkpoint(tmp_path / "run", MIXTRAL_MODEL)
    result = export_hf(run, tmp_path / "hf", tokenizer="bytes")
    assert "model.safetensors" in result["files"] and "model.safetensors.index.json" not in result["files"]
    params, config, _, _ = load_model_from_checkpoint(run)
    back, imported = import_hf(tmp_path / "hf")
    tokens = fixed_tokens(config.vocab_size)
    assert np.array_equal(our_logits(params, config, tokens), our_logits(back, imported, tokens))


def test_the_card_renders_the_lineage_and_a_bad_lineage_is_refused(tmp_path):
    run = save_checkpoint(tmp_path / "run", LLAMA_MODEL)
    lineage = {
        "run": "demo",
        "phase": "main",
        "code_version": "abc123",
        "datasets": [{"name": "fineweb-edu", "version": "v-9f3e", "tokens": 1200}],
        "tokens": 1234,
        "evals": {"bpb/web": 1.25, "copa": 0.6},
        "prediction": {"metric": "bpb/web", "predicted": 1.3, "interval": [1.2, 1.4], "frozen_at": "2026-12-01", "outcome": 1.25},
    }
    export_hf(run, tmp_path / "hf", tokenizer="bytes", lineage=lineage)
    card = (tmp_path / "hf" / "README.md").read_text()
    for text in (
        "# demo",
        "| fineweb-edu | v-9f3e | 1200 |",
        "Tokens trained on: 1234",
        "- copa: 0.6",
        "- predicted: 1.3",
        "- outcome: 1.25 (error -0.05)",
        "- within the interval: yes",
        "Byte-level",
        "`llama` layout",
    ):
        assert text in card, text
    with pytest.raises(ValueError, match=r"lineage.prediction.outcome must be a finite number") as e:
        export_hf(run, tmp_path / "hf2", lineage={"prediction": {"metric": "m", "predicted": 1.0, "outcome": float("nan")}})
    _one_line(e.value)
    with pytest.raises(ValueError, match=r"lineage has unknown key 'dataset'"):
        export_hf(run, tmp_path / "hf2", lineage={"dataset": []})
    assert not (tmp_path / "hf2").exists()  # refused before anything is written


def test_tokenizer_files_load_in_transformers_and_encode_as_training_did(tmp_path):
    from transformers import AutoTokenizer

    from marin_assets.datakit.tokenize import load_encoder

    byte_sha = load_encoder("bytes").sha256
    export_hf(save_checkpoint(tmp_path / "run", LLAMA_MODEL, tokenizers={"web": byte_sha}), tmp_path / "hf")
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert tok("héllo", add_special_tokens=False)["input_ids"] == list("héllo".encode())
    assert tok.eos_token_id == 256
    gen = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 256


def test_a_tokenizer_that_is_not_the_checkpoints_is_refused(tmp_path, monkeypatch):
    run = save_checkpoint(tmp_path / "run", LLAMA_MODEL, tokenizers={"web": "f" * 64})
    with pytest.raises(ValueError, match="trained on tokenizer ffffffffffff, not the byte tokenizer") as e:
        export_hf(run, tmp_path / "hf")
    _one_line(e.value)
    with pytest.raises(ValueError, match="'bytes' .* is not the one"):
        export_hf(run, tmp_path / "hf", tokenizer="bytes")


REFUSALS = [
    (dict(TINY_MODEL, qk_norm=False, router_gating="softmax"), "auto", "n_shared_experts"),
    (dict(MIXTRAL_MODEL, latent_dim=16), "auto", "latent_dim"),
    (dict(LLAMA_MODEL, rope_fraction=0.5), "auto", "rope_fraction"),
    (dict(MIXTRAL_MODEL, router_gating="sigmoid"), "auto", "router_gating"),
    (LLAMA_MODEL, "qwen3", "qk_norm"),
    (QWEN3_MODEL, "llama", "qk_norm"),
    (MIXTRAL_MODEL, "qwen3_moe", "qk_norm"),
    (LLAMA_MODEL, "mixtral", "n_routed_experts"),
]


@pytest.mark.parametrize(("model", "layout", "field"), REFUSALS, ids=[f"{r[2]}-{r[1]}" for r in REFUSALS])
def test_a_config_with_no_exact_counterpart_is_refused_naming_the_field(tmp_path, model, layout, field):
    run = save_checkpoint(tmp_path / "run", model)
    with pytest.raises(NotExportable, match=rf"ModelConfig\.{field}=") as e:
        export_hf(run, tmp_path / "hf", layout, tokenizer="bytes")
    _one_line(e.value)
    assert not (tmp_path / "hf").exists()


def test_a_nonzero_router_bias_is_refused_and_the_cli_says_so_in_one_line(tmp_path, capsys):
    bias = np.zeros((2, 4), np.float32)
    bias[1, 2] = 0.25
    run = save_checkpoint(tmp_path / "run", MIXTRAL_MODEL, router_bias=bias)
    assert main(["export", "hf", str(run), str(tmp_path / "hf"), "--tokenizer", "bytes"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("marin export hf: ") and "router_bias is nonzero (max |bias| 0.25" in err
    assert "\n" not in err


def test_the_cli_writes_shards_and_prints_one_json_line(tmp_path, capsys):
    run = save_checkpoint(tmp_path / "run", QWEN3_MODEL)
    assert main(["export", "hf", str(run), str(tmp_path / "hf"), "--tokenizer", "bytes", "--shard-size", "30000"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    result = json.loads(out[0])
    assert result["layout"] == "qwen3" and result["step"] == 7
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert main(["export", "hf", str(run), str(tmp_path / "hf"), "--tokenizer", "bytes"]) == 2  # not empty
    assert "is not an empty folder" in capsys.readouterr().err


def test_the_cli_holds_the_out_folders_lease_on_an_object_store_too(tmp_path, capsys):
    """On memory:// (an object store) the writer's lease lives in the out folder: it is not content, and a
    second export into the written folder is still refused."""
    from marin_assets.hf.convert import import_hf

    run = save_checkpoint(tmp_path / "run", QWEN3_MODEL)
    out = "memory://hf-cli-export/model"
    assert main(["export", "hf", str(run), out, "--tokenizer", "bytes"]) == 0, capsys.readouterr().err
    params, config = import_hf(f"hf:{out}")
    assert config.d_model == QWEN3_MODEL["d_model"]
    assert main(["export", "hf", str(run), out, "--tokenizer", "bytes"]) == 2
    assert "is not an empty folder" in capsys.readouterr().err


@pytest.fixture
def exported(tmp_path):
    export_hf(save_checkpoint(tmp_path / "run", LLAMA_MODEL), tmp_path / "hf", tokenizer="bytes")
    return tmp_path / "hf"


def _edit_config(folder, **changes):
    path = folder / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"vocab_size": 300}, r"tensor model.embed_tokens.weight has shape \[257, 32\], the config wants \[300, 32\]"),
        ({"vocab_size": 200}, r"tokenizer.json has 257 ids, more than config.json vocab_size 200"),
        ({"model_type": "gpt2"}, r"config.json model_type='gpt2' is not a supported layout"),
        ({"model_type": "qwen3"}, r"tensor model.layers.0.self_attn.q_norm.weight is missing \(layout qwen3\)"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, r"rope_scaling=.* has no counterpart"),
        ({"hidden_act": "gelu"}, r"hidden_act='gelu' has no counterpart"),
        ({"rope_theta": float("inf")}, r"rope_theta=inf is not a finite number"),
        ({"rms_norm_eps": "1e-5"}, r"rms_norm_eps='1e-5' is not a finite number"),
        ({"num_hidden_layers": 0}, r"config.json does not make a valid model: ModelConfig.n_layers"),
        ({"intermediate_size": 48}, r"mlp.gate_proj.weight has shape \[64, 32\], the config wants \[48, 32\]"),
    ],
)
def test_an_import_mismatch_is_one_line(exported, changes, message):
    _edit_config(exported, **changes)
    with pytest.raises(ImportMismatch, match=message) as e:
        import_hf(f"hf:{exported}")
    _one_line(e.value)


def test_an_import_of_a_folder_without_weights_or_config_is_one_line(tmp_path, exported):
    (exported / "model.safetensors").unlink()
    with pytest.raises(ImportMismatch, match="no model.safetensors"):
        import_hf(exported)
    with pytest.raises(ImportMismatch, match="no config.json"):
        import_hf(tmp_path)


def test_first_architecture_difference_names_the_field():
    from marin_assets.model.config import ModelConfig

    a = ModelConfig(**LLAMA_MODEL)
    assert first_architecture_difference(a, ModelConfig(**dict(LLAMA_MODEL, max_seq_len=64, lm_z_loss=0.0))) is None
    assert first_architecture_difference(a, ModelConfig(**dict(LLAMA_MODEL, norm_eps=1e-6))) == "norm_eps"
    assert first_architecture_difference(a, ModelConfig(**dict(LLAMA_MODEL, head_dim=16, d_model=48))) == "d_model"
    moe = ModelConfig(**MIXTRAL_MODEL)
    assert first_architecture_difference(moe, ModelConfig(**dict(MIXTRAL_MODEL, d_ff=7))) is None  # unused width
    assert first_architecture_difference(moe, ModelConfig(**dict(MIXTRAL_MODEL, router_gating="sigmoid"))) == "router_gating"


def test_a_hub_url_is_refused_both_ways(tmp_path):
    """fsspec's hf:// would reach the Hugging Face Hub: nothing is fetched from or pushed to one."""
    with pytest.raises(ValueError, match="a Hugging Face Hub URL; nothing is fetched") as e:
        import_hf("hf:hf://meta-llama/Llama-3.2-1B")
    _one_line(e.value)
    with pytest.raises(ValueError, match="a Hugging Face Hub URL"):
        export_hf(save_checkpoint(tmp_path / "run", LLAMA_MODEL), "hf://someone/model", tokenizer="bytes")


def test_a_bfloat16_checkpoint_imports_upcast_exactly(tmp_path, exported):
    """Most published checkpoints are bf16, which safetensors.numpy cannot read: ours decodes it."""
    import ml_dtypes
    from safetensors import serialize

    from marin_assets.hf.weights import read_safetensors
    from marin_assets.store.fsutil import filesystem

    fs, where = filesystem(str(exported))
    named = read_safetensors(fs, where, "test")
    bf16 = {k: v.astype(ml_dtypes.bfloat16) for k, v in named.items()}
    data = serialize({k: {"dtype": "bfloat16", "shape": list(v.shape), "data": v.tobytes()} for k, v in bf16.items()})
    (exported / "model.safetensors").write_bytes(data)
    params, _ = import_hf(exported)
    want = bf16["model.layers.1.self_attn.q_proj.weight"].astype(np.float32).T
    assert params["layers"]["wq"].dtype == np.float32 and np.array_equal(params["layers"]["wq"][1], want)


def test_export_and_import_through_an_fsspec_url():
    """A bucket is a URL: the export writes to it and ``hf:URL`` reads it back (memory:// stands in for gs://)."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        run = save_checkpoint(Path(tmp) / "run", MIXTRAL_MODEL)
        result = export_hf(run, "memory://hf-test/model", shard_bytes=20_000)
    assert result["tokenizer"] is None and "tokenizer.json" not in result["files"]  # none recorded, none given
    params, config = import_hf("hf:memory://hf-test/model")
    assert config.is_moe and config.router_gating == "softmax" and params["layers"]["e_gate"].shape == (2, 4, 32, 32)
