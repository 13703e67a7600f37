"""PII masking: e-mail addresses, US phone numbers and IPv4 addresses replaced by placeholders.

Follows Dolma's regex PII tagger (allenai/dolma python/dolma/taggers/pii.py, the
``pii_regex_with_counts_fast_v2`` tagger its v1.5 mix used) and its mixer's placeholders
(|||EMAIL_ADDRESS|||, |||PHONE_NUMBER|||, |||IP_ADDRESS|||, the special tokens OLMo's tokenizer
carries). Kept from Dolma: the three kinds and their placeholders; an e-mail address is a local
part, "@", and a domain with at least one dot; a phone number is a US ten-digit number written
as area code, exchange and line ((555) 123-4567, 555-123-4567, 555.123.4567); an IPv4 address
is four dotted octets of 0-255; a pattern runs only when a cheap check says it could match
(here: an "@"; four dotted digit groups; three digits, a separator and four digits, or "+1"
and ten digits). mask_shard makes that check for all rows at once with Arrow's RE2 and turns
only the rows that pass into Python strings.

Where Dolma's rule is wrong, and what we do instead:

- Span edges. Dolma's e-mail span swallows the whitespace and punctuation around the address
  (its regex needs whitespace after it, so an address at the very end of a text, or followed
  only by a period, is missed), and its phone span starts with the whitespace before the
  number; its mixer puts the spaces back by replacing with " |||EMAIL_ADDRESS||| ". We
  replace the address and nothing else, with the bare placeholder, at any position.
- E-mail inside a URL. Dolma's local part is any run of non-space characters, so
  "mailto:jane@x.org" and "https://example.com/u/jane.doe@example.org/profile" are masked
  whole, URL included. Our local part is the usual address characters (letters, digits,
  . _ % + -), so only the address goes: "mailto:|||EMAIL_ADDRESS|||",
  "https://example.com/u/|||EMAIL_ADDRESS|||/profile". The userinfo of a URL
  ("https://user@host.com/", "ftp://user:pass@host/") names a login at that host, not a mailbox,
  and is left as it is (credentials are a secrets problem, not one of these three kinds).
  Nor is "logo@2x.png" an address (a high-density image's file name, common in extracted
  HTML): a top-level label that is an image extension does not make a domain.
- Phone numbers. Dolma's pattern has no right edge and needs no separator, so any ten
  digits after a space match (the first ten of a credit-card number, a Unix timestamp, an
  ISBN-10), and it leaves the "+1" of "+1 555 123 4567" behind. We require the number to stand
  alone (no digit, letter or dotted/dashed digit group on either side), require a separator
  or parentheses between the groups (a bare ten-digit run is more often an id than a phone;
  "+15551234567", with its country code, is a phone), and take "+1"/"1" into the match.
- IP addresses. Dolma's pattern has no edges either: "999.1.1.1" loses "99.1.1.1",
  "v2.10.0.1" loses "2.10.0.1", and "1.2.3.4" inside "1.2.3.4.5" is masked. Ours must stand
  alone (no word character or "digit." before it, no ".digit" or word character after), so
  five-part versions, "v"-prefixed versions and out-of-range octets are left alone; octets
  have no leading zeros. A version named as one ("version 1.2.3.4", "build 10.0.0.1",
  "section 1.2.3.4") is not an address: the word just before the match decides.
- Dolma's non-fast tagger also dropped phone and IP matches with "isbn", "doi" or "#" within
  100 characters, and every phone match in a text holding any URL; the fast tagger does not,
  and neither do we: the edges above already keep ISBNs and DOIs out, and a URL elsewhere in
  a page says nothing about a phone number. Dolma's mix also dropped documents with more than
  five PII spans; that is a filter, not masking, and is not done here.

Idempotence: a match's guards read the characters beside it, so masking one match can unblock
its neighbour ("jane@x.org.10.0.0.1": the domain seems to run on into the digits until the
address after it is masked). mask_pii therefore repeats its round until a round changes
nothing (a changing round removes at least one "@" or digit, so this ends; a second round is
needed only where two matches touch), so its output is a fixpoint: masking masked text
changes nothing.
"""

from __future__ import annotations

import re

