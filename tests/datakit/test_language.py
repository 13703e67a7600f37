import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marin_assets.datakit.language import LanguageConfig, detector, identify, identify_languages, known_codes, parse_languages
from marin_assets.datakit.normalize import NormalizeConfig, normalize, schema
from marin_assets.datakit.shards import basename, list_shards, read_table, write_table

PARAGRAPHS = {
    "en": "The library opens at nine in the morning and closes late in the evening. Students come to read quietly, "
    "borrow books for their classes and meet friends in the small cafe near the entrance. On weekends the reading "
    "room is usually full, so it is better to arrive early if you want a seat by the window.",
    "de": "Die Bibliothek öffnet morgens um neun Uhr und schließt erst spät am Abend. Die Studenten kommen, um in Ruhe "
    "zu lesen, Bücher für ihre Kurse auszuleihen und Freunde im kleinen Café neben dem Eingang zu treffen. Am "
    "Wochenende ist der Lesesaal meistens voll, deshalb sollte man früh kommen, wenn man einen Platz am Fenster möchte.",
    "fr": "La bibliothèque ouvre à neuf heures du matin et ferme tard le soir. Les étudiants viennent pour lire en "
    "silence, emprunter des livres pour leurs cours et retrouver des amis dans le petit café près de l'entrée. Le "
    "week-end, la salle de lecture est souvent pleine, alors il vaut mieux arriver tôt pour avoir une place près de la fenêtre.",
    "es": "La biblioteca abre a las nueve de la mañana y cierra tarde por la noche. Los estudiantes vienen a leer en "
    "silencio, tomar prestados libros para sus clases y encontrarse con amigos en la pequeña cafetería junto a la "
    "entrada. Los fines de semana la sala de lectura suele estar llena, así que conviene llegar temprano si se quiere "
    "un sitio junto a la ventana.",
    "ja": "図書館は朝九時に開き、夜遅くに閉まります。学生たちは静かに本を読んだり、授業のための本を借りたり、"
    "入口の近くにある小さな喫茶店で友達と会ったりします。週末は閲覧室がたいてい満席なので、窓際の席に座りたいなら早めに来たほうがいいです。",
}
# No letters at all: digits, operators and brackets, as in a table of numbers or a code fragment.
NO_LETTERS = "1234 5678 / 90 = 13.7; {[(42 + 17) * 3]} >= 0.25 % 2024-05-06 12:30:00 | 3.14159 - 2.71828"
TEXTS = [*PARAGRAPHS.values(), NO_LETTERS]
EXPECTED = [*PARAGRAPHS, ""]


def _shards(tmp_path, texts, write_jsonl, shard_docs=100_000):
    write_jsonl(tmp_path / "docs.jsonl", [{"text": t} for t in texts])
    normalize(str(tmp_path / "docs.jsonl"), str(tmp_path / "n"), NormalizeConfig(source="docs", shard_docs=shard_docs))
    return list_shards(str(tmp_path / "n"))


def _attributes(out_dir, shard):
    return read_table(str(out_dir / basename(shard))).to_pylist()


def test_each_language_is_identified_and_text_without_letters_is_not(tmp_path, write_jsonl):
    shards = _shards(tmp_path, TEXTS, write_jsonl)
    counts = identify_languages(shards, str(tmp_path / "lang"), LanguageConfig(languages="all"))
    rows = _attributes(tmp_path / "lang", shards[0])
    assert [r["language"] for r in rows] == EXPECTED
    for r in rows[:-1]:
        assert math.isfinite(r["language_score"]) and 0.9 <= r["language_score"] <= 1.0
        assert r["off_language"] is False
    assert rows[-1]["language_score"] == 0.0
    assert counts == {
        "docs": 6,
        "identified": True,
        "languages": {"": 1, "de": 1, "en": 1, "es": 1, "fr": 1, "ja": 1},
        "off_language": 0,
        "keep": [],
    }
    assert json.loads((tmp_path / "lang" / "_counts.json").read_text()) == counts


def test_without_a_keep_list_nothing_is_identified_or_removed(tmp_path, write_jsonl, monkeypatch):
    """The default (no --languages): lingua does not run, the attributes say so with nulls, not with ""."""
    from marin_assets.datakit import language

    shards = _shards(tmp_path, TEXTS, write_jsonl)
    monkeypatch.setattr(language, "identify", lambda text: pytest.fail("identified without being asked"))
    counts = identify_languages(shards, str(tmp_path / "lang"), LanguageConfig())
    rows = _attributes(tmp_path / "lang", shards[0])
    assert [(r["language"], r["language_score"], r["off_language"]) for r in rows] == [(None, None, False)] * 6
    assert counts == {"docs": 6, "identified": False, "languages": {}, "off_language": 0, "keep": []}


def test_all_stands_alone():
    assert LanguageConfig(languages=" ALL ").keep == frozenset() and LanguageConfig(languages="all").identify
    assert not LanguageConfig().identify and not LanguageConfig(languages=" , ").identify
    with pytest.raises(ValueError, match="'all' keeps every language"):
        LanguageConfig(languages="all,en")


