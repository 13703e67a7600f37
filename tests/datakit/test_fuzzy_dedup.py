"""Fuzzy dedup: planted exact/near duplicates, templated text, shards via fsspec."""

from __future__ import annotations

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash

from marin_assets.datakit.fuzzy_dedup import (
    FuzzyDedupConfig,
    dedup_texts,
    find_duplicates,
    fuzzy_dedup,
    minhash_signatures,
)
from marin_assets.datakit.minhash import (
    MinHashParams,
    clean_text,
    jaccard,
    permutation_coefficients,
    shingle_hashes,
    signatures_from_shingles,
)

RNG_VOCAB = np.random.default_rng(7)
VOCAB = [
    "".join(RNG_VOCAB.choice(list("abcdefghijklmnopqrstuvwxyz"), size=RNG_VOCAB.integers(3, 9)))
    for _ in range(3000)
]


def random_doc(rng: np.random.Generator, words: int = 120) -> str:
    return " ".join(rng.choice(VOCAB, size=words)) + "."


def edit_words(text: str, rng: np.random.Generator, fraction: float) -> str:
    words = text.split()
    for i in rng.choice(len(words), size=max(1, int(fraction * len(words))), replace=False):
        words[i] = str(rng.choice(VOCAB))
    return " ".join(words)


def doc_id(text: str) -> str:
    return xxhash.xxh3_128_hexdigest(text.encode("utf-8"))


def true_jaccard(a: str, b: str) -> float:
    return jaccard(shingle_hashes(a), shingle_hashes(b))


def test_clean_text_lowercases_strips_punctuation_and_collapses_space():
    assert clean_text("Hello,   World!\n\tIt's_fine.") == "hello world itsfine"
    assert clean_text("abcdef", max_chars=3) == "abc"


def test_shingles_are_sets_of_character_5grams():
    # "abcdefg" has 3 distinct 5-grams; repeating it adds the wrap-around 5-grams only.
    assert shingle_hashes("abcdefg").size == 3
    assert shingle_hashes("ab").size == 1  # short text is one shingle
    assert shingle_hashes("!!! ...").size == 0  # nothing left after cleaning
    assert np.array_equal(shingle_hashes("A,b.c d!e"), shingle_hashes("abc de"))


def test_signatures_match_the_formula_and_do_not_depend_on_chunking():
    rng = np.random.default_rng(0)
    texts = [random_doc(rng, words=int(rng.integers(1, 80))) for _ in range(30)] + ["", "x"]
    small = MinHashParams(chunk_shingles=7)
    sig_small = minhash_signatures(texts, small)
    sig_big = minhash_signatures(texts, MinHashParams())
    assert sig_small.shape == (32, 286) and sig_small.dtype == np.uint32
    assert np.array_equal(sig_small, sig_big)
    # Direct evaluation of min_x (a x + b) mod 2^32 for one document.
    a, b = permutation_coefficients(286, 42)
    x = (shingle_hashes(texts[3]) >> np.uint64(32)).astype(np.uint64)
    expected = ((a.astype(np.uint64) * x + b.astype(np.uint64)) % (1 << 32)).min(axis=1)
    assert np.array_equal(sig_big[3], expected.astype(np.uint32))
    assert np.all(sig_big[30] == 0xFFFFFFFF)  # empty document


def test_signature_agreement_estimates_jaccard_without_bias():
    # 200 pairs of random hash sets with Jaccard exactly 0.5 (200 shared of 400 total).
    rng = np.random.default_rng(1)
    sets = []
    for _ in range(200):
        pool = rng.integers(0, 2**64, size=400, dtype=np.uint64)
        sets.append(np.unique(pool[:300]))
        sets.append(np.unique(pool[100:]))
    sig = signatures_from_shingles(sets, MinHashParams())
    estimates = (sig[0::2] == sig[1::2]).mean(axis=1)
    # Binomial(286, 0.5)/286 has sd 0.0296; the mean of 200 has sd 0.0021.
    assert abs(estimates.mean() - 0.5) < 0.01
    assert 0.022 < estimates.std() < 0.038


def test_config_validation():
    with pytest.raises(ValueError, match="bands \\* rows"):
        FuzzyDedupConfig(bands=10, rows=10)
    with pytest.raises(ValueError, match="jaccard_threshold"):
        FuzzyDedupConfig(jaccard_threshold=0.0)
    assert abs(FuzzyDedupConfig().lsh_threshold - 0.744) < 0.001


