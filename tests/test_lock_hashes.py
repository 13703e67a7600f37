"""Every pinned archive carries a sha256 and set-up installs with --require-hashes (issue 10, item 10)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ("requirements.lock", "requirements-nodeps.lock", "requirements-bootstrap.lock")
PIN = re.compile(r"^([A-Za-z0-9_.\-\[\]]+)==(\S+)")


def _pins(text: str) -> dict[str, list[str]]:
    """{name==version: [sha256 digests]} for one pip-style lock."""
    pins: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        match = PIN.match(line)
        if match:
            current = f"{match.group(1)}=={match.group(2)}"
            pins[current] = []
        elif current and line.strip().startswith("--hash=sha256:"):
            pins[current].append(line.strip().removeprefix("--hash=sha256:").rstrip(" \\"))
    return pins


def test_every_pin_has_a_sha256():
    for lock in LOCKS:
        pins = _pins((ROOT / lock).read_text())
        assert pins, f"{lock} pins nothing"
        unhashed = [pin for pin, digests in pins.items() if not digests]
        assert unhashed == [], f"{lock}: pins without a hash: {unhashed}"
        bad = [d for digests in pins.values() for d in digests if not re.fullmatch(r"[0-9a-f]{64}", d)]
        assert bad == [], f"{lock}: malformed digests {bad[:3]}"


def test_the_parser_sees_a_missing_hash():
    assert _pins("a==1 \\\n    --hash=sha256:" + "0" * 64 + "\nb==2\n") == {"a==1": ["0" * 64], "b==2": []}


def test_setup_installs_every_lock_with_require_hashes():
    makefile = (ROOT / "Makefile").read_text()
    for lock in LOCKS:
        lines = [
            line
            for line in makefile.splitlines()
            if (" install " in line or " sync " in line) and (f"-r {lock}" in line or line.rstrip().endswith(f" {lock}"))
        ]
        assert lines, f"Makefile never installs {lock}"
        assert all("--require-hashes" in line for line in lines), lines
