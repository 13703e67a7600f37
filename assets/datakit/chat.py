"""datasets/shakespeare_chat: the plays' dialogue as chat conversations, for an SFT branch.

    datasets/shakespeare (its final documents and held-out ids) + tokenizer -> datasets/shakespeare_chat -> mixture

The conversations come from the documents the shakespeare dataset keeps after dedup and decontamination
(marin_assets/datakit/chat.py says how), in the same split: a play the main run holds out is held out here.
The dataset is an index over one cache with two fields, ``input_ids`` and ``loss_mask``; the trainer counts
the loss on the assistant replies only. It joins the mixture at weight 0: a phase or branch whose own mix
names it trains on it (plan.py BranchSpec.mixture).
"""

from __future__ import annotations

import dagster as dg

from assets.datakit.common import GROUP
from assets.datakit.configs import ChatDatasetConfig
from assets.datakit.datasets import dataset_key
from assets.datakit.inputs import TOKENIZER
from marin_assets.datakit.chat import CONVERSATIONS, FIELDS, ChatConfig, iter_plays, tokenize_chat
from marin_assets.datakit.datasets import Dataset, ShardCache, held_out_ids, read_dataset, write_dataset
from marin_assets.datakit.shards import join
from marin_assets.orchestration import StageContext, versioned_asset
from marin_assets.orchestration.automation import rerun_on_change
from marin_assets.orchestration.knob_configs import library_config
from marin_assets.store import ArtifactRef

CHAT_SOURCE = "shakespeare_chat"
PLAYS_SOURCE = "shakespeare"


@versioned_asset(
    key=dataset_key(CHAT_SOURCE),
    code_version="1",
    config_cls=ChatDatasetConfig,
    group_name=GROUP,
    ins={"plays": dataset_key(PLAYS_SOURCE), "tok": TOKENIZER},
    automation_condition=rerun_on_change(),
    description="The plays' dialogue as user/assistant conversations; loss on the replies only.",
)
def shakespeare_chat(ctx: StageContext, config: ChatDatasetConfig, plays: ArtifactRef, tok: ArtifactRef):
    source = read_dataset(plays.data_path)
    documents = [s.documents for s in source.shards]
    if not all(documents):
        raise ValueError(
            f"{dataset_key(PLAYS_SOURCE)}: its index names no final documents for "
            f"{sum(not d for d in documents)} of {len(documents)} shards (rebuild it)"
        )
    counts = tokenize_chat(
        iter_plays(documents, held_out_ids(source)),
        join(tok.data_path, "tokenizer.json"),
        ctx.out_dir,
        library_config(config, ChatConfig),
    )
    train, held = counts["train"], counts["validation"]
    if train["conversations"] == 0:
        raise ValueError(
            f"{dataset_key(CHAT_SOURCE)}: no conversation in the {counts['plays']} documents of "
            f"{dataset_key(PLAYS_SOURCE)} ({counts['plays_without_dialogue']} without dialogue)"
        )
    shard = ShardCache(
        CHAT_SOURCE,
        ctx.version,
        ctx.out_dir,
        train["tokens"],
        held["tokens"],
        train["conversations"],
        held["conversations"],
        documents=join(ctx.out_dir, CONVERSATIONS),
    )
    write_dataset(Dataset(CHAT_SOURCE, (shard,), counts["tokenizer"], FIELDS), ctx.out_dir)
    ctx.log(
        f"{dataset_key(CHAT_SOURCE)}: {train['conversations']:,} train and {held['conversations']:,} held-out "
        f"conversations from {counts['plays']} documents; {train['trained_tokens']:,} of {train['tokens']:,} "
        f"train tokens are reply targets; {counts['speeches_dropped_unanswered']} unanswered speeches dropped"
    )
    return {
        "plays": counts["plays"],
        "plays_without_dialogue": counts["plays_without_dialogue"],
        "speeches": counts["speeches"],
        "speeches_dropped_unanswered": counts["speeches_dropped_unanswered"],
        "train_docs": train["conversations"],
        "validation_docs": held["conversations"],
        "train_tokens": train["tokens"],
        "validation_tokens": held["tokens"],
        "train_target_tokens": train["trained_tokens"],
        "vocab_size": counts["tokenizer"]["vocab_size"],
    }


def chat_assets() -> list[dg.AssetsDefinition]:
    return [shakespeare_chat]
