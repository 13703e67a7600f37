"""Hugging Face weights both ways: ``export_hf`` writes a train checkpoint as an HF model folder (Llama,
Qwen3, Mixtral or Qwen3-MoE layout), ``import_hf`` reads one into our parameters. Only exact mappings:
anything else is refused in one line naming the field (``layouts``). ``warm_start_weights`` is what a
``--warm-start hf:PATH`` reads: the callers of ``train`` hand it over as ``read_weights``."""

from marin_assets.hf.convert import (
    HF_PREFIX,
    export_hf,
    hf_tokenizer_sha256,
    import_hf,
    strip_hf_prefix,
    warm_start_weights,
)
from marin_assets.hf.layouts import LAYOUTS, ImportMismatch, NotExportable
from marin_assets.model.config import first_architecture_difference

__all__ = [
    "HF_PREFIX",
    "LAYOUTS",
    "ImportMismatch",
    "NotExportable",
    "export_hf",
    "first_architecture_difference",
    "hf_tokenizer_sha256",
    "import_hf",
    "strip_hf_prefix",
    "warm_start_weights",
]
