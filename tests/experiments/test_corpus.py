"""The screens' corpus is a DataKit dataset (marin_assets/experiments/data.py): the JSONL input,
the DataKit run over it (the `marin datakit run` driver, a real subprocess), the dataset the
runs read, a rerun of cache hits, the refusals, and the held-out split the validation loss reads."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from marin_assets.experiments.data import (
    CorpusError,
    committed_artifacts,
    corpus_jsonl,
    materialize_corpus,
    open_corpus,
    stdlib_files,
)
from marin_assets.store import ArtifactStore
from tests.support.byte_tokens import EOS, VOCAB_SIZE

pytestmark = pytest.mark.slow  # starts the DataKit driver (a subprocess) and trains

N_FILES = 6


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(store, the corpus, the first run's log lines)."""
    store = ArtifactStore(str(tmp_path_factory.mktemp("corpus") / "store"))
    lines: list[str] = []
    return store, materialize_corpus(store, N_FILES, lines.append), lines


def test_the_input_is_one_record_per_paragraph_with_stable_ids():
    data = corpus_jsonl(N_FILES)
    assert data == corpus_jsonl(N_FILES)  # deterministic: the same bytes, the same folder
    records = [json.loads(line) for line in data.decode().splitlines()]
    ids = [r["id"] for r in records]
    assert len(set(ids)) == len(ids) and ids == sorted(ids)  # zero-padded places sort in file order
    assert {i.split("#")[0] for i in ids} <= {f.name for f in stdlib_files(N_FILES)}
    assert all(set(r) == {"id", "text"} and len(r["text"].strip()) > 40 for r in records)
    first = stdlib_files(N_FILES)[0]
    paragraphs = first.read_text(encoding="utf-8", errors="replace").split("\n\n")
    for r in records[:5]:  # an id names the paragraph's place in its file
        name, place = r["id"].split("#")
        assert name == first.name and paragraphs[int(place)] == r["text"]


def test_the_dataset_is_the_datakit_run_over_the_content_addressed_input(made):
    store, corpus, lines = made
    data = corpus_jsonl(N_FILES)
    digest = hashlib.sha256(data).hexdigest()
    prefix = Path(store.root) / "experiments" / "corpus" / digest[:16]
    assert corpus.prefix == str(prefix) and (prefix / "input" / "stdlib.jsonl").read_bytes() == data
    assert corpus.index == str(prefix / "cache" / "dataset.json")
    index = json.loads(Path(corpus.index).read_text())
    assert (
        corpus.version
        == hashlib.sha256(json.dumps(index, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()).hexdigest()
    )
    assert index["tokenizer"]["vocab_size"] == VOCAB_SIZE == corpus.vocab_size and index["tokenizer"]["eos_id"] == EOS
    assert corpus.train_tokens == sum(s["train_tokens"] for s in index["shards"]) > 0
    assert corpus.validation_tokens == sum(s["validation_tokens"] for s in index["shards"]) > 0
    summary = json.loads((prefix / "summary.json").read_text())["summary"]
    assert summary["tokenizer"] == "bytes" and summary["removed"]["low_quality"] == 0
    assert summary["docs_in"] == len(data.splitlines())  # every paragraph reached the DataKit
    held = sum(s["validation_docs"] for s in index["shards"]) / summary["docs_out"]
    assert 0.03 < held < 0.2, held  # the DataKit's held-out split, VALIDATION_FRACTION 0.1 by document hash
    ran = json.loads((prefix / "run.json").read_text())
    assert ran["tokenize"]["validation_fraction"] == 0.1 and ran["quality"]["threshold"] == 0.0 and ran["evals"] == []
    assert any(f"{committed_artifacts(corpus.prefix)} DataKit artifact(s) computed" in line for line in lines), lines


def test_a_rerun_is_all_cache_hits_and_opening_runs_nothing(made):
    store, corpus, _ = made
    before = committed_artifacts(corpus.prefix)
    lines: list[str] = []
    assert materialize_corpus(store, N_FILES, lines.append) == corpus
    assert committed_artifacts(corpus.prefix) == before
    assert "every DataKit artifact was a cache hit" in lines[-1]
    assert open_corpus(store, N_FILES) == corpus


def test_opening_a_corpus_that_was_not_made_is_refused(made, tmp_path):
    store, corpus, _ = made
    with pytest.raises(FileNotFoundError, match=r"no DataKit dataset of the first 6 standard-library files .*none was made"):
        open_corpus(ArtifactStore(str(tmp_path / "empty")), N_FILES)
    # The same input made with other settings (here a changed held-out share) is not the screens' corpus.
    copy = ArtifactStore(str(tmp_path / "copy"))
    moved = Path(copy.root) / Path(corpus.prefix).relative_to(store.root)
    shutil.copytree(corpus.prefix, moved)
    ran = json.loads((moved / "run.json").read_text())
    ran["tokenize"]["validation_fraction"] = 0.02
    (moved / "run.json").write_text(json.dumps(ran))
    with pytest.raises(FileNotFoundError, match="the last one had other settings"):
        open_corpus(copy, N_FILES)


def test_a_failed_datakit_run_is_a_corpus_error(made):
    """A second DataKit run into a prefix whose lease is held is refused by the driver (exit 1)."""
    from marin_assets.datakit.run_spec import LEASE_ENTRY
    from marin_assets.store import Lease
    from marin_assets.store.fsutil import join

    store, corpus, _ = made
    lease = Lease(store.fs, join(corpus.prefix, LEASE_ENTRY))
    assert lease.acquire()
    try:
        with pytest.raises(CorpusError, match=r"the DataKit run over 6 standard-library files into .* failed \(exit 1"):
            materialize_corpus(store, N_FILES, lambda m: None)
    finally:
        lease.release()


def test_the_validation_loss_reads_the_held_out_split(made, tmp_path):
    """Scored on the dataset's validation caches (every shard's, in order), not on its train split."""
    import jax.numpy as jnp
    import numpy as np

    from marin_assets.datakit.datasets import read_dataset
    from marin_assets.experiments.record_files import record_from_dict
    from marin_assets.experiments.runs import run_spec, validation_loss
    from marin_assets.model import loss_fn
    from marin_assets.train.data.token_caches import TokenCache, TokenStream
    from marin_assets.train.loop import train
    from marin_assets.train.restore import load_model_from_checkpoint
    from tests.experiments.test_screen_e2e import RECORD

    _, corpus, _ = made
    spec = run_spec(record_from_dict(RECORD), "baseline", 3.0e7, 0, corpus.vocab_size)
    result = train(spec.config, {"train": corpus.index}, tmp_path / "run", resume=False)
    seq, windows = spec.config.seq_len, 16
    shards = read_dataset(corpus.index).shards
    params, config, bias, _ = load_model_from_checkpoint(result.checkpoint_dir)

    def mean_ce(split: str) -> float:
        stream = TokenStream([TokenCache(s.split(split)) for s in shards])
        tokens = stream.read(np.arange(windows) * seq, seq)
        return float(loss_fn(params, jnp.asarray(tokens, jnp.int32), config, bias)[1]["ce_loss"])

    loss = validation_loss(result.checkpoint_dir, corpus.index, seq, windows)
    assert loss == pytest.approx(mean_ce("validation"), rel=1e-5)
    assert loss != pytest.approx(mean_ce("train"), rel=1e-5)
    too_many = corpus.validation_tokens // seq + 1
    with pytest.raises(ValueError, match=f"the held-out split of .*dataset.json holds {too_many - 1} windows"):
        validation_loss(result.checkpoint_dir, corpus.index, seq, too_many)
