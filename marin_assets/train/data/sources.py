"""The caches a phase trains on: opened, checked against the model, named by their tokenizers, and batched."""

from __future__ import annotations

import os
from collections.abc import Mapping

from marin_assets.train.config import TrainConfig
from marin_assets.train.data.batches import MixedLoader
from marin_assets.train.data.token_caches import SourceData, open_source


def open_sources(cache_dirs: Mapping[str, str | os.PathLike] | str | os.PathLike) -> dict[str, SourceData]:
    """{source: SourceData} from dataset indexes, DataKit cache folders or single splits (a
    single path is named "train"); a missing or unfinished cache fails here, before compute."""
    if not isinstance(cache_dirs, Mapping):
        cache_dirs = {"train": cache_dirs}
    return {name: open_source(path) for name, path in cache_dirs.items()}


def train_loader(config: TrainConfig, sources: Mapping[str, SourceData]) -> MixedLoader:
    """The batches of ``config``'s mixture over the sources' train splits (with segment ids under
    ``document_masking``, read from each source's EOS id)."""
    return MixedLoader(
        {name: s.train for name, s in sources.items()},
        config.seq_len,
        config.batch_size,
        config.mixture,
        config.data_seed,
        vocab_size=config.model.vocab_size,
        block_tokens=config.data_block_tokens,
        eos_ids=eos_ids(sources) if config.document_masking else None,
    )


def eos_ids(sources: Mapping[str, SourceData]) -> dict[str, int]:
    """{source: the EOS id ending its documents}; document masking cannot guess a source's boundaries."""
    unknown = sorted(name for name, s in sources.items() if s.eos_id is None)
    if unknown:
        where = ", ".join(f"{name!r} ({sources[name].where})" for name in unknown)
        raise ValueError(
            f"document_masking: no EOS id recorded for source(s) {where} (a DataKit cache or dataset "
            f"index records its tokenizer's); turn document_masking off for them"
        )
    return {name: s.eos_id for name, s in sources.items() if s.eos_id is not None}


def check_vocab(config: TrainConfig, sources: Mapping[str, SourceData]) -> None:
    """A model smaller than the cache's tokenizer would see every batch as corrupt."""
    for name, source in sorted(sources.items()):
        vocab = source.vocab_size
        if vocab is not None and vocab > config.model.vocab_size:
            raise ValueError(
                f"model.vocab_size is {config.model.vocab_size} but cache {name!r} ({source.where}) was tokenized with a "
                f"vocabulary of {vocab}: every batch would hold ids the model cannot embed; set model.vocab_size "
                f">= {vocab} (or leave it unset to take it from the cache)"
            )


def data_identity(sources: Mapping[str, SourceData]) -> dict[str, str]:
    """{source: sha256 of the tokenizer its tokens came from}, for the sources that say."""
    return {name: s.tokenizer_sha256 for name, s in sorted(sources.items()) if s.tokenizer_sha256}