from marin_assets.datakit.arrow_strings import string_array
from marin_assets.datakit.normalize import doc_id, schema
from marin_assets.datakit.shards import read_table, write_table

PII_KINDS: tuple[str, ...] = ("email", "phone", "ip")
PLACEHOLDERS = {"email": "|||EMAIL_ADDRESS|||", "phone": "|||PHONE_NUMBER|||", "ip": "|||IP_ADDRESS|||"}

# A URL's scheme and userinfo ("https://user:pw@"): matched first so its "@" is not taken for
# an address's. A URL's path ("https://host/u/jane@x.org") holds a "/", so it is not userinfo.
_URL_USERINFO = r"(?P<userinfo>(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@]+@)"
# The local part starts where its run of address characters starts (not mid-run, not after an
# inner dot), so a long run is scanned once, not once per character. The domain is the whole
# dotted run and ends in an alphabetic top-level label, not an image file's extension
# ("logo@2x.png" names a high-density image); nothing that could continue it follows.
_EMAIL = (
    r"(?P<email>(?<![\w%+-])(?<![\w%+-]\.)[\w%+-][\w.%+-]*"
    r"@[\w-]+(?:\.[\w-]+)*\.(?!(?i:png|jpe?g|gif|svg|webp)\b)[^\W\d_]{2,}(?![\w%+@-])(?!\.[\w%+-]))"
)
_EMAIL_RE = re.compile(f"{_URL_USERINFO}|{_EMAIL}")

# Octets and phone digits are ASCII digits (\d would take any script's); the guards use \w and
# \d in full, so a match glued to another script's word or digits is left alone.
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IP_RE = re.compile(rf"(?<!\w)(?<!\d\.){_OCTET}(?:\.{_OCTET}){{3}}(?!\w)(?!\.\d)")
# Words that make the dotted number after them a version or a section number, not an address.
_NOT_AN_ADDRESS_BEFORE = re.compile(
    r"(?<!\w)(?:v|ver|version|release|rel|build|rev|revision|firmware|kernel|update|patch|"
    r"section|sec|chapter|ch|figure|fig|table|eq|equation|clause|article|art|rule|step|item|paragraph|para|appendix|§)"
    r"[\s.:#]*\Z",
    re.IGNORECASE,
)
_CONTEXT_CHARS = 24  # the longest keyword plus its punctuation and spaces, with room to spare

# Area code ("(555)" or "555" and a separator), exchange, separator, line; "+1"/"1" before it.
# Not glued to a word or to a longer dashed/dotted digit chain on either side. The leading
# lookahead lets the engine skip to the next digit, "(" or "+" instead of trying every position.
_PHONE_RE = re.compile(
    r"(?=[0-9(+])(?<![\w+])(?<!\d[-.])"
    r"(?:\+1[0-9]{10}|(?:\+1[-. ]?|1[-. ])?(?:\([0-9]{3}\) ?|[0-9]{3}[-. ])[0-9]{3}[-. ][0-9]{4})"
    r"(?!\w)(?![-.]\d)"
)

# Seeds: a piece of text every match of a kind holds, cheap to look for. They are also RE2
# syntax, so mask_shard asks Arrow which rows hold any seed and leaves the others untouched.
# Each Python pattern starts with a character class and no alternation, which lets the engine
# skip ahead to the next digit (or "+") instead of trying every position.
_IP_SEED = r"[0-9]\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]"
_LINE_SEED = r"[0-9][0-9][0-9][-. ][0-9]{4}"  # exchange and line
_E164_SEED = r"\+1[0-9]{10}"
_IP_SEED_RE, _LINE_SEED_RE, _E164_SEED_RE = map(re.compile, (_IP_SEED, _LINE_SEED, _E164_SEED))
_WHITESPACE = (" ", "\n")  # the common ones: a token start found from these alone is only earlier
_SPACE_RE = re.compile(r"\s")


def mask_pii(text: str) -> tuple[str, dict[str, int]]:
    """`text` with every e-mail address, phone number and IPv4 address replaced by its
    placeholder, and how many of each were replaced (all of PII_KINDS as keys)."""
    counts = dict.fromkeys(PII_KINDS, 0)
    while True:  # to a fixpoint: see the module docstring
        masked = _mask_round(text, counts)
        if masked == text:
            return text, counts
        text = masked


