"""Split raw source files into shard files of bounded size: the unit of per-shard work.

A shard is at most `shard_bytes` bytes of raw lines, cut at line boundaries (a single line
longer than that is a shard of its own), written uncompressed so that its sha256 depends on
its lines only (a gzip header would carry a timestamp). Keys are "<source>-<nnnnn>",
numbered in the order of the sorted raw files, so a raw file added after the others adds
shards without renaming any. A .txt or .parquet file is one document / one table and is
copied whole as one shard.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import BinaryIO

from marin_assets.datakit.readers import JSONL_SUFFIXES
from marin_assets.datakit.shards import basename, check_shard_key, join
from marin_assets.numeric_checks import check_int

WHOLE_FILE_SUFFIXES = (".txt", ".parquet")


def shard_key(source: str, index: int) -> str:
    return check_shard_key(f"{source}-{index:05d}")


READ_BYTES = 1 << 22


def line_shards(src: BinaryIO, shard_bytes: int) -> Iterator[bytes]:
    """The shards of a byte stream of lines, in order: each the longest run of whole lines
    that fits in shard_bytes, or one line alone when it is longer than that.

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
                yield buf
            return
        cut = buf.rfind(b"\n", 0, shard_bytes) + 1
        if not cut:  # the first line is longer than shard_bytes: it is a shard of its own
            end = buf.find(b"\n", shard_bytes)
            while end < 0 and not eof:
                block, start = src.read(READ_BYTES), len(buf)
                eof = not block
                buf += block
                end = buf.find(b"\n", start)
            cut = end + 1 if end >= 0 else len(buf)
        yield buf[:cut]
        buf = buf[cut:]


def _writer(out_dir: str, key: str, suffix: str, source: str, entries: dict):
    """A new shard file and the index entry its lines are counted into."""
    import fsspec

    file = f"{key}{suffix}"
    entry = {"file": file, "source": source, "bytes": 0, "lines": 0}
    entries[key] = entry
    return fsspec.open(join(out_dir, file), "wb").open(), entry, hashlib.sha256()


def split_source(source: str, raw_files: Sequence[str], out_dir: str, shard_bytes: int) -> dict[str, dict]:
    """Write the shards of one source into `out_dir`; return {key: {file, sha256, source, bytes, lines}}."""
    import fsspec

    check_int("shard_bytes", shard_bytes, 1)
    entries: dict[str, dict] = {}
    for raw in sorted(raw_files):
        name = basename(raw).lower()
        if name.endswith(WHOLE_FILE_SUFFIXES):
            suffix = next(s for s in WHOLE_FILE_SUFFIXES if name.endswith(s))
            f, entry, digest = _writer(out_dir, shard_key(source, len(entries)), suffix, source, entries)
            with f, fsspec.open(raw, "rb") as src:
                data = src.read()
                f.write(data)
                digest.update(data)
            entry.update(bytes=len(data), sha256=digest.hexdigest())
            continue
        if not name.endswith(JSONL_SUFFIXES):
            raise ValueError(f"raw file {raw}: cannot shard a {name.rsplit('.', 1)[-1]!r} file; expected one of "
                             f"{JSONL_SUFFIXES + WHOLE_FILE_SUFFIXES}")
        with fsspec.open(raw, "rb", compression="infer") as src:
            for data in line_shards(src, shard_bytes):
                f, entry, digest = _writer(out_dir, shard_key(source, len(entries)), ".jsonl", source, entries)
                with f:
                    f.write(data)
                digest.update(data)
                entry.update(bytes=len(data), lines=data.count(b"\n") + (not data.endswith(b"\n")), sha256=digest.hexdigest())
    return entries
