"""The screens' corpus: Python standard-library sources, made a dataset by the DataKit.

It ships with every Python, so a screen needs no download. The first ``n`` top-level
``*.py`` files of the standard library (by name) become one JSONL file, a record per
paragraph (blank-line separated, > 40 characters) with the id ``<file>#<nnnnn>`` (the
paragraph's place in its file, zero-padded so ids sort in file order: exact dedup keeps the
lowest id). The file is written once into a folder named by its own digest,
``<store>/experiments/corpus/<sha256[:16]>/input/stdlib.jsonl``, and the DataKit graph runs
over it into that folder (the driver `marin datakit run` starts, on the same knobs'
configs): normalize, exact and fuzzy dedup, decontamination (no eval sets: a screen scores on
the dataset's own held-out split), no quality filter (threshold 0), the byte tokenizer (one
id per UTF-8 byte, EOS 256, vocabulary 257), and ``VALIDATION_FRACTION`` of the documents
held out by the DataKit's document id (a hash of the normalized text), so paragraphs of one
file can fall on both sides. The runs train and score on its dataset index
(``cache/dataset.json``), read in place by the trainer; its content digest is the corpus
version the runs hash.

Importing this module is cheap (standard library only): the DataKit is imported where it runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from marin_assets.datakit.datasets import INDEX_FILE, dataset_from_json
from marin_assets.datakit.driver import run_driver
from marin_assets.datakit.quality import QualityScoreConfig
from marin_assets.datakit.tokenize import TokenizeConfig, TokenizerChoice
from marin_assets.local_workers import local_workers
from marin_assets.store import SUCCESS, canonical_json
from marin_assets.store.fsutil import filesystem, join, list_files, read_json, unstrip, write_bytes_atomic

if TYPE_CHECKING:
    from marin_assets.datakit.run_spec import RunSpec
    from marin_assets.store import ArtifactStore

CORPUS_KEY = "experiments/corpus"  # the Dagster asset; its DataKit runs live under <store>/experiments/corpus/
TOKENIZER = "bytes"
VOCAB_SIZE = 257  # the byte tokenizer's: 256 bytes + EOS (the runs read theirs from the dataset)
VALIDATION_FRACTION = 0.1  # of the documents, by document id (the DataKit's split); the old corpus held out 10% of files
INPUT_NAME = "stdlib.jsonl"  # its stem names the DataKit source: sources/stdlib, datasets/stdlib


class CorpusError(RuntimeError):
    """The DataKit run that makes the corpus failed (its own error line is on stderr)."""


@dataclasses.dataclass(frozen=True)
class Corpus:
    """A DataKit dataset the screens read: where its index is, its digest and its sizes."""

    index: str  # the dataset index (dataset.json) the runs read in place
    version: str  # sha256 of the index's canonical JSON: shard versions, token counts, tokenizer
    train_tokens: int
    validation_tokens: int
    vocab_size: int
    prefix: str  # the DataKit run's prefix (its store, cache/, summary.json)


def stdlib_files(n_files: int) -> list[Path]:
    """The first ``n_files`` standard-library ``*.py`` files by name (same list every call)."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    if len(files) < n_files:
        raise ValueError(f"the standard library has {len(files)} top-level .py files, fewer than {n_files}")
    return files[:n_files]


def paragraphs(path: Path) -> list[tuple[int, str]]:
    """(place in the file, text) of each paragraph of more than 40 non-blank characters."""
    text = path.read_text(encoding="utf-8", errors="replace").replace("\0", "")
    return [(i, p) for i, p in enumerate(text.split("\n\n")) if len(p.strip()) > 40]


def corpus_jsonl(n_files: int) -> bytes:
    """The DataKit input: one JSON line {"id", "text"} per paragraph, files in name order."""
    lines = [
        json.dumps({"id": f"{f.name}#{i:05d}", "text": text}, ensure_ascii=False)
        for f in stdlib_files(n_files)
        for i, text in paragraphs(f)
    ]
    return ("\n".join(lines) + "\n").encode("utf-8")


def corpus_prefix(store: ArtifactStore, digest: str) -> str:
    """The DataKit prefix of the input whose sha256 is ``digest`` (a URL for object stores)."""
    return unstrip(store.fs, join(store.root, *CORPUS_KEY.split("/"), digest[:16]))


def corpus_spec(prefix: str, workers: int = 1) -> RunSpec:
    """The DataKit run over the input under ``prefix``: the screens' knobs, the rest the defaults."""
    from marin_assets.datakit.run_spec import RunSpec  # deferred (import cost): pyarrow

    return RunSpec(
        inputs=(join(prefix, "input", INPUT_NAME),),
        evals=(),
        prefix=prefix,
        tokenizer=TokenizerChoice(TOKENIZER),
        quality=QualityScoreConfig(threshold=0.0),
        tokenize=TokenizeConfig(validation_fraction=VALIDATION_FRACTION),
        workers=workers,
        quiet=True,
    )