def _mask_round(text: str, counts: dict[str, int]) -> str:
    # E-mail first: an address's digits ("jo.555-123-4567@x.org") are the address's, not a phone's.
    if "@" in text:
        text = _mask_emails(text, counts)
    if _IP_SEED_RE.search(text):
        text = _mask_ips(text, counts)
    if _LINE_SEED_RE.search(text) or ("+1" in text and _E164_SEED_RE.search(text)):
        text = _mask_phones(text, counts)
    return text


def _mask_emails(text: str, counts: dict[str, int]) -> str:
    """Scan only the whitespace-free token around each "@": no address or userinfo spans
    whitespace, and the guards read the real neighbours, so this finds what a scan of the whole
    text would, without running the pattern at every position of a long text."""
    pieces: list[str] = []
    done = scanned = 0
    at = text.find("@")
    while at != -1:
        # Searches bounded by the last token's end, so a text of many addresses is read once.
        start = max(scanned, *(text.rfind(ch, scanned, at) + 1 for ch in _WHITESPACE))
        space = _SPACE_RE.search(text, at)
        scanned = space.start() if space else len(text)
        for match in _EMAIL_RE.finditer(text, start, scanned):
            if match.lastgroup == "email":
                pieces += [text[done : match.start()], PLACEHOLDERS["email"]]
                done = match.end()
                counts["email"] += 1
        at = text.find("@", scanned)
    return "".join(pieces) + text[done:] if pieces else text


def _mask_ips(text: str, counts: dict[str, int]) -> str:
    def replace(match: re.Match) -> str:
        start = match.start()
        if _NOT_AN_ADDRESS_BEFORE.search(match.string, max(0, start - _CONTEXT_CHARS), start):
            return match.group(0)
        counts["ip"] += 1
        return PLACEHOLDERS["ip"]

    return _IP_RE.sub(replace, text)


def _mask_phones(text: str, counts: dict[str, int]) -> str:
    masked, n = _PHONE_RE.subn(PLACEHOLDERS["phone"], text)
    counts["phone"] += n
    return masked


def _candidate_rows(texts):
    """The rows (an Arrow index array) of a string column that hold an "@" or a seed: Arrow's
    RE2 looks at every row in one call, and only these rows become Python strings."""
    import pyarrow.compute as pc

    # pyarrow.compute makes its functions at import time, so the type checker cannot see them.
    seeds = f"{_IP_SEED}|{_LINE_SEED}|{_E164_SEED}"
    has_at = pc.match_substring(texts, "@")  # pyright: ignore[reportAttributeAccessIssue]
    seeded = pc.or_(has_at, pc.match_substring_regex(texts, seeds))  # pyright: ignore[reportAttributeAccessIssue]
    return pc.indices_nonzero(seeded)  # pyright: ignore[reportAttributeAccessIssue]


def mask_shard(in_path: str, out_path: str) -> dict:
    """Mask one normalized shard into `out_path`: same schema and row order, masked text, the
    id of a changed text recomputed from it (an unchanged one keeps its id). Returns
    {"docs", "docs_masked", "pii": {kind: count}}."""
    import pyarrow as pa

    table = read_table(in_path)
    text_column = table.column("text")
    rows = _candidate_rows(text_column)
    totals = dict.fromkeys(PII_KINDS, 0)
    changed: dict[int, str] = {}
    for row, text in zip(rows.to_pylist(), text_column.take(rows).to_pylist(), strict=True):
        masked, counts = mask_pii(text)
        if masked != text:
            changed[row] = masked
            for kind, n in counts.items():
                totals[kind] += n
    ids, texts = table.column("id"), text_column
    if changed:  # rebuild the two columns; a shard with nothing to mask is written as it was read
        id_list, text_list = ids.to_pylist(), text_column.to_pylist()
        for row, masked in changed.items():
            id_list[row], text_list[row] = doc_id(masked), masked
        ids, texts = string_array(id_list), string_array(text_list, large=True)
    columns = [ids, texts] + [table.column(name) for name in ("source", "source_id", "metadata")]
    write_table(pa.Table.from_arrays(columns, schema=schema()), out_path)
    return {"docs": table.num_rows, "docs_masked": len(changed), "pii": totals}
