"""``export_hf``: a train checkpoint as an HF model folder; ``import_hf``: an HF model folder as our params."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from marin_assets.datakit.tokenize import BYTES, Encoder, load_encoder, tokenizer_text
from marin_assets.hf import card
from marin_assets.hf.layouts import (
    ImportMismatch,
    auto_layout,
    check_exportable,
    check_router_bias,
    hf_config,
    model_config,
)
from marin_assets.hf.weights import DEFAULT_SHARD_BYTES, from_hf, read_safetensors, to_hf, write_safetensors
from marin_assets.model.config import ModelConfig
from marin_assets.model.transformer import init_params
from marin_assets.store.fsutil import filesystem, join, read_json, write_bytes_atomic
from marin_assets.train.checkpoints.work_dir import LEASE_ENTRY
from marin_assets.train.restore import HF_PREFIX, load_model_from_checkpoint

_EOS = "<|endoftext|>"


def strip_hf_prefix(path: str | Path) -> str:
    """The folder or URL an ``hf:PATH`` names; a Hugging Face Hub URL (``hf://``, which fsspec would fetch
    from the hub) is refused: models come in and go out through folders and buckets we name."""
    text = str(path)
    if not text.startswith("hf://"):  # hf:PATH, not a hub URL
        text = text[len(HF_PREFIX) :] if text.startswith(HF_PREFIX) else text
    if text.startswith("hf://"):
        raise ValueError(
            f"{path}: a Hugging Face Hub URL; nothing is fetched from or pushed to a hub here: "
            f"download the model to a folder or bucket and name that"
        )
    return text


def export_hf(
    checkpoint: str | Path,
    out: str | Path,
    layout: str = "auto",
    *,
    tokenizer: str | None = None,
    lineage: Mapping[str, Any] | None = None,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> dict:
    """Write ``checkpoint`` (a checkpoint folder or a run's out dir) to ``out`` as an HF model folder:
    config.json, model.safetensors (shards + index past ``shard_bytes``), generation_config.json, the
    tokenizer files and README.md. ``tokenizer``: the data's tokenizer (a name or tokenizer.json, checked
    against the digests the checkpoint recorded); None takes the byte tokenizer when that is what the
    checkpoint recorded. ``lineage``: the model card's lineage (``card`` module's schema).

    Refused before anything is written (``NotExportable`` / ValueError, one line): a config or router bias
    with no exact counterpart in ``layout``, a tokenizer that is not the checkpoint's, a non-empty ``out``.
    config.json is written last: an interrupted export is not a loadable model. Returns a summary dict."""
    card.check_lineage(lineage)
    out = strip_hf_prefix(out)
    if not isinstance(shard_bytes, int) or isinstance(shard_bytes, bool) or shard_bytes < 1:
        raise ValueError(f"shard size must be a positive number of bytes, got {shard_bytes!r}")
    fs, where = filesystem(str(out))
    # the object-store lease of the writer (marin export hf holds one: train/checkpoints/work_dir.py) is not content
    if fs.exists(where) and (
        not fs.isdir(where) or [p for p in fs.ls(where, detail=False) if p.rstrip("/").rsplit("/", 1)[-1] != LEASE_ENTRY]
    ):
        raise ValueError(f"export to {out}: it exists and is not an empty folder; give a new one")
    params, config, bias, meta = load_model_from_checkpoint(checkpoint)
    source = f"checkpoint {checkpoint} (step {meta['step']})"
    layout = auto_layout(config) if layout == "auto" else layout
    check_exportable(config, layout, source)
    check_router_bias(bias, source, layout)
    tok_text, tok_note, eos_id = _tokenizer(tokenizer, meta, config, source)

    fs.makedirs(where, exist_ok=True)
    named = to_hf(params, config, layout)
    files = write_safetensors(fs, where, named, shard_bytes)
    if tok_text is not None:
        files += _write_tokenizer(fs, where, tok_text, eos_id, config)
    _write_json(
        fs,
        join(where, "generation_config.json"),
        {"bos_token_id": eos_id, "eos_token_id": eos_id, "max_length": config.max_seq_len, "do_sample": False},
    )
    checkpoint_info = {
        "source": str(checkpoint),
        "step": meta.get("step"),
        "tokens": meta.get("tokens"),
        "phase": meta.get("phase"),
    }
    readme = card.render(
        layout=layout, model=_model_summary(config, named), checkpoint=checkpoint_info, tokenizer=tok_note, lineage=lineage
    )
    write_bytes_atomic(fs, join(where, "README.md"), readme.encode("utf-8"))
    _write_json(fs, join(where, "config.json"), hf_config(config, layout, eos_id))
    files += ["generation_config.json", "README.md", "config.json"]
    return {
        "out": str(out),
        "layout": layout,
        "step": meta.get("step"),
        "files": files,
        "parameters": int(sum(a.size for a in named.values())),
        "tokenizer": tokenizer if tok_text is None or tokenizer else "bytes",
    }


def _write_json(fs, path: str, value: Any) -> None:
    write_bytes_atomic(fs, path, (json.dumps(value, indent=2) + "\n").encode("utf-8"))


def _tokenizer(spec: str | None, meta: Mapping[str, Any], config: ModelConfig, source: str) -> tuple[str | None, str, int | None]:
    """(tokenizer.json text or None, what the card says of it, EOS id) for the export."""
    recorded = set((meta.get("data_tokenizers") or {}).values())
    if spec is None:
        if not recorded:
            return (
                None,
                (
                    "The checkpoint records no tokenizer and none was given, so this folder has no tokenizer "
                    "files; use the one the training data was tokenized with."
                ),
                None,
            )
        spec = BYTES
        if load_encoder(spec).sha256 not in recorded:
            raise ValueError(
                f"{source} was trained on tokenizer {sorted(recorded)[0][:12]}, not the byte tokenizer: "
                f"give the tokenizer (--tokenizer NAME or a tokenizer.json)"
            )
    encoder = load_encoder(spec)
    if recorded and encoder.sha256 not in recorded:
        raise ValueError(
            f"tokenizer {spec!r} ({encoder.sha256[:12]}) is not the one {source} was trained on "
            f"({', '.join(sorted(d[:12] for d in recorded))})"
        )
    if encoder.vocab_size > config.vocab_size:
        raise ValueError(f"tokenizer {spec!r} has {encoder.vocab_size} ids, more than the model's vocab_size {config.vocab_size}")
    if encoder.is_bytes:
        note = (
            "Byte-level: ids 0-255 are the UTF-8 bytes, 256 is <|endoftext|> (EOS, also the start of every "
            "context). tokenizer.json is a BPE with no merges over the 256 byte symbols, which HF tokenizers "
            "loads; it encodes text to the same ids as training did."
        )
    else:
        note = f"The training data's tokenizer.json ({spec}, sha256 {encoder.sha256[:12]}), {encoder.vocab_size} ids."
    return tokenizer_text(spec), note, encoder.eos_id


def _write_tokenizer(fs, where: str, text: str, eos_id: int | None, config: ModelConfig) -> list[str]:
    write_bytes_atomic(fs, join(where, "tokenizer.json"), text.encode("utf-8"))
    special = {"eos_token": _EOS, "bos_token": _EOS} if eos_id is not None else {}
    _write_json(
        fs,
        join(where, "tokenizer_config.json"),
        {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": config.max_seq_len, **special},
    )
    _write_json(fs, join(where, "special_tokens_map.json"), special)
    return ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]


def _model_summary(config: ModelConfig, named: Mapping[str, Any]) -> dict[str, Any]:
    summary = {
        "parameters": f"{sum(a.size for a in named.values()):,}",
        "layers": config.n_layers,
        "d_model": config.d_model,
        "heads": f"{config.n_heads} (kv {config.n_kv_heads}, head_dim {config.resolved_head_dim})",
        "vocab_size": config.vocab_size,
        "max_seq_len": config.max_seq_len,
        "qk_norm": config.qk_norm,
        "rope_theta": config.rope_theta,
        "rms_norm_eps": config.norm_eps,
    }
    if config.is_moe:
        summary["experts"] = (
            f"{config.n_routed_experts} routed (top-{config.top_k}, width {config.expert_d_ff}, {config.router_gating} gating)"
        )
    else:
        summary["d_ff"] = config.d_ff
    return summary


def import_hf(path: str | Path) -> tuple[dict, ModelConfig]:
    """(params as fp32 numpy in our tree, ModelConfig) of an HF model folder: a local path or fsspec URL,
    ``hf:`` prefix allowed. Reads config.json and the safetensors weights (sharded too); nothing is fetched
    from a hub. ``ImportMismatch`` (one line) for a layout, shape or vocabulary we cannot carry exactly."""
    import jax

    where = strip_hf_prefix(path)
    fs, folder = filesystem(where)
    try:
        hf = read_json(fs, join(folder, "config.json"))
    except ValueError as e:
        raise ImportMismatch(f"{where}: config.json is not JSON ({e})") from None
    if not isinstance(hf, dict):
        raise ImportMismatch(
            f"{where}: no config.json (an HF model folder has one)"
            if hf is None
            else f"{where}: config.json is not a JSON object"
        )
    config, layout = model_config(hf, where)
    named = read_safetensors(fs, folder, where)
    if hf.get("tie_word_embeddings") and "lm_head.weight" not in named and "model.embed_tokens.weight" in named:
        named["lm_head.weight"] = named["model.embed_tokens.weight"]  # tied: ours keeps an untied copy
    _check_tokenizer_vocab(fs, folder, config, where)
    template = jax.eval_shape(lambda: init_params(config, jax.random.PRNGKey(0)))
    return from_hf(named, config, layout, template, where), config


def _check_tokenizer_vocab(fs, folder: str, config: ModelConfig, where: str) -> None:
    """A tokenizer.json with ids past the embedding would index rows that do not exist."""
    path = join(folder, "tokenizer.json")
    if not fs.exists(path):
        return
    with fs.open(path, "rb") as f:
        vocab = Encoder(f.read().decode("utf-8"), where=f"{where}/tokenizer.json").vocab_size
    if vocab > config.vocab_size:
        raise ImportMismatch(f"{where}: tokenizer.json has {vocab} ids, more than config.json vocab_size {config.vocab_size}")


def hf_tokenizer_sha256(path: str | Path) -> str | None:
    """The identity (``Encoder.sha256``) of an HF folder's tokenizer.json, None when it has none."""
    where = strip_hf_prefix(path)
    fs, folder = filesystem(where)
    if not fs.exists(join(folder, "tokenizer.json")):
        return None
    return load_encoder(join(where, "tokenizer.json")).sha256


def warm_start_weights(source: str) -> tuple[dict, ModelConfig, str | None]:
    """What a warm start from an HF model folder (``--warm-start hf:PATH``) reads: (params as ``import_hf``
    gives them, their ModelConfig, the folder's tokenizer identity or None). ``train`` knows ``hf:PATH`` only
    as a string and takes this as its ``read_weights`` (hf sits above train: docs/layers.md)."""
    params, config = import_hf(source)
    return params, config, hf_tokenizer_sha256(source)
