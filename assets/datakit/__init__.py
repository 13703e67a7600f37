"""DataKit as assets: the one data pipeline, sharded. Every stage runs per shard, the global
steps are reduces over hash buckets / LSH bands, and per-shard removal lists whose digests
version what follows keep an unchanged shard cached when another arrives.

    sources/<name> -> shards/index -> normalized -> quality -> exact_map -> exact_reduce[bucket]
    -> exact_removals -> filtered_exact -> fuzzy_map -> fuzzy_candidates[band] -> fuzzy_edges
    -> fuzzy_removals -> decontam -> final -> tokenized -> datasets/<source> -> mixture
    datasets/shakespeare -> datasets/shakespeare_chat (the plays' dialogue as conversations) -> mixture

with the fixed inputs quality_model, eval_ngrams and tokenizer (inputs.py). The code location
builds it over the demo's pinned sources and the watched user directory
(``code_location_datakit``); ``marin datakit run`` over the user's --input paths (run.py).
"""

from __future__ import annotations

from collections.abc import Mapping

import dagster as dg

from assets.datakit import exact, final, fuzzy, normalized
from assets.datakit.chat import CHAT_SOURCE, chat_assets
from assets.datakit.datasets import contamination_check, dataset_asset, mixture_asset
from assets.datakit.index import make_index
from assets.datakit.inputs import labelled_quality_model, packaged_eval_ngrams, tokenizer_asset
from assets.datakit.sources import pinned_source, watched_source
from assets.partitions import datakit_shards
from marin_assets.datakit.sources import SOURCES, WEB_SOURCES
from marin_assets.datakit.tokenize import BYTES


def make_shard_steps(shards: dg.DynamicPartitionsDefinition) -> list[dg.AssetsDefinition]:
    """Everything after the index that is per shard or per bucket/band: the same for every
    corpus, partitioned by the graph's own ``shards`` (a `marin datakit run` recorded in an
    instance must not share the code location's shard partitions)."""
    return [*normalized.steps(shards), *exact.steps(shards), *fuzzy.steps(shards), *final.steps(shards)]


# The tiny demo models train on bytes: no tokenizer to fit, and an LM head small enough that an
# IsoFLOP ladder of CPU-sized models has interior optima (user corpora default to OLMo's BPE).
CODE_LOCATION_TOKENIZER = BYTES
WATCHED_SOURCE = "user"


def make_datakit_graph(
    sources: Mapping[str, str], shards: dg.DynamicPartitionsDefinition = datakit_shards
) -> list[dg.AssetsDefinition]:
    """The sharded graph over `sources` ({source name: asset key of its raw files}): the index,
    every shard step and one dataset per source (the fixed inputs come from the caller)."""
    return [make_index(sources, shards), *make_shard_steps(shards), *[dataset_asset(name) for name in sources]]


def code_location_datakit() -> tuple[list[dg.AssetsDefinition], list[dg.AssetChecksDefinition]]:
    """The code location's DataKit: the demo's pinned sources, a crawl (sources/npm_docs: a WARC
    of npm's documentation pages) and sources/user (the files of $MARIN_USER_DATA_DIR, which the
    new_user_shards sensor feeds), the fixed inputs, the sharded graph, a dataset per source, the
    plays' chat dataset and the mixture (the crawl's dataset is in it at weight 0, as the chat
    dataset is, until a phase's own mix names it: the demo's phases budget the three demo sources);
    a blocking check per dataset."""
    sources = {name: f"sources/{name}" for name in [*SOURCES, *WEB_SOURCES, WATCHED_SOURCE]}
    raw = [*(pinned_source(name) for name in [*SOURCES, *WEB_SOURCES]), watched_source(WATCHED_SOURCE)]
    inputs = [
        labelled_quality_model({name: spec.quality for name, spec in SOURCES.items()}),
        packaged_eval_ngrams,
        tokenizer_asset(CODE_LOCATION_TOKENIZER),
    ]
    trained = [*sources, CHAT_SOURCE]  # the chat dataset is made from the shakespeare dataset's documents
    assets = [*raw, *inputs, *make_datakit_graph(sources), *chat_assets(), mixture_asset(trained)]
    return assets, [contamination_check(name) for name in trained]


__all__ = ["CODE_LOCATION_TOKENIZER", "WATCHED_SOURCE", "code_location_datakit", "make_datakit_graph", "make_shard_steps"]