def materialize_corpus(store: ArtifactStore, n_files: int, log: Callable[[str], None] = print) -> Corpus:
    """Write the input of ``n_files`` files (once), run the DataKit over it, return the dataset.

    A rerun finds every DataKit artifact up to date (cache hits) and computes none. CorpusError
    when the DataKit run fails.
    """
    data = corpus_jsonl(n_files)
    digest = hashlib.sha256(data).hexdigest()
    prefix = corpus_prefix(store, digest)
    _write_input(prefix, data, digest)
    summary = io.StringIO()
    log(f"corpus: the DataKit over {n_files} standard-library files ({len(data)} bytes of JSONL) into {prefix}")
    before = committed_artifacts(prefix)
    status = run_driver(corpus_spec(prefix, local_workers()), stdout=summary)
    if status != 0:
        raise CorpusError(
            f"the DataKit run over {n_files} standard-library files into {prefix} failed (exit {status}; its error is on stderr)"
        )
    corpus = _open(prefix, n_files)
    computed = committed_artifacts(prefix) - before
    counts = json.loads(summary.getvalue().strip().splitlines()[-1])
    log(
        f"corpus: {counts['docs_in']} documents in, {counts['docs_out']} kept (removed {counts['removed']}); "
        f"{corpus.train_tokens} train and {corpus.validation_tokens} validation tokens, version {corpus.version[:16]}; "
        + (f"{computed} DataKit artifact(s) computed" if computed else "every DataKit artifact was a cache hit")
    )
    return corpus


def open_corpus(store: ArtifactStore, n_files: int) -> Corpus:
    """The dataset ``materialize_corpus`` made of ``n_files`` files, without running anything;
    FileNotFoundError when there is none made with the screens' current settings."""
    digest = hashlib.sha256(corpus_jsonl(n_files)).hexdigest()
    return _open(corpus_prefix(store, digest), n_files)


def _write_input(prefix: str, data: bytes, digest: str) -> None:
    """The input file, unless a complete copy is there already (its folder is named by its digest)."""
    fs, path = filesystem(join(prefix, "input", INPUT_NAME))
    if fs.exists(path):
        with fs.open(path, "rb") as f:
            existing = f.read()
        if isinstance(existing, bytes) and hashlib.sha256(existing).hexdigest() == digest:
            return
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    write_bytes_atomic(fs, path, data)


def committed_artifacts(prefix: str) -> int:
    """How many committed artifacts (STATUS.json says SUCCESS) the DataKit store under ``prefix`` holds."""
    from marin_assets.datakit.run_spec import STORE_ENTRY  # deferred (import cost): pyarrow

    fs, root = filesystem(join(prefix, STORE_ENTRY))
    statuses = [join(root, rel) for rel, _ in list_files(fs, root) if rel.rsplit("/", 1)[-1] == "STATUS.json"]
    return sum(1 for path in statuses if (read_json(fs, path) or {}).get("status") == SUCCESS)


def _open(prefix: str, n_files: int) -> Corpus:
    """The dataset under ``prefix``, refused unless the last DataKit run there had the screens' settings."""
    from marin_assets.datakit.run_spec import CACHE_ENTRY, RUN_FILE  # deferred (import cost): pyarrow

    fs, run_path = filesystem(join(prefix, RUN_FILE))
    ran, wanted = read_json(fs, run_path), json.loads(corpus_spec(prefix).to_json())
    if not isinstance(ran, dict) or _settings(ran) != _settings(wanted):
        why = "none was made" if ran is None else "the last one had other settings"
        raise FileNotFoundError(
            f"{prefix}: no DataKit dataset of the first {n_files} standard-library files with the "
            f"screens' settings ({why}); materialise {CORPUS_KEY} or run `marin experiment screen`"
        )
    index = join(prefix, CACHE_ENTRY, INDEX_FILE)
    raw = read_json(fs, filesystem(index)[1])
    dataset = dataset_from_json(raw, join(prefix, CACHE_ENTRY), index)
    if not dataset.shards or dataset.vocab_size is None:
        raise ValueError(f"{index}: the corpus dataset has {len(dataset.shards)} shards and vocabulary {dataset.vocab_size}")
    return Corpus(
        index,
        hashlib.sha256(canonical_json(raw).encode("utf-8")).hexdigest(),
        dataset.train_tokens,
        dataset.validation_tokens,
        int(dataset.vocab_size),
        prefix,
    )


def _settings(spec: dict) -> dict:
    """A run spec's settings: what decides the dataset (not how many workers made it, nor its logging)."""
    return {k: v for k, v in spec.items() if k not in ("workers", "quiet")}
