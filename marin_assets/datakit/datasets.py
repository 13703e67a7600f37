"""A dataset: one source's tokenized shard caches, indexed in order and read in place.

``datasets/<source>`` writes ``dataset.json``; nothing is copied or re-tokenized::

    {"name": "sotu", "tokenizer": {"sha256", "vocab_size", "eos_id"},
     "shards": [{"key", "version", "path", "documents", "train_tokens", "validation_tokens",
                 "train_docs", "validation_docs"}, ...],          # in shard-key order
     "train_tokens": n, "validation_tokens": n}

``path`` is the shard's ``shards/tokenized`` data directory (``train/``, ``validation/``,
``validation_docs.parquet``) and ``documents`` its ``shards/final`` Parquet file (the text the
caches were made from), both written relative to the index's own directory, so a store
copied elsewhere (another disk, a gs:// bucket) keeps working. The trainer reads a source
as the concatenation of its shards' train caches: the cumulative token counts are the
offsets of its global index (``marin_assets.train.data.token_caches``).
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
from collections.abc import Sequence
from typing import Any

from marin_assets.datakit.levanter_cache import check_cache
from marin_assets.datakit.shards import join, read_table, write_json
from marin_assets.datakit.tokenize import VALIDATION_DOCS
from marin_assets.store.artifact import artifact_damage

INDEX_FILE = "dataset.json"


TOKEN_FIELDS = ("input_ids",)
LOSS_MASK = "loss_mask"  # 1 where a token is a training target (a chat cache's assistant replies)


@dataclasses.dataclass(frozen=True)
class ShardCache:
    """One shard's caches: ``path`` is absolute (a local path or URL) once read."""

    key: str
    version: str
    path: str
    train_tokens: int
    validation_tokens: int
    train_docs: int
    validation_docs: int
    documents: str = ""  # the shard's final documents (Parquet), "" when the index does not say

    def split(self, name: str) -> str:
        return f"{self.path.rstrip('/')}/{name}"


@dataclasses.dataclass(frozen=True)
class Dataset:
    name: str
    shards: tuple[ShardCache, ...]
    tokenizer: dict[str, Any]
    # The caches' fields: ("input_ids",), or a chat dataset's ("input_ids", "loss_mask") (datakit/chat.py).
    fields: tuple[str, ...] = TOKEN_FIELDS

    @property
    def has_loss_mask(self) -> bool:
        return LOSS_MASK in self.fields

    @property
    def train_tokens(self) -> int:
        return sum(s.train_tokens for s in self.shards)

    @property
    def validation_tokens(self) -> int:
        return sum(s.validation_tokens for s in self.shards)

    @property
    def vocab_size(self) -> int | None:
        return self.tokenizer.get("vocab_size")

    def to_json(self, base_dir: str) -> dict:
        return {
            "name": self.name,
            "tokenizer": dict(self.tokenizer),
            "shards": [
                {
                    **dataclasses.asdict(s),
                    "path": relative(s.path, base_dir),
                    "documents": relative(s.documents, base_dir) if s.documents else "",
                }
                for s in self.shards
            ],
            "train_tokens": self.train_tokens,
            "validation_tokens": self.validation_tokens,
            **({"fields": list(self.fields)} if self.fields != TOKEN_FIELDS else {}),
        }  # an older index's bytes stay


def check_shard(shard: ShardCache, split: str, fields: Sequence[str] = TOKEN_FIELDS) -> None:
    """Refuse one split of a shard that is not what the index says (ValueError: 'shard KEY: FILE: reason'):
    its files against its artifact's manifest (when the shard is a store artifact: a file deleted, resized
    or, up to the manifest's digest size, rewritten), then its cache's ledger, offsets and data chunks
    against the index's row and token counts (``levanter_cache.check_cache``). A reader runs this before it
    first reads the split, so a damaged shard fails naming itself instead of being read as zeros."""
    train = split == "train"
    rows, tokens = (shard.train_docs, shard.train_tokens) if train else (shard.validation_docs, shard.validation_tokens)
    try:
        damage = artifact_damage(shard.path, under=split)
        if damage is not None:
            raise ValueError(f"{shard.path}/{damage}")
        check_cache(shard.split(split), tuple(fields), rows, tokens)
    except ValueError as e:
        raise ValueError(f"dataset shard {shard.key}: {e}") from None


def _split_url(url: str) -> tuple[str, str]:
    """("gs://bucket", "/path") for a URL, ("", path) for a local path."""
    if "://" not in url:
        return "", url
    scheme, rest = url.split("://", 1)
    bucket, _, path = rest.partition("/")
    return f"{scheme}://{bucket}", "/" + path


def relative(target: str, base_dir: str) -> str:
    """``target`` relative to ``base_dir`` when both are on one filesystem (bucket), else as is.
    Local paths are made absolute first (from the working directory), so a relative ``--prefix``
    still gets relative paths."""
    import os

    t_root, t_path = _split_url(target)
    b_root, b_path = _split_url(base_dir)
    if not t_root and not b_root:
        t_path, b_path = os.path.abspath(t_path), os.path.abspath(b_path)
    if t_root != b_root or not (t_path.startswith("/") and b_path.startswith("/")):
        return target
    return posixpath.relpath(t_path, b_path)


