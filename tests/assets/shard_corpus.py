"""The corpus of tests/assets/test_shard_assets.py and the in-memory reference it is compared with.

Lines are laid out so that every interesting pair crosses shards (with shard_bytes=2500,
about eight documents a shard): originals first, their copies at the end of the file.
"""

from __future__ import annotations

import random

from tests.support.text_corpus import prose  # noqa: F401 (re-exported: the shard tests import it from here)

SOURCE = "tiny"
EVAL_TEXT = " ".join(f"evalword{i}" for i in range(30)) + " what is the capital of the answer."
BASE_DOCS = 24
COPIED, NEAR_TARGET = 2, 5  # in the base file: an exact and a near copy of these, in later shards
NEW_COPIED, NEW_NEAR_TARGET = 10, 20  # the added file copies these (exactly / nearly)


def spam(seed: int) -> str:
    rng = random.Random(seed)
    vocab = ["FREE", "$$$", "CLICK", "NOW", "winner", "cheap", "pills", "!!!", "http://x.biz", "offer", "LIMITED", "cash"]
    return " ".join(rng.choice(vocab) for _ in range(40))


def near(text: str, seed: int) -> str:
    """`text` with two words changed: the 5-gram Jaccard stays well above 0.8."""
    words = text.split()
    for i in random.Random(seed).sample(range(len(words)), 2):
        words[i] = "zq" + words[i]
    return " ".join(words)


def base_records() -> list:
    docs: list = [{"text": prose(i), "id": f"d{i:03d}"} for i in range(BASE_DOCS)]
    docs += [{"text": spam(i), "id": f"s{i:03d}"} for i in range(3)]  # low quality
    docs += [{"text": "", "id": "q-empty"}, "{not json"]  # quarantined: empty text, broken line
    docs += [{"text": prose(950) + "\n" + EVAL_TEXT, "id": "d950"}]  # contaminated (a paragraph = a line)
    docs += [{"text": prose(COPIED), "id": "d900"}]  # exact copy: "d900" > "d002", so this copy goes
    docs += [{"text": near(prose(NEAR_TARGET), 7), "id": "d901"}]  # near copy
    return docs


def new_near_seed() -> int:
    """A seed whose near copy of NEW_NEAR_TARGET has the lower id (under a lowest-id rule the old
    shard's copy would go; the earliest copy survives, so the new shard's copy goes)."""
    from marin_assets.datakit.normalize import doc_id

    return next(s for s in range(100) if doc_id(near(prose(NEW_NEAR_TARGET), s)) < doc_id(prose(NEW_NEAR_TARGET)))


def new_records() -> list:
    """The added raw file: an exact copy of doc 10 with a lower source_id (so the new copy is
    the canonical one and doc 10's shard loses its row), a near copy of doc 20 with the
    lower id (removed from the new shard: doc 20 came first), and two new documents."""
    return [
        {"text": prose(NEW_COPIED), "id": "a000"},
        {"text": near(prose(NEW_NEAR_TARGET), new_near_seed()), "id": "a001"},
        {"text": prose(500), "id": "a002"},
        {"text": prose(501), "id": "a003"},
    ]


def expected_final(store, shards: list[str], model_dir: str, eval_dir: str, threshold: float) -> list[dict]:
    """What the graph's final documents must be, decided in memory from its normalized shards
    (corpus order: shard key, then row), each text PII-masked (pii.mask_pii): the quality model's scores, then the dedup oracle
    (tests/datakit/oracle.py: exact copies, then all-pairs near copies of what is left), then
    the eval n-gram overlap of each survivor."""
    from marin_assets.datakit.decontaminate import DecontamConfig, EvalNgramIndex, score_text
    from marin_assets.datakit.normalize import doc_id
    from marin_assets.datakit.pii import mask_pii
    from marin_assets.datakit.quality import load_quality_model
    from marin_assets.datakit.shards import read_table
    from tests.datakit.oracle import dedup, place

    docs = []
    for key in shards:
        table = read_table(
            store.read_pointer("shards/normalized", key).files(".parquet")[0], columns=["id", "text", "source", "source_id"]
        )
        for i, row in enumerate(table.to_pylist()):
            text = mask_pii(row["text"])[0]
            docs.append({**row, "text": text, "id": doc_id(text), "key": key, "row": i})
    scores = load_quality_model(model_dir).predict([d["text"] for d in docs])
    low = {place(d) for d, q in zip(docs, scores) if q < threshold}
    exact, fuzzy = dedup([d for d in docs if place(d) not in low])
    index, bar = EvalNgramIndex.load(eval_dir), DecontamConfig().threshold
    final = [d for d in docs if place(d) not in low | set(exact) | set(fuzzy) and score_text(index, d["text"])[0] < bar]
    return sorted(
        ({k: d[k] for k in ("id", "text", "source", "source_id")} for d in final),
        key=lambda d: (d["id"], d["source"], d["source_id"]),
    )
