"""Split raw source files into shard files of bounded size: the unit of per-shard work.

A shard is at most `shard_bytes` bytes of raw lines, cut at line boundaries (a single line
longer than that is a shard of its own), written uncompressed so that its sha256 depends on
its lines only (a gzip header would carry a timestamp). A .txt or .parquet file is one
document / one table, and a .warc(.gz) or .html file holds pages: each is copied whole as one shard.

Keys are "<source>-<file label>-<nnnnn>": the raw file's name, then the shard's number
within that file. A key depends on its own file only, so adding a raw file (wherever its
name sorts) adds shards without renaming any, and lines appended to a file change only its
last shard. (Keys numbered across the sorted files renamed every shard after a new file:
a file that sorted first recomputed the whole corpus.)
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO

from marin_assets.datakit.readers import JSONL_SUFFIXES
from marin_assets.datakit.shards import basename, check_shard_key, join
from marin_assets.datakit.web import HTML_SUFFIXES, WARC_SUFFIXES
from marin_assets.knobs import knob
from marin_assets.numeric_checks import check_int

# A WARC is one shard: its records are split by gzip member or header, not by line. (Common
# Crawl's files are ~1 GiB, ~30,000 pages: about what one worker handles in one task.)
WHOLE_FILE_SUFFIXES = (".txt", ".parquet") + WARC_SUFFIXES + HTML_SUFFIXES


@dataclass(frozen=True)
class ShardingConfig:
    shard_bytes: int = knob(1024 * 1024, help="raw bytes per shard partition (the unit of parallel work and of caching)")

    def __post_init__(self) -> None:
        check_int("ShardingConfig.shard_bytes", self.shard_bytes, 1)


def shard_key(source: str, label: str, index: int) -> str:
    return check_shard_key(f"{source}-{label}-{index:05d}")


LABEL_CHARS = 48
_NOT_KEY_CHAR = re.compile(r"[^A-Za-z0-9._=-]")


def file_label(name: str, hashed: bool = False) -> str:
    """The part of a shard key that names a raw file (`name`: its path under the source):
    the name without the suffix we read it by. A name that has to change to fit a key (a
    folder's "/", other characters, too long, empty), or `hashed`, gets 8 hex digits of the
    name's sha256, so it cannot take the label of a name that fits as it is."""
    suffix = next((s for s in JSONL_SUFFIXES + WHOLE_FILE_SUFFIXES if name.lower().endswith(s)), "")
    stem = name[: len(name) - len(suffix)]
    label = _NOT_KEY_CHAR.sub("_", stem)
    if hashed or label != stem or not label or len(label) > LABEL_CHARS:
        label = f"{label[: LABEL_CHARS - 9]}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"
    return label


def file_labels(raw_files: Sequence[str], root: str | None = None) -> dict[str, str]:
    """{raw file: label}, unique within the list; a label depends on the file's path under
    `root` (the source's folder; its basename without one), not on the other files or on
    the artifact's version. The one exception: names that differ only in the suffix we strip
    ("a.jsonl" and "a.txt") are all hashed while they are side by side."""
    prefix = root.rstrip("/") + "/" if root else ""
    names = {raw: raw[len(prefix) :] if prefix and raw.startswith(prefix) else basename(raw) for raw in raw_files}
    labels = {raw: file_label(name) for raw, name in names.items()}
    shared = {label for label, n in Counter(labels.values()).items() if n > 1}
    return {raw: file_label(names[raw], hashed=True) if label in shared else label for raw, label in labels.items()}


READ_BYTES = 1 << 22


def line_shards(src: BinaryIO, shard_bytes: int) -> Iterator[tuple[bytes, bool]]:
    """The shards of a byte stream of lines, in order, as (piece, ends the shard): each shard
    the longest run of whole lines that fits in shard_bytes (one piece), or one line alone
    when it is longer than that, passed on in pieces as it is read. So memory is about
    shard_bytes + READ_BYTES whatever the input holds: an 18 KB .zst can hold a 384 MiB line
    (the readers quarantine it; the split must not hold it).

    Reads blocks and cuts at the last newline before the limit, instead of iterating lines
    in Python (~3 us a line, most of an index over many small documents)."""
    buf, eof = b"", False
    while True:
        while not eof and len(buf) <= shard_bytes:  # one byte past the limit shows where a line ends
            block = src.read(max(READ_BYTES, shard_bytes + 1 - len(buf)))
            eof = not block
            buf += block
        if len(buf) <= shard_bytes:  # the end of the stream: what is left is the last shard
            if buf:
                yield buf, True
            return
        cut = buf.rfind(b"\n", 0, shard_bytes) + 1
        if not cut:  # the first line is longer than shard_bytes: a shard of its own, streamed
            end = buf.find(b"\n", shard_bytes)
            while end < 0 and not eof:
                yield buf, False
                buf = src.read(READ_BYTES)
                eof = not buf
                end = buf.find(b"\n")
            cut = end + 1 if end >= 0 else len(buf)
        yield buf[:cut], True
        buf = buf[cut:]


def _writer(out_dir: str, key: str, suffix: str, source: str, entries: dict):
    """A new shard file and the index entry its lines are counted into."""
    import fsspec

    file = f"{key}{suffix}"
    entry = {"file": file, "source": source, "bytes": 0, "lines": 0}
    entries[key] = entry
    fs, path = fsspec.core.url_to_fs(join(out_dir, file))
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    return fs.open(path, "wb"), entry, hashlib.sha256()


def split_source(
    source: str, raw_files: Sequence[str], out_dir: str, shard_bytes: int, root: str | None = None
) -> dict[str, dict]:
    """Write the shards of one source into `out_dir`; return {key: {file, sha256, source, bytes, lines}}.
    `root`: the folder the raw files are listed from (file_labels)."""
    import fsspec

    check_int("shard_bytes", shard_bytes, 1)
    entries: dict[str, dict] = {}
    labels = file_labels(sorted(raw_files), root)
    for raw, label in labels.items():
        name = basename(raw).lower()
        if name.endswith(WHOLE_FILE_SUFFIXES):
            suffix = next(s for s in WHOLE_FILE_SUFFIXES if name.endswith(s))
            f, entry, digest = _writer(out_dir, shard_key(source, label, 0), suffix, source, entries)
            fs, raw_path = fsspec.core.url_to_fs(raw)
            with f, fs.open(raw_path, "rb") as src:
                size = 0
                while data := src.read(READ_BYTES):  # in blocks: not held whole
                    f.write(data)
                    digest.update(data)
                    size += len(data)
            entry.update(bytes=size, sha256=digest.hexdigest())
            continue
        if not name.endswith(JSONL_SUFFIXES):
            raise ValueError(
                f"raw file {raw}: cannot shard a {name.rsplit('.', 1)[-1]!r} file; expected one of "
                f"{JSONL_SUFFIXES + WHOLE_FILE_SUFFIXES}"
            )
        fs, raw_path = fsspec.core.url_to_fs(raw)
        # the OpenFile fsspec.open makes; open() itself is typed as returning a list of them
        with fsspec.core.OpenFile(fs, raw_path, "rb", compression="infer") as src:
            new_shard = functools.partial(_line_shard_writer, out_dir, source, label, entries)
            _write_line_shards(line_shards(src, shard_bytes), new_shard)
    return entries


def _line_shard_writer(out_dir: str, source: str, label: str, entries: dict, index: int):
    return _writer(out_dir, shard_key(source, label, index), ".jsonl", source, entries)


def _write_line_shards(pieces: Iterator[tuple[bytes, bool]], new_shard) -> None:
    """Write line_shards' pieces, a new shard file (``new_shard(i)``: file, entry, digest) per shard."""
    i, f, entry, digest, size, newlines = 0, None, {}, hashlib.sha256(), 0, 0
    try:
        for data, ends in pieces:
            if f is None:
                f, entry, digest = new_shard(i)
                size = newlines = 0
            f.write(data)
            digest.update(data)
            size, newlines = size + len(data), newlines + data.count(b"\n")
            if ends:
                f.close()
                f, i = None, i + 1
                entry.update(bytes=size, lines=newlines + (not data.endswith(b"\n")), sha256=digest.hexdigest())
    finally:
        if f is not None:
            f.close()
