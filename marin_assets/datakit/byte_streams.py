"""Bounded-memory byte streams for the readers: plain, gzip and zstd files as chunks, and
chunks as lines.

Memory is bounded by the caller's limit, not by the input: decompression returns at most
one chunk per call (a 400 KB gzip holding 400 MB without a newline costs one chunk), and a
line longer than the limit is skipped up to its newline without being buffered.
"""

from __future__ import annotations

from collections.abc import Iterator


def split_lines(chunks: Iterator[bytes], limit: int) -> Iterator[bytes | int]:
    """Split a byte stream into lines (without the newline), holding at most `limit` bytes.

    A line longer than `limit` is not buffered: its bytes are counted up to the next newline
    and its length (an int) comes out instead of its content. Memory is one chunk plus one
    line of at most `limit` bytes, whatever the input holds.
    """
    buf = bytearray()
    over = -1  # >= 0 while skipping a too-long line: its length so far
    for chunk in chunks:
        parts = chunk.split(b"\n")
        last = len(parts) - 1
        for i, part in enumerate(parts):
            if over >= 0:
                over += len(part)
            elif len(buf) + len(part) > limit:
                over = len(buf) + len(part)
                buf = bytearray()
            elif i < last and not buf:
                yield part  # a whole line inside one chunk: no copy
                continue
            else:
                buf += part
            if i < last:
                yield over if over >= 0 else bytes(buf)
                buf, over = bytearray(), -1
        del parts
    if over >= 0:
        yield over
    elif buf:
        yield bytes(buf)


def byte_chunks(file: str, size: int = 1 << 20) -> Iterator[bytes]:
    """Decompressed bytes of a .jsonl / .jsonl.gz / .jsonl.zst file, in chunks of at most ~size."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(file)
    with fs.open(path, "rb") as f:
        if file.endswith(".zst"):
            yield from _zstd_chunks(f, size)
        elif file.endswith(".gz"):
            yield from _gzip_chunks(f, size)
        else:
            while chunk := f.read(size):
                yield chunk


def _gzip_chunks(raw, size: int) -> Iterator[bytes]:
    """Stream-decompress gzip so every byte before a cut is yielded, then raise EOFError.

    Each decompress call returns at most `size` bytes (the rest of the input waits in
    `unconsumed_tail`), so a gzip bomb costs one chunk of memory, not its expanded size.
    """
    import zlib

    def new():
        return zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip header and trailer

    dobj, fed = new(), False
    while data := raw.read(size):
        while data:
            try:
                out = dobj.decompress(data, size)
            except zlib.error as e:
                raise ValueError(f"not valid gzip data: {e}") from e
            fed = True
            if out:
                yield out
            if dobj.eof:  # a member ended; gzip files may hold several
                data = dobj.unused_data
                dobj, fed = new(), False
            else:
                data = dobj.unconsumed_tail
    if fed and not dobj.eof:
        raise EOFError("gzip stream ended before its end-of-stream marker")


ZSTD_MAGIC = 0xFD2FB528
ZSTD_BLOCK_MAX = 128 * 1024  # RFC 8878: no block decompresses to more than this


class _ByteSource:
    """Buffered reads of exact byte counts from a file object (at most one refill ahead)."""

    def __init__(self, raw, size: int):
        self.raw, self.size, self.buf, self.pos = raw, size, bytearray(), 0

    def take(self, n: int) -> bytes:
        """Exactly n bytes, or fewer at the end of the input."""
        while len(self.buf) - self.pos < n:
            data = self.raw.read(max(self.size, n - (len(self.buf) - self.pos)))
            if not data:
                break
            del self.buf[: self.pos]
            self.pos = 0
            self.buf += data
        out = bytes(self.buf[self.pos : self.pos + n])
        self.pos += len(out)
        return out

    def skip(self, n: int) -> int:
        """Discard n bytes without holding them; return how many were there."""
        skipped = 0
        while skipped < n:
            got = len(self.take(min(n - skipped, self.size)))
            if not got:
                break
            skipped += got
        return skipped


def _zstd_chunks(raw, size: int) -> Iterator[bytes]:
    """Decompress zstd frame by frame, one block per call, so no call returns more than 128 KiB.

    zstandard's decompressobj returns a whole input chunk's output at once (a 1 MiB chunk of
    RLE blocks is gigabytes) and its stream reader ends quietly on a cut-off frame. Walking the
    frame format (RFC 8878: header, 3-byte block headers, optional checksum) bounds the output
    of each call and tells a complete frame from a truncated one (EOFError).
    """
    import zstandard

    src = _ByteSource(raw, size)
    dctx = zstandard.ZstdDecompressor()
    while magic_bytes := src.take(4):
        if len(magic_bytes) < 4:
            raise EOFError("zstd stream ended inside a frame's magic number")
        magic = int.from_bytes(magic_bytes, "little")
        if 0x184D2A50 <= magic <= 0x184D2A5F:  # skippable frame: 4-byte length, then payload
            length = src.take(4)
            if len(length) < 4 or src.skip(int.from_bytes(length, "little")) < int.from_bytes(length, "little"):
                raise EOFError("zstd stream ended inside a skippable frame")
            continue
        if magic != ZSTD_MAGIC:
            raise ValueError(f"not zstd data (magic {magic_bytes.hex()})")
        descriptor = src.take(1)
        if not descriptor:
            raise EOFError("zstd stream ended inside a frame header")
        fhd = descriptor[0]
        if fhd & 0x08:
            raise ValueError("not valid zstd data: reserved frame header bit set")
        single_segment = (fhd >> 5) & 1
        fcs_size = (1 if single_segment else 0, 2, 4, 8)[fhd >> 6]
        header_rest = (0 if single_segment else 1) + (0, 1, 2, 4)[fhd & 3] + fcs_size
        rest = src.take(header_rest)
        if len(rest) < header_rest:
            raise EOFError("zstd stream ended inside a frame header")
        dobj = dctx.decompressobj()
        pending = magic_bytes + descriptor + rest  # fed together with the first block
        while True:
            block_header = src.take(3)
            if len(block_header) < 3:
                raise EOFError("zstd stream ended in the middle of a frame")
            value = int.from_bytes(block_header, "little")
            last, block_type, block_size = value & 1, (value >> 1) & 3, value >> 3
            if block_type == 3 or block_size > ZSTD_BLOCK_MAX:
                raise ValueError(f"not valid zstd data: block type {block_type}, size {block_size}")
            content_size = 1 if block_type == 1 else block_size
            content = src.take(content_size)
            if len(content) < content_size:
                raise EOFError("zstd stream ended in the middle of a frame")
            if last and (fhd >> 2) & 1:
                checksum = src.take(4)
                if len(checksum) < 4:
                    raise EOFError("zstd stream ended before the frame checksum")
                content += checksum
            out = dobj.decompress(pending + block_header + content)
            pending = b""
            if out:
                yield out
            if last:
                break
