"""Levanter (code we did not write) as the reference for the HF layouts: load a folder with its
HFCheckpointConverter and model, save a random init, and run its forward. Importing levanter takes ~10 s,
so only the slow tests import this module."""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np

LEVANTER_CONFIGS = {
    "llama": "levanter.models.llama:LlamaConfig",
    "qwen3": "levanter.models.qwen:Qwen3Config",
    "mixtral": "levanter.models.mixtral:MixtralConfig",
}  # Levanter has no Qwen3-MoE
HF_CONFIGS = {"llama": "LlamaConfig", "qwen3": "Qwen3Config", "mixtral": "MixtralConfig"}


def config_class(layout: str):
    import importlib

    module, name = LEVANTER_CONFIGS[layout].split(":")
    return getattr(importlib.import_module(module), name)


@contextlib.contextmanager
def one_device_mesh():
    """Mixtral's router runs under shard_map, which needs a mesh even on one CPU device."""
    import haliax as hax
    import jax
    from jax.sharding import Mesh

    with hax.partitioning.set_mesh(Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))):
        yield


def converter(layout: str, reference: Path, tokenizer_json: Path | None = None, vocab_size: int = 257):
    """The layout's HFCheckpointConverter with a local reference folder (holding a config.json) and a local
    tokenizer: nothing fetched from a hub."""
    from transformers import PreTrainedTokenizerFast

    from marin_assets.datakit.tokenize import byte_tokenizer_json

    if tokenizer_json is None:
        tok = PreTrainedTokenizerFast(tokenizer_object=_tokenizer_object(byte_tokenizer_json()), eos_token="<|endoftext|>")
    else:
        tok = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json), eos_token="<|endoftext|>")
    assert len(tok) == vocab_size
    import transformers
    from levanter.compat.hf_checkpoints import HFCheckpointConverter

    # Built here, not by the config's hf_checkpoint_converter(): that one reads its reference checkpoint's
    # tokenizer from the hub.
    return HFCheckpointConverter(
        config_class(layout),
        reference_checkpoint=str(reference),
        HfConfigClass=getattr(transformers, HF_CONFIGS[layout]),
        tokenizer=tok,
    )


def _tokenizer_object(text: str):
    from tokenizers import Tokenizer

    return Tokenizer.from_str(text)


def load(layout: str, folder: Path):
    """Levanter's model of an HF folder, in fp32."""
    import jax.numpy as jnp

    conv = converter(layout, folder, folder / "tokenizer.json")
    config = conv.config_from_hf_checkpoint(str(folder))
    with one_device_mesh():
        return conv.load_pretrained(config.model_type, ref=str(folder), config=config, dtype=jnp.float32)


def logits(model, tokens: np.ndarray) -> np.ndarray:
    """Levanter's forward on [batch, seq] tokens -> [batch, seq, vocab] fp32 logits."""
    import haliax as hax
    import jax.numpy as jnp
    from levanter.layers.attention import AttentionMask

    Batch, Pos = hax.Axis("batch", tokens.shape[0]), hax.Axis("position", tokens.shape[1])
    with one_device_mesh():
        out = model(hax.named(jnp.asarray(tokens), (Batch, Pos)), attn_mask=AttentionMask.causal())
        return np.asarray(out.rearrange((Batch, Pos, out.axes[-1])).array, np.float32)


def random_init_saved(layout: str, folder: Path, **config_fields):
    """A Levanter random init of ``layout`` (norm gains drawn off 1, matrices x2 so logits are far from
    uniform), saved by Levanter's converter as an HF folder; returns the Levanter model."""
    import haliax as hax
    import jax
    import jax.numpy as jnp

    config = config_class(layout)(**config_fields)
    reference = folder.parent / f"{folder.name}-reference"  # save_pretrained copies a few keys from its config.json
    config.to_hf_config(257).save_pretrained(str(reference))
    conv = converter(layout, reference)
    Vocab = hax.Axis("vocab", 257)
    model = config.model_type.init(Vocab, config, key=jax.random.PRNGKey(0))
    keys = iter(jax.random.split(jax.random.PRNGKey(1), 256))

    def perturb(path, leaf):
        if not isinstance(leaf, jax.Array) or not jnp.issubdtype(leaf.dtype, jnp.floating):
            return leaf
        if "norm" in jax.tree_util.keystr(path):
            return leaf + 0.3 * jax.random.uniform(next(keys), leaf.shape, leaf.dtype, -1.0, 1.0)
        return leaf * 2.0

    model = jax.tree_util.tree_map_with_path(perturb, model)
    with one_device_mesh():
        conv.save_pretrained(model, str(folder), save_tokenizer=True, save_reference_code=False)
    return model
