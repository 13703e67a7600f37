"""Chat-formatted training data: the dialogue of the Shakespeare plays as user/assistant conversations.

An SFT branch trains on conversations and counts the loss on the assistant's replies only. No chat
dataset ships in a package we may install, so we make one from the packaged plays: within a scene,
each run of ``turns`` consecutive speeches is a conversation whose speeches alternate user and
assistant (the reply is the next speaker's line; the speakers' names are not part of it). It is
rendered with a Zephyr-style template (HuggingFace's ``HuggingFaceH4/zephyr-7b-beta`` chat format):

    <|user|>\\n{speech}\\n<|assistant|>\\n{reply}\\n ... <EOS>

and tokenized into a Levanter cache with two aligned fields, ``input_ids`` and ``loss_mask`` (1 on
the tokens of every assistant reply and the newline that ends it, and on the final EOS when the last
turn is the assistant's), as Levanter's chat processor stores ``assistant_masks`` beside the ids.

Two layouts occur in the packaged texts: the Gutenberg modern-spelling plays put the speaker's name
alone on a line (``Hor.``) above the speech; the First Folio transcriptions indent it before the
first line (``   Hor. And then it started``). Everything before a play's first act or scene heading
(the title page, the persons of the play) is skipped (a Folio play without headings is one scene), as
are stage directions (``[Exit Ghost.]``, ``Enter ...``, ``Exeunt``). A document with no dialogue (a
sonnet, a narrative poem) yields none and is counted; a scene's last speech without a reply is counted as
dropped; nothing else is left out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from marin_assets.datakit.levanter_cache import CacheWriter
from marin_assets.datakit.shards import join, read_table, reset_dir, write_json, write_table
from marin_assets.datakit.tokenize import SPLITS, VALIDATION_DOCS, load_encoder
from marin_assets.knobs import knob
from marin_assets.numeric_checks import check_int

USER, ASSISTANT = "user", "assistant"
ROLE_MARKS = {USER: "<|user|>\n", ASSISTANT: "<|assistant|>\n"}
TURN_END = "\n"
FIELDS = ("input_ids", "loss_mask")

# "Ham." / "First Clown." / "THESEUS" (a name in capitals may go without its full stop)
_MODERN_SPEAKER = re.compile(r"^([A-Z][A-Za-z'\-]*(?: [A-Za-z'\-]+){0,3})\.$|^([A-Z][A-Z'\-]+(?: [A-Z'\-]+){0,3})$")
_FOLIO_SPEAKER = re.compile(r"^ {2,4}([A-Z][A-Za-z'\-]*(?: [A-Z][A-Za-z'\-]*){0,2})\. +(\S.*)$")  # "   Hor. And then"
_HEADING = re.compile(r"^\s*(?:ACT|Act|SCENE|Scene|Actus|Scena|Scoena|Scaena)\b[^a-z]*")
_STAGE = re.compile(r"^\s*(?:\[.*\]?|(?:Enter|Exit|Exeunt|Manet|Flourish|Alarum|Sennet)\b.*)$")


@dataclasses.dataclass(frozen=True)
class Speech:
    speaker: str
    text: str


@dataclasses.dataclass(frozen=True)
class Conversation:
    """``messages``: (role, content) pairs, user first, alternating; ``id`` names the play, scene and place."""

    id: str
    messages: tuple[tuple[str, str], ...]


@dataclasses.dataclass(frozen=True)
class ChatConfig:
    turns: int = knob(4, help="speeches per conversation (alternating user, assistant; at least 2)")

    def __post_init__(self) -> None:
        check_int("ChatConfig.turns", self.turns, 2)


def _is_heading(line: str) -> bool:
    return bool(_HEADING.match(line)) and len(line.strip()) < 60


def scenes(text: str) -> list[list[Speech]]:
    """The speeches of a play, scene by scene, in order (either layout); [] for a text without dialogue."""
    out: list[list[Speech]] = []
    speaker, lines, scene = None, [], None

    def close_speech() -> None:
        nonlocal speaker, lines
        body = "\n".join(line.strip() for line in lines if line.strip())
        if speaker is not None and body and scene is not None:
            scene.append(Speech(speaker, body))
        speaker, lines = None, []

    previous_blank = True
    for line in text.splitlines():
        if _is_heading(line):
            close_speech()
            scene = []
            out.append(scene)
        elif _STAGE.match(line):
            pass
        elif (m := _FOLIO_SPEAKER.match(line)) is not None:
            close_speech()
            if scene is None:  # a Folio play without act or scene headings (Timon): one scene
                scene = []
                out.append(scene)
            speaker, lines = m.group(1), [m.group(2)]
        elif scene is None:
            pass  # the title page and the persons of the play
        elif previous_blank and (m := _MODERN_SPEAKER.match(line.strip())) is not None and line == line.lstrip():
            close_speech()
            speaker = m.group(1) or m.group(2)
        elif speaker is not None:
            lines.append(line)  # the speech goes on (a blank line or a stage direction does not end it)
        previous_blank = not line.strip()
    close_speech()
    return [s for s in out if s]


def conversations(doc_id: str, text: str, config: ChatConfig) -> tuple[list[Conversation], int]:
    """(the play's conversations, speeches dropped: a scene's last speech that no one answers)."""
    convs, dropped = [], 0
    for n, scene in enumerate(scenes(text)):
        for start in range(0, len(scene), config.turns):
            chunk = scene[start : start + config.turns]
            if len(chunk) < 2:
                dropped += len(chunk)
                continue
            roles = [USER if i % 2 == 0 else ASSISTANT for i in range(len(chunk))]
            convs.append(
                Conversation(
                    f"{doc_id}/scene{n:03d}/{start:05d}", tuple((role, s.text) for role, s in zip(roles, chunk, strict=True))
                )
            )
    return convs, dropped


def render(conv: Conversation) -> list[tuple[str, bool]]:
    """The conversation's text in the template, as (piece, trained) pieces: an assistant reply and the
    newline that ends it are trained, the role marks and the user's speech are not."""
    pieces = []
    for role, content in conv.messages:
        pieces += [(ROLE_MARKS[role], False), (content + TURN_END, role == ASSISTANT)]
    return pieces


