"""Fuzzy dedup: the definition of cleaning, shingles and signatures and the batch paths the
steps take against it; planted exact/near duplicates and templated text through the shard
steps (fuzzy_map per shard -> band reduces -> fuzzy_verify per shard -> fuzzy_resolve), on
local and memory:// shards."""

from __future__ import annotations

import re

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from marin_assets.datakit import minhash
from marin_assets.datakit.fuzzy_dedup import FuzzyDedupConfig, fuzzy_map
from marin_assets.datakit.minhash import (
    MinHashParams,
    clean_text,
    jaccard,
    minhash_signatures,
    permutation_coefficients,
    keyed_batches,
    shingle_hashes,
    shingle_keys,
    signatures_from_shingles,
)
from tests.datakit.oracle import fuzzy_duplicates
from tests.datakit.test_sharded_dedup import corpus_docs, removal_places, run_fuzzy

RNG_VOCAB = np.random.default_rng(7)
VOCAB = ["".join(RNG_VOCAB.choice(list("abcdefghijklmnopqrstuvwxyz"), size=RNG_VOCAB.integers(3, 9))) for _ in range(3000)]


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
    return jaccard(shingle_keys(a), shingle_keys(b))


def _clean_by_definition(text: str, max_chars: int = 500_000) -> str:
    """The cleaning as first written: lowercase, drop [^\\w\\s] and "_", collapse \\s+, strip."""
    text = re.sub(r"[^\w\s]|_", "", text[:max_chars].lower())
    return re.sub(r"\s+", " ", text).strip()


def test_clean_text_lowercases_strips_punctuation_and_collapses_space():
    assert clean_text("Hello,   World!\n\tIt's_fine.") == "hello world itsfine"
    assert clean_text("abcdef", max_chars=3) == "abc"
    assert clean_text("a\x1cb\x1f c") == "a b c"  # str.isspace() whitespace that bytes.split() would keep
    assert clean_text("Ünïcode — ﬁne\u00a0text!") == "ünïcode ﬁne text"


def test_ascii_cleaning_equals_the_definition_for_every_character():
    for c in map(chr, range(128)):
        for text in (f"A{c}b", f"{c}x{c}{c}y{c}", f"{c}", f"{c}{c} Z {c}"):
            assert clean_text(text) == _clean_by_definition(text), repr(text)


texts = st.text(alphabet=st.sampled_from("aAbZ09 _-.,!\t\n\x1c\x1f\x00éÉİßﬁ中\u00a0\u2003\u200b٣½²"), max_size=40)


@settings(max_examples=300, deadline=None)
@given(text=texts, max_chars=st.sampled_from([3, 500_000]))
def test_clean_text_equals_the_definition(text, max_chars):
    assert clean_text(text, max_chars) == _clean_by_definition(text, max_chars)


@settings(max_examples=150, deadline=None)
@given(batch=st.lists(texts, max_size=12), ngram=st.sampled_from([1, 2, 5]), batch_chars=st.sampled_from([1, 16, 1 << 16]))
def test_the_batch_paths_equal_shingle_hashes_one_text_at_a_time(batch, ngram, batch_chars):
    """ASCII and other texts, empty, shorter than ngram, cut into batches anywhere: the
    shingle keys and signatures of the batch path are those of the per-text definition."""
    params = MinHashParams(num_perm=12, ngram=ngram, max_chars=30, chunk_shingles=5)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(minhash, "SIGNATURE_BATCH_CHARS", batch_chars)
        batches = list(keyed_batches(batch, params))
        signatures = minhash_signatures(batch, params)
    expected = [shingle_hashes(t, params) for t in batch]
    assert np.array_equal(signatures, signatures_from_shingles(expected, params))
    keys = [np.zeros(0, np.uint32)] * len(batch)
    for b in batches:
        ends = np.r_[b.starts[1:], b.keys.size]
        for position, lo, hi in zip(b.positions.tolist(), b.starts.tolist(), ends.tolist(), strict=True):
            keys[position] = b.keys[lo:hi]
        assert np.array_equal(b.signatures, signatures[b.positions])
    assert all(np.array_equal(k, shingle_keys(t, params)) for k, t in zip(keys, batch, strict=True))
    assert [k.size > 0 for k in keys] == [e.size > 0 for e in expected]  # a run for every text with shingles


def test_shingles_are_sets_of_character_5grams():
    # "abcdefg" has 3 distinct 5-grams; repeating it adds the wrap-around 5-grams only.
    assert shingle_hashes("abcdefg").size == 3
    assert shingle_hashes("abcdefgabcdefg").size == 7
    assert shingle_hashes("ab").size == 1  # short text is one shingle
    assert shingle_hashes("!!! ...").size == 0  # nothing left after cleaning
    assert np.array_equal(shingle_hashes("A,b.c d!e"), shingle_hashes("abc de"))
    assert (np.diff(shingle_hashes(random_doc(np.random.default_rng(0))).astype(np.float64)) > 0).all()  # sorted, unique


