"""The corpus of tests/assets/test_shard_assets.py and the unsharded pipeline it is compared with.

Lines are laid out so that every interesting pair crosses shards (with shard_bytes=2500,
about eight documents a shard): originals first, their copies at the end of the file.
"""

from __future__ import annotations

import random

from text_corpus import prose  # noqa: F401 (re-exported: the shard tests import it from here)

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
    return [{"text": prose(NEW_COPIED), "id": "a000"}, {"text": near(prose(NEW_NEAR_TARGET), new_near_seed()), "id": "a001"},
            {"text": prose(500), "id": "a002"}, {"text": prose(501), "id": "a003"}]


def unsharded_final(raw_dir: str, model_dir: str, eval_dir: str, work: str, threshold: float) -> list[dict]:
    """The single-process library pipeline on the same raw files: normalize, quality filter +
    exact dedup, fuzzy dedup, decontamination (the functions `marin datakit run` calls)."""
    from marin_assets.datakit.decontaminate import EvalNgramIndex, decontaminate
    from marin_assets.datakit.dedup_exact import ExactDedupConfig, exact_dedup
    from marin_assets.datakit.fuzzy_dedup import fuzzy_dedup
    from marin_assets.datakit.normalize import NormalizeConfig, normalize
    from marin_assets.datakit.pipeline import Filter, apply_filters
    from marin_assets.datakit.quality import QualityScoreConfig, score_quality
    from marin_assets.datakit.shards import list_shards, read_table

    normalize(raw_dir, f"{work}/norm", NormalizeConfig(source=SOURCE))
    shards = list_shards(f"{work}/norm")
    score_quality(shards, model_dir, f"{work}/quality", QualityScoreConfig(threshold=threshold))
    exact_dedup({"": shards}, f"{work}/exact", ExactDedupConfig())
    apply_filters({"": shards}, [Filter("low_quality", lambda n: f"{work}/quality", "low_quality"),
                                 Filter("exact_duplicate", lambda n: f"{work}/exact", "is_duplicate")], f"{work}/f1", 10_000)
    fuzzy_dedup(list_shards(f"{work}/f1"), f"{work}/fuzzy")
    apply_filters({"": list_shards(f"{work}/f1")}, [Filter("fuzzy_duplicate", lambda n: f"{work}/fuzzy", "is_duplicate")], f"{work}/f2", 10_000)
    decontaminate(list_shards(f"{work}/f2"), EvalNgramIndex.load(eval_dir), f"{work}/decon")
    apply_filters({"": list_shards(f"{work}/f2")}, [Filter("contaminated", lambda n: f"{work}/decon", "contaminated")], f"{work}/f3", 10_000)
    docs = [d for s in list_shards(f"{work}/f3") for d in read_table(s, columns=["id", "text", "source", "source_id"]).to_pylist()]
    return sorted(docs, key=lambda d: (d["id"], d["source"], d["source_id"]))
