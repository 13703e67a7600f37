"""The ids the DataKit's byte tokenizer (``--tokenizer bytes``) gives, as the tests write them:
one id per UTF-8 byte, then EOS 256, so a ``vocab_size`` 257 model trains on them
(tests/datakit/test_datasets.py checks them against the tokenizer itself).

Standard library only, so subprocess scripts (tests/train/train_check.py) import it cheaply.
"""

from __future__ import annotations

from collections.abc import Iterable

EOS = 256
VOCAB_SIZE = 257


def byte_ids(text: str) -> list[int]:
    """``text``'s UTF-8 bytes, then EOS: one document's row."""
    return [*text.encode("utf-8"), EOS]


def token_count(texts: Iterable[str]) -> int:
    """How many ids ``byte_ids`` gives for ``texts`` together."""
    return sum(len(byte_ids(text)) for text in texts)