def test_signatures_match_the_formula_and_do_not_depend_on_chunking():
    rng = np.random.default_rng(0)
    docs = [random_doc(rng, words=int(rng.integers(1, 80))) for _ in range(30)] + ["", "x"]
    sig_small = minhash_signatures(docs, MinHashParams(chunk_shingles=7))
    sig_big = minhash_signatures(docs, MinHashParams())
    assert sig_small.shape == (32, 286) and sig_small.dtype == np.uint32
    assert np.array_equal(sig_small, sig_big)
    # Direct evaluation of min_x (a x + b) mod 2^32 for one document.
    a, b = permutation_coefficients(286, 42)
    x = (shingle_hashes(docs[3]) >> np.uint64(32)).astype(np.uint64)
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


@settings(max_examples=200, deadline=None)
@given(a=st.sets(st.integers(0, 40)), b=st.sets(st.integers(0, 40)))
def test_jaccard_is_the_set_formula(a, b):
    arrays = [np.array(sorted(s), dtype=np.uint64) << np.uint64(58) for s in (a, b)]  # high bits set: uint64, not int64
    assert jaccard(*arrays) == (len(a & b) / len(a | b) if a | b else 0.0)


def test_config_validation():
    with pytest.raises(ValueError, match="bands \\* rows"):
        FuzzyDedupConfig(bands=10, rows=10)
    with pytest.raises(ValueError, match="jaccard_threshold"):
        FuzzyDedupConfig(jaccard_threshold=0.0)
    assert abs(FuzzyDedupConfig().lsh_threshold - 0.744) < 0.001


def _write_shards(base: str, parts: list[list[str]]) -> dict[str, str]:
    """{shard key: path}: one shard of (id, text, source, source_id) per list, rows in its order."""
    shards = {}
    for s, part in enumerate(parts):
        shards[f"part-{s:05d}"] = path = f"{base}/in/part-{s:05d}-of-{len(parts):05d}.parquet"
        table = pa.table({"id": [doc_id(t) for t in part], "text": part, "source": ["test"] * len(part),
                          "source_id": [f"{s}-{r}" for r in range(len(part))]})  # fmt: skip
        fs, p = fsspec.core.url_to_fs(path)
        fs.makedirs(p.rsplit("/", 1)[0], exist_ok=True)
        with fs.open(p, "wb") as f:
            pq.write_table(table, f)
    return shards


def test_planted_near_duplicates_are_removed_and_uniques_survive(tmp_path):
    rng = np.random.default_rng(2)
    uniques = [random_doc(rng) for _ in range(150)]
    near = []  # (index of original, text)
    for k in range(60):
        original = k % 40
        near.append((original, edit_words(uniques[original], rng, fraction=float(rng.uniform(0.01, 0.05)))))
    exact_variants = [uniques[50].upper(), uniques[51].replace(" ", "  ,")]  # same cleaned text
    texts = uniques + [t for _, t in near] + exact_variants  # corpus order: the originals first
    shards = _write_shards(str(tmp_path), [texts[i : i + 53] for i in range(0, len(texts), 53)])
    docs = corpus_docs(shards)
    at = [(d["key"], d["row"]) for d in docs]  # corpus position -> (shard, row)
    removed = removal_places(run_fuzzy(shards, str(tmp_path / "work"))["lists"])

    groups: dict[int, set[int]] = {i: {i} for i in range(len(uniques))}
    for pos, (orig, _) in enumerate(near, start=150):
        groups[orig].add(pos)
    groups[50].add(210)
    groups[51].add(211)
    group_of = {m: g for g, members in groups.items() for m in members}
    position = {place: pos for pos, place in enumerate(at)}
    # Nothing outside a planted group is removed, and a removed document points inside its
    # own group at an earlier member; every group keeps its earliest, the original.
    for gone, kept in removed.items():
        assert group_of[position[gone]] == group_of[position[kept]] and position[kept] < position[gone]
    assert all(at[g] not in removed for g in groups)

    def rep(pos: int):
        return removed.get(at[pos], at[pos])

    # Exact duplicates after cleaning (case/punctuation variants) are always merged.
    assert rep(210) == rep(50) and rep(211) == rep(51)
    # Recall over planted copies whose true Jaccard with their original is >= 0.8.
    eligible = [(orig, pos) for pos, (orig, t) in enumerate(near, start=150) if true_jaccard(t, uniques[orig]) >= 0.8]
    assert len(eligible) >= 50
    assert sum(rep(pos) == rep(orig) for orig, pos in eligible) / len(eligible) >= 0.95
    assert removed == fuzzy_duplicates(docs)  # and here, every near pair LSH could find it found