def resolve(path: str, base_dir: str) -> str:
    """A path written by ``relative`` back to an absolute path or URL."""
    if "://" in path or path.startswith("/"):
        return path
    root, base = _split_url(base_dir)
    return root + posixpath.normpath(posixpath.join(base, path))


def _checked_count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be a non-negative integer, got {value!r}")
    return value


def dataset_from_json(data: Any, base_dir: str, where: str) -> Dataset:
    """A Dataset from parsed dataset.json; ValueError naming the file and field at fault."""
    if not isinstance(data, dict) or not isinstance(data.get("shards"), list) or not isinstance(data.get("name"), str):
        raise ValueError(f"{where}: not a dataset index (want an object with 'name' and a 'shards' list)")
    shards = []
    for i, s in enumerate(data["shards"]):
        if not isinstance(s, dict) or not isinstance(s.get("path"), str) or not isinstance(s.get("key"), str):
            raise ValueError(f"{where}: shards[{i}] needs a 'key' and a 'path'")
        counts = {
            k: _checked_count(s.get(k), f"{where}: shards[{i}].{k}")
            for k in ("train_tokens", "validation_tokens", "train_docs", "validation_docs")
        }
        documents = s.get("documents") or ""
        shards.append(
            ShardCache(
                s["key"],
                str(s.get("version", "")),
                resolve(s["path"], base_dir),
                **counts,
                documents=resolve(documents, base_dir) if documents else "",
            )
        )
    fields = data.get("fields", list(TOKEN_FIELDS))
    if not isinstance(fields, list) or not fields or fields[0] != "input_ids" or not set(fields) <= {*TOKEN_FIELDS, LOSS_MASK}:
        raise ValueError(f"{where}: fields must list 'input_ids' first, then optionally {LOSS_MASK!r}; got {fields!r}")
    return Dataset(data["name"], tuple(shards), dict(data.get("tokenizer") or {}), tuple(fields))


def write_dataset(dataset: Dataset, out_dir: str) -> str:
    """``out_dir/dataset.json`` (paths relative to out_dir); returns its path."""
    path = join(out_dir, INDEX_FILE)
    write_json(dataset.to_json(out_dir), path)
    return path


def index_path(path: str) -> str | None:
    """The dataset.json a path names (the file, or a directory holding one), or None."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    if path.rstrip("/").endswith(INDEX_FILE) and fs.isfile(root):
        return path
    candidate = join(path, INDEX_FILE)
    return candidate if fs.isfile(fsspec.core.url_to_fs(candidate)[1]) else None


def read_dataset(path: str) -> Dataset:
    """The dataset at ``path`` (dataset.json or its directory); FileNotFoundError/ValueError
    naming the file."""
    import fsspec

    found = index_path(path)
    if found is None:
        raise FileNotFoundError(f"{path}: no {INDEX_FILE}")
    fs, fs_path = fsspec.core.url_to_fs(found)
    raw = fs.cat_file(fs_path)
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"{found}: not valid JSON: {e}") from None
    return dataset_from_json(data, found.rstrip("/").rsplit("/", 1)[0] or "/", found)


def combine(name: str, datasets: Sequence[Dataset]) -> Dataset:
    """One dataset made of several (their shards in order), all tokenized by one tokenizer."""
    identities = {d.tokenizer.get("sha256") for d in datasets if d.shards}
    if len(identities) > 1:
        raise ValueError(f"cannot combine datasets tokenized by different tokenizers: {sorted(map(str, identities))}")
    tokenizer = next((d.tokenizer for d in datasets if d.shards), datasets[0].tokenizer if datasets else {})
    fields = (*TOKEN_FIELDS, LOSS_MASK) if datasets and all(d.has_loss_mask for d in datasets) else TOKEN_FIELDS
    return Dataset(name, tuple(s for d in datasets for s in d.shards), dict(tokenizer), fields)


def held_out_ids(dataset: Dataset) -> list[str]:
    """The ids of every document the dataset holds out (its shards' validation_docs.parquet), in shard order."""
    return [
        doc_id
        for shard in dataset.shards
        if shard.validation_docs
        for doc_id in read_table(join(shard.path, VALIDATION_DOCS), ["id"]).column("id").to_pylist()
    ]


def held_out_texts(dataset: Dataset, limit: int, max_chars: int | None = None) -> list[str]:
    """Up to ``limit`` held-out documents of the dataset (its shards' validation splits, in
    shard order, then id order): the texts its validation caches hold, for bits-per-byte;
    each cut to its first ``max_chars`` characters when given (a play is 140,000)."""
    texts: list[str] = []
    for shard in dataset.shards:
        if len(texts) >= limit:
            break
        if shard.validation_docs == 0:
            continue
        table = read_table(join(shard.path, VALIDATION_DOCS), columns=["id", "text"]).sort_by("id")
        texts.extend(table.column("text").to_pylist()[: limit - len(texts)])
    return [t[:max_chars] for t in texts] if max_chars is not None else texts