def encode_conversation(conv: Conversation, encoder) -> tuple[list[int], list[int]]:
    """(ids, loss mask) of a conversation: each piece encoded on its own (so the mask follows the pieces
    exactly; with a byte tokenizer the ids equal the whole text's), then EOS, trained when the assistant
    spoke last."""
    ids: list[int] = []
    mask: list[int] = []
    for piece, trained in render(conv):
        encoded = encoder.encode(piece)
        ids += encoded
        mask += [int(trained)] * len(encoded)
    ids.append(encoder.eos_id)
    mask.append(int(conv.messages[-1][0] == ASSISTANT))
    return ids, mask


def text_of(conv: Conversation) -> str:
    return "".join(piece for piece, _ in render(conv))


def _write(writer, rows: Sequence[tuple[list[int], list[int]]], counts: dict) -> None:
    """Append ``rows`` ((ids, mask) per conversation) to a split's cache; add them to its ``counts``."""
    import numpy as np

    if not rows:
        return
    ids = np.concatenate([np.asarray(ids, np.int32) for ids, _ in rows])
    mask = np.concatenate([np.asarray(mask, np.int32) for _, mask in rows])
    writer.write_fields({"input_ids": ids, "loss_mask": mask}, np.cumsum([len(ids) for ids, _ in rows], dtype=np.int64))
    counts["conversations"] += len(rows)
    counts["tokens"] += int(ids.size)
    counts["trained_tokens"] += int(mask.sum())


def tokenize_chat(plays: Iterable[tuple[str, str, bool]], tokenizer: str, out_dir: str, config: ChatConfig) -> dict:
    """Conversations of ``plays`` ((doc id, text, held out)) into out_dir/{train,validation} (fields
    ``input_ids`` and ``loss_mask``) and out_dir/conversations.parquet (id, split, rendered text: what the
    contamination scan and a reader see). A held-out play's conversations are held out. Returns the counts:
    plays in = with dialogue + without; speeches = in conversations + dropped (unanswered)."""
    import pyarrow as pa

    encoder = load_encoder(tokenizer)
    if encoder.eos_id is None:
        raise ValueError(f"tokenizer {tokenizer} has no EOS token (conversations are separated by it)")
    table: dict[str, list] = {"id": [], "split": [], "text": []}
    counts: dict[str, Any] = {"plays": 0, "plays_without_dialogue": 0, "speeches": 0, "speeches_dropped_unanswered": 0}
    counts |= {split: {"conversations": 0, "tokens": 0, "trained_tokens": 0} for split in SPLITS}
    for split in SPLITS:
        reset_dir(join(out_dir, split))
    # Each play's conversations go to the caches as it is read (memory: one play); a cache gets its ledger
    # (is_finished) only when every play made it in.
    with contextlib.ExitStack() as stack:
        writers = {split: stack.enter_context(CacheWriter(join(out_dir, split), FIELDS)) for split in SPLITS}
        for doc_id, text, held in plays:
            convs, dropped = conversations(doc_id, text, config)
            counts["plays"] += 1
            counts["plays_without_dialogue"] += not convs and not dropped
            counts["speeches"] += dropped + sum(len(c.messages) for c in convs)
            counts["speeches_dropped_unanswered"] += dropped
            split = "validation" if held else "train"
            _write(writers[split], [encode_conversation(conv, encoder) for conv in convs], counts[split])
            table["id"] += [conv.id for conv in convs]
            table["split"] += [split] * len(convs)
            table["text"] += [text_of(conv) for conv in convs]
    write_table(
        pa.table({k: pa.array(v, pa.large_string() if k == "text" else pa.string()) for k, v in table.items()}),
        join(out_dir, CONVERSATIONS),
    )
    held = [i for i, split in enumerate(table["split"]) if split == "validation"]  # what bits-per-byte evals read
    write_table(
        pa.table(
            {
                "id": pa.array([table["id"][i] for i in held], pa.string()),
                "text": pa.array([table["text"][i] for i in held], pa.large_string()),
            }
        ),
        join(out_dir, VALIDATION_DOCS),
    )
    counts["tokenizer"] = {"sha256": encoder.sha256, "vocab_size": encoder.vocab_size, "eos_id": encoder.eos_id}
    write_json(counts, join(out_dir, "stats.json"))
    return counts


CONVERSATIONS = "conversations.parquet"


def iter_plays(documents: Sequence[str], held_out_ids: Iterable[str]) -> Iterator[tuple[str, str, bool]]:
    """(id, text, held out) of every document in the ``documents`` Parquet files (columns id, text)."""
    held = set(held_out_ids)
    for path in documents:
        table = read_table(path, ["id", "text"])
        for doc_id, text in zip(table.column("id").to_pylist(), table.column("text").to_pylist(), strict=True):
            if text is None:
                raise ValueError(f"{path}: document {doc_id} has no text (null)")
            yield doc_id, text, doc_id in held
