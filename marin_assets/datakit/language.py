"""Language identification: lingua (n-gram models shipped in its wheel) over the first characters of each document.

The attribute is co-partitioned with its shard, like the quality scores: id, source_id, language
(lowercase ISO 639-1, "" when lingua finds none: text without letters, such as digits and
punctuation), language_score (lingua's confidence in that language, 0 when none) and off_language
(a keep-list is set and the language is not on it; an unidentified document is off-language then).

Identification is asked for: `languages` is a keep-list ("en,de"), "all" (identify, remove none)
or empty, the default, where no document is identified (language and score are null, none is
off-language). At ~500-850 documents/s per core lingua is the slowest step of the graph by far
(measured in benchmarks/datakit_web.py: 32 of 48 s on 16,000 JSONL documents), so a run that
neither filters nor asks for the attributes does not pay for it, as decontamination without an
eval set does not.

The detector, measured on 2 shared cores (idle unless said) over ~2 KB documents in en/de/fr/es/ja:

    mode, text given              models loaded, RSS   docs/s, single call   docs/s, *_in_parallel
    high accuracy, whole 2 KB     5.6-5.9 s, 1.3 GB    599                   1173
    low accuracy, whole 2 KB      0.2 s, 90 MB         603                   1089
    low accuracy, first 1000 ch.  0.2 s, 90 MB         856                   1422
      ... with one core busy                           746                   790
      ... at load 5 (other jobs)                       484-543               338-409

On texts this long both modes run at the same speed and give a confidence of 1.0; on the first
1000 characters of 204 package READMEs they pick the same language every time. High accuracy pays
off on short texts only: it is right on 78% / 95% / 100% of 2 / 4 / 8-word snippets where low accuracy
is right on 50% / 80% / 96% (and on a line of URLs it says English at 0.07 where low says Yoruba at
0.99). Left lazy, high accuracy loads its models (8.1 s, 0.9 GB) at the first short document.
We take low accuracy: a shard pod has 1 CPU and 2 GiB (assets/datakit/common.py SHARD_TAGS), where
1.3 GB of models would leave too little for the shard itself, and pretraining documents are rarely a
handful of words. For the same reason we make single calls: the parallel one gains only on idle
cores, and a 1-CPU pod, or a machine busy with other shards, has none to give.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from marin_assets.datakit.shards import basename, join, read_table, reset_dir, write_json, write_table
from marin_assets.knobs import knob
from marin_assets.numeric_checks import check_field_types, check_int

UNIDENTIFIED = ""
ALL = "all"  # identify every document, keep them all


@functools.cache
def known_codes() -> frozenset[str]:
    """The lowercase ISO 639-1 codes of every language lingua identifies."""
    from lingua import Language

    return frozenset(language.iso_code_639_1.name.lower() for language in Language.all())


def parse_languages(text: str) -> frozenset[str]:
    """The codes of a comma-separated keep-list: items are stripped and lowercased, empty items skipped
    (so "" and "all" keep every document); a code lingua does not know is a ValueError naming it."""
    codes = frozenset(item.strip().lower() for item in text.split(",")) - {""}
    if ALL in codes:
        if len(codes) > 1:
            raise ValueError(f"LanguageConfig.languages: {ALL!r} keeps every language; it cannot be listed with codes ({text!r})")
        return frozenset()
    unknown = sorted(codes - known_codes())
    if unknown:
        raise ValueError(
            f"LanguageConfig.languages: lingua identifies no language with ISO 639-1 code "
            f"{', '.join(map(repr, unknown))}; it knows {', '.join(sorted(known_codes()))} (lingua.Language lists them)"
        )
    return codes


@dataclass(frozen=True)
class LanguageConfig:
    languages: str = knob(
        "",
        help="languages to identify and keep: comma-separated ISO 639-1 codes (en,de), 'all' "
        "(identify every document, remove none) or empty (identify none: lingua is the slowest step)",
    )
    # Identify on the first max_chars characters: bounded cost on long documents. On 144 English
    # package READMEs (~13k characters, markup first) the language of the whole text is found from
    # the first 500 / 1000 / 2000 characters in 128 / 142 / 142 cases, at 1210 / 679 / 382 docs/s.
    max_chars: int = 1000

    def __post_init__(self):
        check_field_types(self)
        check_int("LanguageConfig.max_chars", self.max_chars, 1)
        parse_languages(self.languages)

    @property
    def keep(self) -> frozenset[str]:
        return parse_languages(self.languages)

    @property
    def identify(self) -> bool:
        """Whether documents are identified at all (a keep-list or "all")."""
        return bool(self.languages.strip(" ,"))


@functools.cache
def detector():
    """One detector per process over every language (see the module docstring for the mode)."""
    from lingua import LanguageDetectorBuilder

    return LanguageDetectorBuilder.from_all_languages().with_low_accuracy_mode().with_preloaded_language_models().build()


@functools.cache
def _code_of():
    from lingua import Language

    return {language: language.iso_code_639_1.name.lower() for language in Language.all()}


def identify(text: str) -> tuple[str, float]:
    """(code, confidence) of the most likely language of `text`, or ("", 0.0) when there is none."""
    values = detector().compute_language_confidence_values(text)  # every language, most likely first
    # The rule of lingua's own detect_language_of: nothing when no language scores, or the top two tie.
    if not values or values[0].value <= 0 or (len(values) > 1 and values[1].value == values[0].value):
        return UNIDENTIFIED, 0.0
    best = values[0]
    return _code_of()[best.language], best.value


def _language_attributes(table, config: LanguageConfig, keep: frozenset[str]):
    import pyarrow as pa

    if config.identify:
        found = [identify(text[: config.max_chars]) for text in table.column("text").to_pylist()]
    else:
        found = [(None, None)] * table.num_rows  # not asked for: null, not "unidentified"
    languages = [code for code, _ in found]
    return pa.table(
        {
            "id": table.column("id"),
            "source_id": table.column("source_id"),
            "language": pa.array(languages, pa.string()),
            "language_score": pa.array([score for _, score in found], pa.float32()),
            "off_language": pa.array([bool(keep) and code not in keep for code in languages], pa.bool_()),
        }
    )


def identify_languages(shard_paths: Sequence[str], out_dir: str, config: LanguageConfig) -> dict:
    """Write co-partitioned language attributes for each shard; return counts.

    Counts: docs, identified (whether lingua ran), languages ({code: docs}, sorted, "" for the
    unidentified; empty when not identified), off_language, keep.
    """
    keep = config.keep
    reset_dir(out_dir)
    languages: Counter[str] = Counter()
    docs = off = 0
    columns = ["id", "source_id", "text"] if config.identify else ["id", "source_id"]
    for path in shard_paths:
        table = read_table(path, columns=columns)
        attrs = _language_attributes(table, config, keep)
        write_table(attrs, join(out_dir, basename(path)))
        languages.update(code for code in attrs.column("language").to_pylist() if code is not None)
        docs += attrs.num_rows
        off += sum(attrs.column("off_language").to_pylist())
    counts = {
        "docs": docs,
        "identified": config.identify,
        "languages": dict(sorted(languages.items())),
        "off_language": off,
        "keep": sorted(keep),
    }
    write_json(counts, join(out_dir, "_counts.json"))
    return counts
