"""The chat dataset: the plays' speeches, their conversations, the template and the two-field cache."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marin_assets.datakit.chat import (
    ASSISTANT,
    USER,
    ChatConfig,
    Conversation,
    conversations,
    encode_conversation,
    scenes,
    text_of,
    tokenize_chat,
)
from marin_assets.datakit.levanter_cache import is_finished_cache
from marin_assets.datakit.tokenize import load_encoder
from marin_assets.train.data.token_caches import TokenCache
from tests.support.plays import FOLIO_PLAY, FOLIO_SPEECHES, MODERN_PLAY, PLAY_SPEECHES


def _speeches(text: str) -> list[tuple[int, str, str]]:
    return [(n, s.speaker, s.text) for n, scene in enumerate(scenes(text)) for s in scene]


@pytest.mark.parametrize(("text", "want"), [(MODERN_PLAY, PLAY_SPEECHES), (FOLIO_PLAY, FOLIO_SPEECHES)], ids=["modern", "folio"])
def test_speeches_of_both_layouts(text, want):
    """Title page and persons skipped, stage directions dropped, a speech goes on after an aside."""
    assert _speeches(text) == want


def test_text_without_dialogue_has_no_scenes():
    sonnet = "SONNET I\n\nFrom fairest creatures we desire increase,\nThat thereby beauty's rose might never die,\n"
    assert scenes(sonnet) == []
    assert conversations("sonnet", sonnet, ChatConfig()) == ([], 0)


def test_conversations_alternate_roles_and_count_the_unanswered():
    convs, dropped = conversations("keeper", MODERN_PLAY, ChatConfig(turns=2))
    # scene 0: 4 speeches -> 2 conversations; scene 1: 3 speeches -> 1 conversation + 1 unanswered speech
    assert [c.id for c in convs] == ["keeper/scene000/00000", "keeper/scene000/00002", "keeper/scene001/00000"]
    assert dropped == 1
    assert all([role for role, _ in c.messages] == [USER, ASSISTANT] for c in convs)
    assert convs[0].messages[1][1] == PLAY_SPEECHES[1][2]
    convs4, dropped4 = conversations("keeper", MODERN_PLAY, ChatConfig(turns=4))
    assert [len(c.messages) for c in convs4] == [4, 3] and dropped4 == 0
    assert sum(len(c.messages) for c in convs4) + dropped4 == len(PLAY_SPEECHES)


def test_chat_config_refuses_a_single_turn():
    with pytest.raises(ValueError, match="ChatConfig.turns"):
        ChatConfig(turns=1)


def test_mask_covers_exactly_the_replies():
    """Byte tokens: the ids are the rendered text's bytes + EOS; the masked ids decode to the replies, each
    with the newline that ends it, and EOS is a target only when the assistant spoke last."""
    encoder = load_encoder("bytes")
    conv = Conversation("c", ((USER, "Who goes there?"), (ASSISTANT, "A friend."), (USER, "Pass, friend.")))
    ids, mask = encode_conversation(conv, encoder)
    assert ids[:-1] == list(text_of(conv).encode()) and ids[-1] == encoder.eos_id
    assert bytes(i for i, m in zip(ids, mask, strict=True) if m) == b"A friend.\n"
    assert mask[-1] == 0
    _, mask2 = encode_conversation(Conversation("d", conv.messages[:2]), encoder)
    assert mask2[-1] == 1


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["Wren", "Marl", "First Watchman", "KING"]),
            st.lists(
                st.text(st.characters(whitelist_categories=("Ll", "Lu", "Nd", "Zs", "Po")), min_size=1, max_size=30).filter(
                    lambda t: t.strip() and not t.strip().startswith("[")
                ),
                min_size=1,
                max_size=3,
            ),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_modern_layout_round_trips(speeches):
    """Any speeches written in the modern layout (name alone above the lines) parse back as written, and every
    speech is accounted for: in a conversation or dropped unanswered."""

    def reads_as_speaker(line: str) -> bool:
        return any(scenes(f"SCENE I.\n\n{line.strip()}\nx\n"))

    lines = [[line for line in body if not reads_as_speaker(line)] or ["x"] for _, body in speeches]
    text = "ACT I.\n\nSCENE I. Somewhere.\n\n" + "\n".join(
        f"{name}.\n" + "\n".join(body) + "\n" for (name, _), body in zip(speeches, lines, strict=True)
    )
    want = [
        (0, name, "\n".join(line.strip() for line in body if line.strip()))
        for (name, _), body in zip(speeches, lines, strict=True)
    ]
    assert _speeches(text) == [w for w in want if w[2]]
    convs, dropped = conversations("p", text, ChatConfig(turns=3))
    assert sum(len(c.messages) for c in convs) + dropped == len([w for w in want if w[2]])


def test_tokenize_chat_writes_aligned_fields_and_keeps_the_split(tmp_path):
    plays = [("keeper", MODERN_PLAY, False), ("folio", FOLIO_PLAY, True), ("sonnet", "SONNET I\n\nlines\n", False)]
    counts = tokenize_chat(plays, "bytes", str(tmp_path), ChatConfig(turns=2))
    assert counts["plays"] == 3 and counts["plays_without_dialogue"] == 1
    assert counts["speeches"] == len(PLAY_SPEECHES) + len(FOLIO_SPEECHES)
    assert counts["speeches_dropped_unanswered"] == 2  # one per play with an odd last scene
    assert counts["train"]["conversations"] == 3 and counts["validation"]["conversations"] == 1
    for split in ("train", "validation"):
        assert is_finished_cache(str(tmp_path / split))
        ids = TokenCache(tmp_path / split)
        n = ids.num_tokens
        assert n == counts[split]["tokens"]
        tokens, mask = ids.read([0], n)[0], TokenCache(tmp_path / split, field="loss_mask").read([0], n)[0]
        assert int(mask.sum()) == counts[split]["trained_tokens"]
        assert set(np.unique(mask)) <= {0, 1}
        plays_here = [(i, t) for i, t, held in plays if held == (split == "validation")]
        replies = [c.messages[1][1] + "\n" for i, t in plays_here for c in conversations(i, t, ChatConfig(turns=2))[0]]
        assert bytes(t for t, m in zip(tokens, mask, strict=True) if m and t < 256).decode() == "".join(replies)
    held = TokenCache(tmp_path / "validation").read([0], counts["validation"]["tokens"])[0]
    assert bytes(t for t in held if t < 256).decode().startswith("<|user|>\nThe tide is late to night")
