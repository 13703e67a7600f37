"""Web data in: WARC files of crawled pages and HTML files -> Documents.

Everyone who trains on the web (Common Crawl through DCLM, FineWeb, Dolma, Marin) starts from
WARC files of HTTP responses. A WARC is read with fastwarc (the Rust reader resiliparse ships);
the HTML of each response is turned into its main text with resiliparse's extractor (what Marin
and DCLM use: main content only, boilerplate such as navigation and footers removed), or with
trafilatura when a run asks for it (``ReaderConfig.extractor``).

Counting follows the readers' rule, records in = kept + quarantined, with a WARC response as the
record: one that is not HTML (``not_html``), that the crawler cut short or whose payload ends
before its declared length (``truncated_record``), or whose page has no main text
(``no_main_text``) is quarantined with its byte offset in the file. A record fastwarc cannot parse
(``malformed_record``) is quarantined the same way and reading goes on at the next record: the
next gzip member of a .warc.gz (Common Crawl compresses each record on its own), the next
"WARC/1." header line of a plain .warc. The other record types (warcinfo, request, metadata,
revisit) hold no page; they are counted in ReadStats.other_records, as blank JSONL lines are.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from marin_assets.datakit.quarantine import QuarantineRecord
from marin_assets.datakit.records import Document, check_text, short_name

if TYPE_CHECKING:
    from marin_assets.datakit.readers import ReadStats
    from marin_assets.datakit.records import ReaderConfig

WARC_SUFFIXES = (".warc", ".warc.gz")
HTML_SUFFIXES = (".html", ".htm")
EXTRACTORS = ("resiliparse", "trafilatura")
HTML_TYPES = ("text/html", "application/xhtml+xml")
GZIP_MEMBER = b"\x1f\x8b\x08"  # a gzip member's magic and deflate method: where a .warc.gz record can start
WARC_HEADER = b"WARC/1."  # the version line every record of a plain .warc starts with
SCAN_BYTES = 1 << 20
# resiliparse's extract_plain_text options: main content only, block structure kept, no link targets
# or image alt texts (a page's words, not its markup, as DCLM extracts).
RESILIPARSE_OPTIONS: dict[str, Any] = {"preserve_formatting": True, "main_content": True, "links": False, "alt_texts": False}
# <html lang="de-AT">: the page's declared language, looked for in its first 4 KiB.
HTML_LANG = re.compile(r"<html\b[^>]*?\blang\s*=\s*[\"']?([A-Za-z]{2,3}(?:-[A-Za-z0-9]{1,8})*)", re.IGNORECASE)


def decode_html(html: bytes, charset: str | None = None) -> str:
    """The page as text: its declared charset, else UTF-8 when the bytes are valid UTF-8 (most of the
    web), else what uchardet detects. resiliparse's bytes_to_str falls back to UTF-8 and Windows-1252
    and never raises on bad bytes; the strict UTF-8 try first skips the detector on most pages."""
    from resiliparse.parse.encoding import bytes_to_str, detect_encoding  # pyright: ignore[reportMissingModuleSource]

    if charset is None or charset.lower().replace("-", "").replace("_", "") == "utf8":
        try:
            return html.decode("utf-8")
        except UnicodeDecodeError:
            if charset is not None:
                return bytes_to_str(html, "utf-8")
    return bytes_to_str(html, charset or detect_encoding(html) or "utf-8")


def extract_html(html: bytes | str, extractor: str = "resiliparse", charset: str | None = None) -> str:
    """The main text of one HTML page, paragraphs separated by blank lines ("" when it has none).

    resiliparse keeps block structure (preserve_formatting) and drops link targets and image
    alt texts, as DCLM's extraction does: a page's words, not its markup."""
    text = html if isinstance(html, str) else decode_html(html, charset)
    if extractor == "resiliparse":
        from resiliparse.extract.html2text import extract_plain_text  # pyright: ignore[reportMissingModuleSource]

        return extract_plain_text(text, **RESILIPARSE_OPTIONS)
    if extractor == "trafilatura":
        import trafilatura

        return trafilatura.extract(text, include_comments=False, include_tables=True) or ""
    raise ValueError(f"unknown HTML extractor {extractor!r}: expected one of {EXTRACTORS}")


def iter_html(file: str, config: ReaderConfig, stats: ReadStats) -> Iterator[Document | QuarantineRecord]:
    """One .html file: one document, its main text (the file's name is its id)."""
    stats.records += 1
    with _open_at(file, 0) as f:
        raw = f.read(config.max_doc_bytes + 1)
    if len(raw) > config.max_doc_bytes:
        yield QuarantineRecord(file, None, "too_large", f"more than max_doc_bytes={config.max_doc_bytes} bytes of HTML")
        return
    yield _page_document(raw, None, file, None, short_name(file), {}, config)


def iter_warc(file: str, config: ReaderConfig, stats: ReadStats) -> Iterator[Document | QuarantineRecord]:
    """Every response record of one .warc / .warc.gz file as a Document or a QuarantineRecord."""
    from fastwarc.warc import WarcRecordType  # pyright: ignore[reportMissingModuleSource]

    for record, offset, problem in _records(file):
        if problem is not None:
            stats.records += 1
            yield QuarantineRecord(file, None, "malformed_record", f"at byte {offset}: {problem}"[:300])
            continue
        if record.record_type != WarcRecordType.response:
            stats.other_records += 1
            continue
        stats.records += 1
        yield _response_document(record, offset, file, config)


def _response_document(record, offset: int, file: str, config: ReaderConfig) -> Document | QuarantineRecord:
    """One response record: its page, or the reason it holds none. The declared content type is
    judged before the payload is read, so a crawl's PDFs and images cost no decompression; a
    record cut inside its HTTP headers declares none, and is found short when read."""
    headers = record.headers
    where = f"record at byte {offset}"
    content_type = (record.http_content_type or "").lower() if record.is_http else ""
    if content_type and content_type not in HTML_TYPES:
        return QuarantineRecord(file, None, "not_html", f"{where}: content type {content_type or 'none'!r}")
    if headers.get("WARC-Truncated"):
        return QuarantineRecord(file, None, "truncated_record", f"{where}: WARC-Truncated: {headers.get('WARC-Truncated')}")
    if record.content_length > config.max_doc_bytes:
        return QuarantineRecord(file, None, "too_large", f"{where}: {record.content_length} bytes > max_doc_bytes")
    try:
        html = record.reader.read()
    except OSError as e:  # the compressed stream breaks inside this record's payload
        return QuarantineRecord(file, None, "truncated_record", f"{where}: {e}"[:300])
    if len(html) < record.content_length:  # the file ends inside the record
        return QuarantineRecord(file, None, "truncated_record", f"{where}: {len(html)} of {record.content_length} bytes")
    if content_type not in HTML_TYPES:  # no HTTP headers, or none declaring a type
        return QuarantineRecord(file, None, "not_html", f"{where}: no content type declared")
    metadata = {
        "url": headers.get("WARC-Target-URI", ""),
        "crawl_date": headers.get("WARC-Date", ""),
        "content_type": content_type,
    }
    language = record.http_headers.get("Content-Language")
    record_id = headers.get("WARC-Record-ID") or f"{short_name(file)}@{offset}"
    return _page_document(html, record.http_charset, file, offset, record_id, metadata, config, language)


def _page_document(
    html: bytes,
    charset: str | None,
    file: str,
    offset: int | None,
    source_id: str,
    metadata: dict,
    config: ReaderConfig,
    language: str | None = None,
) -> Document | QuarantineRecord:
    """The Document of one page's HTML, or why not: no main text, or text the readers refuse."""
    page = decode_html(html, charset)
    language = language or _html_lang(page)
    text = extract_html(page, config.extractor)
    if not text.strip():
        return QuarantineRecord(file, None, "no_main_text", f"{_where(offset)}{len(html)} bytes of HTML, no main text")
    data = check_text(text, file, None, config)
    if isinstance(data, QuarantineRecord):
        return QuarantineRecord(file, None, data.reason, f"{_where(offset)}{data.detail}"[:300])
    if language:
        metadata = {**metadata, "language": language.strip().lower()[:35]}
    return Document(text, source_id, metadata, file, None, data)


def _where(offset: int | None) -> str:
    return f"record at byte {offset}: " if offset is not None else ""


def _html_lang(page: str) -> str | None:
    """The lang attribute of the <html> element, when the page declares one."""
    found = HTML_LANG.search(page, 0, 4096)
    return found.group(1) if found else None


def _records(file: str) -> Iterator[tuple]:
    """(record, byte offset, None) for each record fastwarc parses, and (None, offset, why) for
    each stretch it cannot, after which reading resumes at the next record boundary (module
    docstring). A failure after a good record is judged at the next attempt: if that attempt
    fails at once, the record at the boundary is the broken one; if it reads, the bytes between
    the good record and the boundary were."""
    from fastwarc.warc import ArchiveIterator  # pyright: ignore[reportMissingModuleSource]

    boundary = GZIP_MEMBER if file.lower().endswith(".gz") else WARC_HEADER
    start: int | None = 0
    after: tuple[int, str] | None = None  # (offset of the last good record, the error) not yet judged
    while start is not None:
        last = None
        try:
            with _open_at(file, start) as stream:
                for record in ArchiveIterator(stream, parse_http=True):
                    if after is not None:
                        yield None, after[0] + 1, f"unparsable bytes after the record at byte {after[0]}: {after[1]}"
                        after = None
                    last = record.stream_pos  # fastwarc counts from the file's start, also after a seek
                    yield record, last, None
            break
        except OSError as e:  # fastwarc: an unparsable header, a broken gzip member
            error = f"{type(e).__name__}: {e}"
            if last is None:
                yield None, start, error
                after, start = None, _next_boundary(file, start + 1, boundary)
            else:
                after, start = (last, error), _next_boundary(file, last + 1, boundary)
    if after is not None:
        yield None, after[0] + 1, f"unparsable bytes after the record at byte {after[0]}, to the end: {after[1]}"


def _open_at(file: str, offset: int):
    import fsspec

    fs, path = fsspec.core.url_to_fs(file)
    f = fs.open(path, "rb")
    f.seek(offset)
    return f


def _next_boundary(file: str, offset: int, marker: bytes) -> int | None:
    """The first offset >= `offset` where `marker` starts (a record can start there), or None."""
    with _open_at(file, offset) as f:
        position, tail = offset, b""
        while block := f.read(SCAN_BYTES):
            data = tail + block
            found = data.find(marker)
            if found >= 0:
                return position - len(tail) + found
            tail = data[-(len(marker) - 1) :]
            position += len(block)
    return None


def write_warc(pages: Iterable[tuple[str, bytes]], path: str, crawl_date: str) -> int:
    """Write (url, HTML) pages as a crawl's .warc.gz: one response record per page, each its own
    gzip member (as Common Crawl writes them), ids and dates fixed so the same pages give the same
    bytes (an artifact's version follows its content). Returns how many records were written."""
    import gzip
    import hashlib
    import io

    import fsspec
    from fastwarc.warc import WarcRecord, WarcRecordType  # pyright: ignore[reportMissingModuleSource]

    written = 0
    with fsspec.open(path, "wb") as out:
        for url, html in pages:
            record = WarcRecord()
            urn = "uuid:" + hashlib.sha256(url.encode()).hexdigest()[:32]
            record.init_headers(record_type=WarcRecordType.response, record_urn=urn.encode())
            record.headers["WARC-Date"] = crawl_date
            record.headers["WARC-Target-URI"] = url
            record.headers["Content-Type"] = "application/http; msgtype=response"
            http = b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n\r\n"
            record.set_bytes_content(http + html)
            buffer = io.BytesIO()
            record.write(buffer, checksum_data=True)
            out.write(gzip.compress(buffer.getvalue(), mtime=0))  # pyright: ignore[reportAttributeAccessIssue]
            written += 1
    return written