def test_keep_list_flags_every_other_language_and_the_unidentified(tmp_path, write_jsonl):
    shards = _shards(tmp_path, TEXTS, write_jsonl)
    counts = identify_languages(shards, str(tmp_path / "lang"), LanguageConfig(languages=" EN, de "))
    rows = _attributes(tmp_path / "lang", shards[0])
    assert [r["off_language"] for r in rows] == [False, False, True, True, True, True]
    assert counts["off_language"] == 4
    assert counts["keep"] == ["de", "en"]
    assert counts["languages"] == {"": 1, "de": 1, "en": 1, "es": 1, "fr": 1, "ja": 1}


def test_attribute_rows_align_with_shard_rows_in_every_shard(tmp_path, write_jsonl):
    texts = [f"{PARAGRAPHS[code]} ({i})" for i in range(3) for code in PARAGRAPHS]
    shards = _shards(tmp_path, texts, write_jsonl, shard_docs=4)
    assert len(shards) == 4
    (tmp_path / "lang").mkdir()
    (tmp_path / "lang" / "part-00009-of-00010.parquet").write_text("left by an earlier run")
    counts = identify_languages(shards, str(tmp_path / "lang"), LanguageConfig(languages="ja"))
    assert sorted(p.name for p in (tmp_path / "lang").iterdir()) == sorted([basename(s) for s in shards] + ["_counts.json"])
    for shard in shards:
        docs, attrs = read_table(shard).to_pylist(), _attributes(tmp_path / "lang", shard)
        assert [a["id"] for a in attrs] == [d["id"] for d in docs]
        assert [a["source_id"] for a in attrs] == [d["source_id"] for d in docs]
        assert [a["off_language"] for a in attrs] == [a["language"] != "ja" for a in attrs]
    assert counts == {
        "docs": 15,
        "identified": True,
        "languages": dict.fromkeys(["de", "en", "es", "fr", "ja"], 3),
        "off_language": 12,
        "keep": ["ja"],
    }


def test_an_empty_shard_gives_an_empty_attribute_file(tmp_path):
    shard = str(tmp_path / "n" / "part-00000-of-00001.parquet")
    (tmp_path / "n").mkdir()
    write_table(schema().empty_table(), shard)
    counts = identify_languages([shard], str(tmp_path / "lang"), LanguageConfig(languages="en"))
    attrs = read_table(str(tmp_path / "lang" / basename(shard)))
    assert attrs.num_rows == 0
    assert attrs.schema.names == ["id", "source_id", "language", "language_score", "off_language"]
    assert [str(t) for t in attrs.schema.types] == ["string", "string", "string", "float", "bool"]
    assert counts == {"docs": 0, "identified": True, "languages": {}, "off_language": 0, "keep": ["en"]}


def test_only_the_first_max_chars_characters_are_read(tmp_path, write_jsonl):
    english_then_german = PARAGRAPHS["en"] + " " + PARAGRAPHS["de"] * 4
    shards = _shards(tmp_path, [english_then_german], write_jsonl)
    head = identify_languages(shards, str(tmp_path / "head"), LanguageConfig(languages="all", max_chars=len(PARAGRAPHS["en"])))
    whole = identify_languages(shards, str(tmp_path / "whole"), LanguageConfig(languages="all", max_chars=10_000))
    assert head["languages"] == {"en": 1} and whole["languages"] == {"de": 1}


def test_identify_agrees_with_lingua_on_which_language(tmp_path):
    for text in [*TEXTS, "", "   "]:
        found = detector().detect_language_of(text)
        code = found.iso_code_639_1.name.lower() if found is not None else ""
        assert identify(text)[0] == code


@pytest.mark.parametrize("codes, named", [("en,xx", "'xx'"), ("fy", "'fy'"), ("de, english", "'english'"), ("e n", "'e n'")])
def test_unknown_codes_are_named(codes, named):
    with pytest.raises(ValueError, match=f"LanguageConfig.languages: .*{named}.*it knows af, ar, .*lingua.Language"):
        LanguageConfig(languages=codes)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_chars": 0}, "max_chars must be in"),
        ({"max_chars": 2.5}, "max_chars must be int"),
        ({"languages": None}, "languages must be str"),
    ],
)
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LanguageConfig(**kwargs)


def test_lingua_knows_the_languages_we_test_and_not_frisian():
    assert {"en", "de", "fr", "es", "ja"} <= known_codes() and "fy" not in known_codes()
    assert len(known_codes()) == 75


def _spelled(code: str, upper: list[bool]) -> str:
    return "".join(c.upper() if up else c for c, up in zip(code, upper, strict=True))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(sorted(known_codes())), st.lists(st.booleans(), min_size=2, max_size=2),
                  st.sampled_from(["", " ", "\t", "  \n"]), st.sampled_from(["", " ", "\t"])),
        max_size=8,
    ),
    st.booleans(),
)  # fmt: skip
def test_a_keep_list_of_known_codes_round_trips(items, trailing_comma):
    text = ",".join(f"{before}{_spelled(code, upper)}{after}" for code, upper, before, after in items) + (
        "," if trailing_comma else ""
    )
    expected = frozenset(code for code, *_ in items)
    assert parse_languages(text) == expected
    assert LanguageConfig(languages=text).keep == expected
    assert parse_languages(",".join(sorted(expected))) == expected


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=4).filter(lambda c: c not in known_codes()))
def test_any_unknown_code_is_refused_by_name(code):
    with pytest.raises(ValueError, match=f"'{code}'"):
        parse_languages(f"en,{code}")