def test_planted_near_duplicates_are_removed_and_uniques_survive():
    rng = np.random.default_rng(2)
    uniques = [random_doc(rng) for _ in range(150)]
    near = []  # (index of original, text)
    for k in range(60):
        original = k % 40
        near.append((original, edit_words(uniques[original], rng, fraction=float(rng.uniform(0.01, 0.05)))))
    exact_variants = [uniques[50].upper(), uniques[51].replace(" ", "  ,")]  # same cleaned text
    texts = uniques + [t for _, t in near] + exact_variants
    ids = [doc_id(t) for t in texts]
    dups = find_duplicates(ids, texts, FuzzyDedupConfig())

    groups: dict[int, set[str]] = {i: {ids[i]} for i in range(len(uniques))}
    for pos, (orig, _) in enumerate(near, start=150):
        groups[orig].add(ids[pos])
    groups[50].add(ids[210])
    groups[51].add(ids[211])
    group_of = {m: g for g, members in groups.items() for m in members}

    # Nothing outside a planted group is removed, and a removed document points inside its
    # own group at an earlier member; every group keeps its earliest, the original.
    position = {doc: pos for pos, doc in enumerate(ids)}
    for removed, survivor in dups.items():
        assert group_of[removed] == group_of[survivor] and position[survivor] < position[removed]
        assert len(groups[group_of[removed]]) > 1
    for g in groups:
        assert ids[g] not in dups
    assert sum(ids[pos] < ids[orig] for pos, (orig, _) in enumerate(near, start=150) if ids[pos] in dups) > 5

    def rep(x: str) -> str:
        return dups.get(x, x)

    # Exact duplicates after cleaning (case/punctuation variants) are always merged.
    assert rep(ids[210]) == rep(ids[50]) and rep(ids[211]) == rep(ids[51])
    # Recall over planted copies whose true Jaccard with their original is >= 0.8.
    eligible = [
        (orig, pos)
        for pos, (orig, t) in enumerate(near, start=150)
        if true_jaccard(t, uniques[orig]) >= 0.8
    ]
    assert len(eligible) >= 50
    merged = sum(rep(ids[pos]) == rep(ids[orig]) for orig, pos in eligible)
    assert merged / len(eligible) >= 0.95


def test_the_earliest_copy_survives_whatever_the_ids():
    # The same near pair in both orders: the first one stays, the other one goes, so which
    # copy survives follows the corpus order and not the content hashes.
    rng = np.random.default_rng(5)
    a = random_doc(rng)
    b = edit_words(a, rng, fraction=0.02)
    for texts in ([a, b], [b, a]):
        ids = [doc_id(t) for t in texts]
        assert find_duplicates(ids, texts) == {ids[1]: ids[0]}
        assert dedup_texts(ids, texts).survivor.tolist() == [0, 0]


def test_templated_but_different_documents_survive_verification():
    # A shared boilerplate with a short distinct payload: Jaccard ~0.7-0.78, above the LSH
    # threshold often enough to become candidates, below the 0.8 verification threshold.
    rng = np.random.default_rng(3)
    boilerplate = random_doc(rng, words=160)
    texts = [boilerplate + " " + random_doc(rng, words=30) for _ in range(40)]
    ids = [doc_id(t) for t in texts]
    sims = [true_jaccard(texts[0], t) for t in texts[1:]]
    assert max(sims) < 0.8
    result = dedup_texts(ids, texts, FuzzyDedupConfig())
    counts = result.counts()
    assert counts["candidate_pairs"] > 0  # LSH alone would have merged these ...
    assert counts["verified_pairs"] == 0  # ... verification rejects them all
    assert counts["duplicates"] == 0
    # With verification effectively off (threshold just above 0) they would over-merge.
    loose = dedup_texts(ids, texts, FuzzyDedupConfig(jaccard_threshold=0.01)).counts()
    assert loose["duplicates"] > 0


def _write_shard(path: str, texts: list[str]) -> list[str]:
    ids = [doc_id(t) for t in texts]
    order = np.argsort(ids)
    table = pa.table(
        {
            "id": [ids[i] for i in order],
            "text": [texts[i] for i in order],
            "source": ["test"] * len(texts),
            "source_id": [str(i) for i in order],
            "metadata": ["{}"] * len(texts),
        }
    )
    fs, p = fsspec.core.url_to_fs(path)
    fs.makedirs(p.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(p, "wb") as f:
        pq.write_table(table, f)
    return [ids[i] for i in order]


@pytest.mark.parametrize("base", ["memory://fuzzy", "local"])
def test_fuzzy_dedup_over_shards_writes_co_partitioned_attributes(base, tmp_path):
    base = str(tmp_path) if base == "local" else base
    rng = np.random.default_rng(4)
    a = [random_doc(rng) for _ in range(20)]
    b = [random_doc(rng) for _ in range(20)] + [edit_words(a[0], rng, 0.02), edit_words(a[1], rng, 0.02)]
    shard_a = f"{base}/in/part-00000-of-00002.parquet"
    shard_b = f"{base}/in/part-00001-of-00002.parquet"
    ids_a, ids_b = _write_shard(shard_a, a), _write_shard(shard_b, b)

    counts = fuzzy_dedup([shard_a, shard_b], f"{base}/out", FuzzyDedupConfig())
    assert counts["docs"] == 42 and counts["duplicates"] == 2 and counts["clusters"] == 2
    assert counts["verified_pairs"] == 2 and counts["candidate_pairs"] >= 2

    rows = {}
    for shard, ids in [(shard_a, ids_a), (shard_b, ids_b)]:
        with fsspec.open(f"{base}/out/{shard.rsplit('/', 1)[1]}", "rb") as f:
            table = pq.read_table(f)
        assert table.column_names == ["id", "cluster_id", "is_duplicate", "duplicate_of"]
        assert table.column("id").to_pylist() == ids  # same rows, same order
        for r in table.to_pylist():
            rows[r["id"]] = r
    # The originals come first (shard a): they survive, whichever id is lower.
    for orig, copy in [(doc_id(a[0]), doc_id(b[-2])), (doc_id(a[1]), doc_id(b[-1]))]:
        assert rows[copy]["is_duplicate"] and rows[copy]["duplicate_of"] == orig
        assert not rows[orig]["is_duplicate"] and rows[orig]["duplicate_of"] is None
        assert rows[copy]["cluster_id"] == rows[orig]["cluster_id"] == orig
    assert sum(r["is_duplicate"] for r in rows.values()) == 2


def test_fuzzy_dedup_names_a_missing_shard():
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        fuzzy_dedup(["memory://missing/nope.parquet"], "memory://missing/out")
