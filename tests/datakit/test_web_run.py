"""The README's path with web data, as a new user runs it (slow: two installed commands):
`marin datakit run --input crawl.warc.gz --prefix P --languages en`, then `marin train --cache P/cache`.

The crawl is npm's real HTML documentation (tests/datakit/web_fixture.py) plus a PNG, a PDF, a
truncated page, a warcinfo and a request record; two of its pages are byte-identical copies of two
others, which exact dedup must find. One German page and a page of contact details join the crawl
here, so the language filter and the PII masking have something to do.
"""

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.datakit.web_fixture import write_npm_warc
from tests.support.configs import TINY_TRAIN

pytestmark = pytest.mark.slow

MARIN = shutil.which("marin", path=str(Path(sys.executable).parent)) or "marin"
GERMAN = (
    "<html lang='de'><body><main><h1>Über das Paketverzeichnis</h1><p>Das Verzeichnis enthält alle Pakete, die "
    "Entwickler veröffentlicht haben, und jedes Paket hat eine eigene Seite mit seiner Beschreibung.</p><p>Wer ein "
    "Paket installieren möchte, sucht es zuerst im Verzeichnis und liest dort, welche Versionen es gibt und wie "
    "man es benutzt.</p></main></body></html>"
)
CONTACT = (
    "<html><body><main><h1>Contact the maintainers</h1><p>Write to the release team at release-team@example.org "
    "or call (555) 123-4567 during office hours; the build server answers at 192.168.10.20 on the private "
    "network, and version 1.2.3.4 of the release tools is the one we support.</p><p>We read every message and "
    "answer within two working days, and we keep a public record of the questions that come up most often."
    "</p></main></body></html>"
)


def _append_pages(path: Path, pages: dict[str, str]) -> None:
    """More response records at the end of the crawl, one gzip member each, as a crawler appends them."""
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    with open(path, "ab") as out:
        writer = WARCWriter(out, gzip=True)
        for url, html in pages.items():
            body = html.encode("utf-8")
            http = StatusAndHeaders("200 OK", [("Content-Type", "text/html; charset=utf-8")], "HTTP/1.1")
            writer.write_record(
                writer.create_warc_record(url, "response", payload=io.BytesIO(body), length=len(body), http_headers=http)
            )


def _marin(*args, timeout=600):
    return subprocess.run([MARIN, *args], capture_output=True, text=True, timeout=timeout)


def test_a_crawl_goes_through_the_graph_into_training(tmp_path):
    crawl = tmp_path / "crawl.warc.gz"
    written = write_npm_warc(crawl)
    _append_pages(crawl, {"https://example.de/verzeichnis": GERMAN, "https://example.org/contact": CONTACT})
    prefix = tmp_path / "P"
    run = _marin(
        "datakit",
        "run",
        "--input",
        str(crawl),
        "--prefix",
        str(prefix),
        "--languages",
        "en",
        "--tokenizer",
        "bytes",
        "--workers",
        "2",
        "--json",
    )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout)

    responses = written["responses"] + 2
    assert summary["docs_in"] == responses
    assert summary["quarantine_reasons"] == written["quarantine"] == {"not_html": 2, "truncated_record": 1}
    assert summary["removed"]["language"] == 1  # the German page
    assert summary["removed"]["exact_duplicate"] == 2  # folders.html = npm-global.html, npm-json.html = package-json.html
    assert summary["languages"] == {"de": 1, "en": responses - 3 - 1}
    # The contact page's three, plus what npm's pages hold (example addresses such as i@izs.me), counted here
    # from the reader's own documents: the graph must count each once (copies included: masking precedes dedup).
    assert summary["pii_masked"] == {k: v + 1 for k, v in _pii_in_pages(written["path"]).items()}
    assert summary["docs_in"] == summary["docs_out"] + sum(summary["removed"].values()) + summary["quarantined"]

    texts = _final_texts(summary)
    contact = next(t for t in texts if "Contact the maintainers" in t)
    assert "|||EMAIL_ADDRESS|||" in contact and "|||PHONE_NUMBER|||" in contact and "|||IP_ADDRESS|||" in contact
    assert "release-team@example.org" not in contact and "version 1.2.3.4" in contact
    assert not any("Paketverzeichnis" in t for t in texts)
    link = next(t for t in texts if t.startswith("npm-link"))
    assert "npm command-line interface" not in link  # the banner is boilerplate

    cfg = tmp_path / "train.yaml"
    cfg.write_text(yaml.safe_dump(dict(TINY_TRAIN, num_steps=8, checkpoint_every_steps=8)))
    train = _marin("train", "--cache", summary["cache"], "--config", str(cfg), "--out", str(tmp_path / "R"))
    assert train.returncode == 0, train.stderr[-3000:]
    result = json.loads(train.stdout.strip().splitlines()[-1])
    assert result["final_step"] == 8 and result["tokens"] == 8 * TINY_TRAIN["batch_size"] * TINY_TRAIN["seq_len"]


def _pii_in_pages(path: str) -> dict[str, int]:
    from marin_assets.datakit.pii import mask_pii
    from marin_assets.datakit.readers import Document, iter_file

    counts = {"email": 0, "ip": 0, "phone": 0}
    for doc in iter_file(path):
        if isinstance(doc, Document) and "example." not in doc.metadata["url"]:
            for kind, n in mask_pii(doc.text)[1].items():
                counts[kind] += n
    return counts


def _final_texts(summary) -> list[str]:
    """The text of every document the run kept (what its caches were tokenized from)."""
    from marin_assets.datakit.datasets import read_dataset
    from marin_assets.datakit.shards import read_table

    return [t for s in read_dataset(summary["cache"]).shards for t in read_table(s.documents).column("text").to_pylist()]
