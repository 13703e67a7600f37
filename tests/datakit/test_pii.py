import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marin_assets.datakit.normalize import NormalizeConfig, normalize, schema
from marin_assets.datakit.pii import PII_KINDS, PLACEHOLDERS, mask_pii, mask_shard
from marin_assets.datakit.shards import list_shards, read_table, write_table

EMAIL, PHONE, IP = PLACEHOLDERS["email"], PLACEHOLDERS["phone"], PLACEHOLDERS["ip"]


def counts(email: int = 0, phone: int = 0, ip: int = 0) -> dict[str, int]:
    return {"email": email, "phone": phone, "ip": ip}


def test_kinds_and_dolma_placeholders():
    assert PII_KINDS == ("email", "phone", "ip")
    assert PLACEHOLDERS == {"email": "|||EMAIL_ADDRESS|||", "phone": "|||PHONE_NUMBER|||", "ip": "|||IP_ADDRESS|||"}


def test_text_without_pii_has_every_kind_counted_zero():
    assert mask_pii("Nothing to see here.") == ("Nothing to see here.", counts())
    assert mask_pii("") == ("", counts())


@pytest.mark.parametrize(
    "text, masked",
    [
        ("Write to jane.doe@example.com today.", f"Write to {EMAIL} today."),
        ("Write to jane.doe@example.com.", f"Write to {EMAIL}."),  # Dolma misses an address before a final period
        ("jane@example.com", EMAIL),  # and one at the very end of a text
        ("(j_smith+news@mail.example.co.uk),", f"({EMAIL}),"),
        ("Bob <bob-99%ops@sub.example.org>", f"Bob <{EMAIL}>"),
        ("one a@b.io two c@d.io", f"one {EMAIL} two {EMAIL}"),
        ("josé@exämple.de", EMAIL),
        ("@jane@mastodon.social", f"@{EMAIL}"),  # a fediverse handle holds an address
    ],
)
def test_email_addresses(text, masked):
    assert mask_pii(text) == (masked, counts(email=masked.count(EMAIL)))


@pytest.mark.parametrize(
    "text",
    ["a@b", "user@localhost", "see @handle and @ signs", "logo@2x.png", "icon@3x.JPG", "x@y.c0m", "name@.com"],
)
def test_not_email_addresses(text):
    assert mask_pii(text) == (text, counts())


@pytest.mark.parametrize(
    "text, masked",
    [
        # The address goes, the URL around it stays (Dolma masks the whole URL, its local part being any non-space run).
        ("mailto:jane@example.org", f"mailto:{EMAIL}"),
        ('<a href="mailto:jane@example.org?subject=hi">mail</a>', f'<a href="mailto:{EMAIL}?subject=hi">mail</a>'),
        ("https://example.com/u/jane.doe@example.org/profile", f"https://example.com/u/{EMAIL}/profile"),
        # A URL's userinfo is a login at the host, not a mailbox.
        ("https://user@host.com/", "https://user@host.com/"),
        ("ftp://user:secret@ftp.example.com/file", "ftp://user:secret@ftp.example.com/file"),
        ("https://user@host.com/u/jane@example.org", f"https://user@host.com/u/{EMAIL}"),
    ],
)
def test_email_addresses_in_urls(text, masked):
    assert mask_pii(text) == (masked, counts(email=masked.count(EMAIL)))


@pytest.mark.parametrize(
    "phone",
    [
        "(555) 123-4567",
        "(555)123-4567",
        "555-123-4567",
        "555.123.4567",
        "555 123 4567",
        "+1 555 123 4567",  # Dolma leaves the "+1" behind
        "+1 (555) 123-4567",
        "+1-555-123-4567",
        "1-800-555-1234",
        "+15551234567",
    ],
)
def test_us_phone_numbers(phone):
    assert mask_pii(f"Call {phone} now.") == (f"Call {PHONE} now.", counts(phone=1))
    assert mask_pii(phone) == (PHONE, counts(phone=1))


@pytest.mark.parametrize(
    "text",
    [
        "5551234567",  # a bare ten-digit run: an id more often than a phone (Dolma masks it)
        "posted at 1700000000",  # a Unix timestamp
        "call 555-1234",  # no area code
        "id555-123-4567",  # glued to a word
        "part 12-555-123-4567 and 555-123-4567-89",  # inside longer digit chains
        "+44 20 7946 0958",  # not a US number
    ],
)
def test_not_phone_numbers(text):
    assert mask_pii(text) == (text, counts())