def test_a_cluster_is_joined_by_a_spanning_forest_and_removed_as_by_every_pair(tmp_path):
    # Six near copies of one document, three in each shard, among unrelated documents: LSH
    # names all 15 pairs, but a verify skips a pair its kept edges already join. The first
    # shard keeps 2 edges of its 3 pairs; the second 2 within itself, then 1 to each of the
    # first shard's 3 copies (it cannot know that they are joined): 7 edges, 7 pairs compared,
    # and the removals are the all-pairs oracle's.
    rng = np.random.default_rng(11)
    original = random_doc(rng, words=200)
    copies = [original] + [edit_words(original, rng, fraction=0.01) for _ in range(5)]
    others = [random_doc(rng) for _ in range(20)]
    shards = _write_shards(str(tmp_path), [others[:10] + copies[:3], copies[3:] + others[10:]])
    out = run_fuzzy(shards, str(tmp_path / "work"))
    counts = [(v["candidate_pairs"], v["checked_pairs"], v["verified_pairs"]) for v in out["verified"].values()]
    assert counts == [(3, 2, 2), (12, 5, 5)]
    assert (out["duplicates"], out["clusters"]) == (5, 1)
    assert removal_places(out["lists"]) == fuzzy_duplicates(corpus_docs(shards))
    assert set(removal_places(out["lists"]).values()) == {("part-00000", 10)}


@pytest.mark.parametrize("layout", ["one shard", "two shards"])
def test_the_earliest_copy_survives_whatever_the_ids(tmp_path, layout):
    # The same near pair in both orders: the first one stays, the other one goes, so which
    # copy survives follows the corpus order and not the content hashes.
    rng = np.random.default_rng(5)
    a = random_doc(rng)
    b = edit_words(a, rng, fraction=0.02)
    for name, first, second in (("ab", a, b), ("ba", b, a)):
        parts = [[first, second]] if layout == "one shard" else [[first], [second]]
        shards = _write_shards(str(tmp_path / name), parts)
        out = run_fuzzy(shards, str(tmp_path / name / "work"))
        [(key, [removal])] = [(k, v) for k, v in out["lists"].items() if v]
        assert (removal.id, removal.kept_id) == (doc_id(second), doc_id(first))
        assert (key, removal.row) == (("part-00000", 1) if layout == "one shard" else ("part-00001", 0))
        assert (removal.kept_shard, removal.kept_row) == ("part-00000", 0)


def test_templated_but_different_documents_survive_verification(tmp_path):
    # A shared boilerplate with a short distinct payload: Jaccard ~0.7-0.78, above the LSH
    # threshold often enough to become candidates, below the 0.8 verification threshold.
    rng = np.random.default_rng(3)
    boilerplate = random_doc(rng, words=160)
    docs = [boilerplate + " " + random_doc(rng, words=30) for _ in range(40)]
    assert max(true_jaccard(docs[0], t) for t in docs[1:]) < 0.8
    shards = _write_shards(str(tmp_path), [docs[:20], docs[20:]])
    out = run_fuzzy(shards, str(tmp_path / "work"))
    assert sum(v["candidate_pairs"] for v in out["verified"].values()) > 0  # LSH alone would have merged these ...
    assert sum(v["verified_pairs"] for v in out["verified"].values()) == 0  # ... verification rejects them all
    assert out["duplicates"] == 0 and not any(out["lists"].values())
    # With verification effectively off (threshold just above 0) they would over-merge.
    loose = run_fuzzy(shards, str(tmp_path / "loose"), FuzzyDedupConfig(jaccard_threshold=0.01))
    assert loose["duplicates"] > 0


@pytest.mark.parametrize("base", ["memory", "local"])
def test_the_steps_run_on_fsspec_paths(base, tmp_path):
    base = f"memory://fuzzy-{tmp_path.name}" if base == "memory" else str(tmp_path)
    rng = np.random.default_rng(4)
    a = [random_doc(rng) for _ in range(20)]
    b = [random_doc(rng) for _ in range(20)] + [edit_words(a[0], rng, 0.02), edit_words(a[1], rng, 0.02)]
    shards = _write_shards(base, [a, b])
    out = run_fuzzy(shards, f"{base}/work")
    assert (out["duplicates"], out["clusters"], out["verified_pairs"]) == (2, 2, 2)
    # The originals come first (shard 0): they survive, whichever id is lower.
    assert out["lists"]["part-00000"] == []
    assert sorted((r.row, r.id, r.kept_id, r.kept_shard, r.kept_row) for r in out["lists"]["part-00001"]) == [
        (20, doc_id(b[20]), doc_id(a[0]), "part-00000", 0),
        (21, doc_id(b[21]), doc_id(a[1]), "part-00000", 1),
    ]


def test_a_missing_shard_is_named():
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        fuzzy_map("s", "memory://missing/nope.parquet", "memory://missing/out")