@pytest.mark.parametrize(
    "text, masked",
    [
        ("server at 192.168.0.1", f"server at {IP}"),
        ("server at 192.168.0.1.", f"server at {IP}."),
        ("http://10.0.0.5:8080/", f"http://{IP}:8080/"),
        ("DNS 8.8.8.8 and 255.255.255.0", f"DNS {IP} and {IP}"),
        ("range 10.0.0.1-10.0.0.255", f"range {IP}-{IP}"),
        ("x@[203.0.113.7]", f"x@[{IP}]"),
    ],
)
def test_ipv4_addresses(text, masked):
    assert mask_pii(text) == (masked, counts(ip=masked.count(IP)))


@pytest.mark.parametrize(
    "text",
    [
        "version 1.2.3.4",
        "Version: 10.0.0.1",
        "build 1.2.3.4",
        "see section 1.2.3.4",
        "v2.10.0.1",
        "Python 3.11.7",
        "dotted section 1.2.3",
        "release 1.2.3.4.5",  # five parts
        "OID 1.3.6.1.4.1",
        "999.1.1.1",  # out of range: Dolma masks the "99.1.1.1" inside it
        "256.1.1.1",
        "1.2.3.256",
        "01.02.03.04",  # leading zeros
    ],
)
def test_not_ip_addresses(text):
    assert mask_pii(text) == (text, counts())


@pytest.mark.parametrize(
    "text",
    [
        "on 2024-03-15, 03/15/2024, 15.03.2024 and 2024.03.15",
        "at 12:30:45 on 1/2/2024",
        "ISBN 978-0-306-40615-7, ISBN 0-306-40615-2, ISBN 0306406152, ISBN 9780306406157",
        "doi:10.1000/182",
        "card 4111 1111 1111 1111, 4111-1111-1111-1111 or 4111111111111111",  # not one of the three kinds
        "pi is 3.14159 and e is 2.71828; 1,234,567.89 people",
    ],
)
def test_dates_isbns_and_long_numbers_are_left_alone(text):
    assert mask_pii(text) == (text, counts())


def test_counts_per_kind_in_mixed_text():
    text = (
        "Reach jane@example.org or bob@example.com, call (555) 123-4567 or +1 555 987 6543 or 555.111.2222; "
        "servers 10.0.0.1 and 192.168.1.20 run version 1.2.3.4. ISBN 0-306-40615-2."
    )
    expected = (
        f"Reach {EMAIL} or {EMAIL}, call {PHONE} or {PHONE} or {PHONE}; "
        f"servers {IP} and {IP} run version 1.2.3.4. ISBN 0-306-40615-2."
    )
    assert mask_pii(text) == (expected, counts(email=2, phone=3, ip=2))


def test_an_address_keeps_its_digits_from_the_phone_and_ip_patterns():
    assert mask_pii("jo.555-123-4567@x.org") == (EMAIL, counts(email=1))
    assert mask_pii("admin.10.0.0.1@x.org") == (EMAIL, counts(email=1))


def test_touching_matches_are_all_masked():
    # Each blocks the other until one is masked; mask_pii repeats to a fixpoint.
    assert mask_pii("jane@x.org.10.0.0.1") == (f"{EMAIL}.{IP}", counts(email=1, ip=1))
    assert mask_pii("555-123-4567-(555) 123-4567") == (f"{PHONE}-{PHONE}", counts(phone=2))


PII_SNIPPETS = [
    "jane@example.com", "a.b@c.io", "555-123-4567", "(555) 123-4567", "+1 555 123 4567", "+15551234567",
    "192.168.0.1", "10.0.0.5", "1.2.3.4.5", "version 1.2.3.4", "https://user@host.com/", "mailto:x@y.org", "999.1.1.1",
]  # fmt: skip
# Short fragments and the characters the patterns turn on, so the pieces touch and overlap.
pii_texts = st.lists(
    st.one_of(st.sampled_from(PII_SNIPPETS), st.text(alphabet="ab1259@.-+()/: |x", max_size=8)), max_size=12
).map("".join)


@settings(max_examples=300, deadline=None)
@given(pii_texts)
def test_masking_is_idempotent(text):
    masked, _ = mask_pii(text)
    assert mask_pii(masked) == (masked, counts())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(PII_SNIPPETS), st.text(alphabet="ab1.-+/:@ \t\n\xa0", max_size=8)), max_size=12))
def test_email_scan_of_tokens_equals_a_scan_of_the_whole_text(parts):
    from marin_assets.datakit import pii

    text = "".join(parts)
    whole = pii._EMAIL_RE.sub(lambda m: m.group(0) if m.lastgroup == "userinfo" else EMAIL, text)
    assert pii._mask_emails(text, counts()) == whole


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Nd", "Cs"), blacklist_characters="@")))
def test_text_without_at_sign_or_digits_is_unchanged(text):
    assert mask_pii(text) == (text, counts())


@settings(max_examples=200, deadline=None)
@given(pii_texts)
def test_counts_are_the_placeholders_inserted(text):
    masked, found = mask_pii(text)
    for kind in PII_KINDS:
        assert masked.count(PLACEHOLDERS[kind]) - text.count(PLACEHOLDERS[kind]) == found[kind]


def test_mask_shard(tmp_path, write_jsonl):
    texts = [
        "Plain prose with nothing private.",
        "Mail jane@example.org or call (555) 123-4567.",
        "Version 1.2.3.4 of the server at 10.0.0.5.",
        "Another plain line, 2024-03-15.",
        "Two: a@b.io, c@d.io.",
    ]
    write_jsonl(tmp_path / "in.jsonl", [{"text": t, "id": f"src-{i}", "lang": "en"} for i, t in enumerate(texts)])
    normalize(str(tmp_path / "in.jsonl"), str(tmp_path / "norm"), NormalizeConfig(source="demo"))
    [shard] = list_shards(str(tmp_path / "norm"))
    before = read_table(shard).to_pylist()
    out = str(tmp_path / "masked" / "part-00000-of-00001.parquet")

    result = mask_shard(shard, out)

    assert result == {"docs": 5, "docs_masked": 3, "pii": counts(email=3, phone=1, ip=1)}
    table = read_table(out)
    assert table.schema == schema()
    after = table.to_pylist()
    assert [r["text"] for r in after] == [
        texts[0],
        f"Mail {EMAIL} or call {PHONE}.",
        f"Version 1.2.3.4 of the server at {IP}.",
        texts[3],
        f"Two: {EMAIL}, {EMAIL}.",
    ]
    for old, new in zip(before, after, strict=True):
        assert new["id"] == xxhash.xxh3_128_hexdigest(new["text"].encode("utf-8"))
        assert (new["id"] == old["id"]) == (new["text"] == old["text"])  # unchanged texts keep their ids
        assert (new["source"], new["source_id"], new["metadata"]) == (old["source"], old["source_id"], old["metadata"])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(pii_texts, st.text(max_size=30)), max_size=20))
def test_mask_shard_round_trip(tmp_path, texts):
    import pyarrow as pa

    from marin_assets.datakit.normalize import doc_id

    rows = {
        "id": [doc_id(t) for t in texts],
        "text": texts,
        "source": ["s"] * len(texts),
        "source_id": [str(i) for i in range(len(texts))],
        "metadata": ["{}"] * len(texts),
    }
    write_table(pa.table(rows, schema=schema()), str(tmp_path / "in.parquet"))

    result = mask_shard(str(tmp_path / "in.parquet"), str(tmp_path / "out.parquet"))

    after = read_table(str(tmp_path / "out.parquet")).to_pylist()
    expected = [mask_pii(t) for t in texts]
    assert [r["source_id"] for r in after] == rows["source_id"]
    assert [r["text"] for r in after] == [masked for masked, _ in expected]
    assert [r["id"] for r in after] == [doc_id(r["text"]) for r in after]
    assert result["docs"] == len(texts)
    assert result["docs_masked"] == sum(masked != t for (masked, _), t in zip(expected, texts, strict=True))
    assert result["pii"] == {kind: sum(found[kind] for _, found in expected) for kind in PII_KINDS}
