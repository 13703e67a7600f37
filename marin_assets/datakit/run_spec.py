"""One ``marin datakit run``: what the CLI checks and hands to the graph driver.

The knobs travel as the library configs that declare them (``marin_assets/knobs.py``), so the
flags, the driver's asset config and the artifacts' versions read one default each. Every
flag and path is checked before any work: the configs on construction, ``check_run_inputs``
for the paths, ``check_eval_sets`` for every eval item.

What a run owns under its prefix (nothing else there is read, written or deleted):

  PREFIX/store/          the content-versioned artifact store of the graph (kept across runs:
                         a rerun recomputes only what changed)
  PREFIX/cache/dataset.json   the dataset index of every input's shard caches (in the store)
  PREFIX/cache/tokenizer.json the tokenizer they were written with
  PREFIX/summary.json    the summary, per-dataset counts and the runs
  PREFIX/run.json        the run's spec (assets/datakit/run_location.py rebuilds its graph for the UI)
  PREFIX/.datakit.lease  held while a run works on the prefix (two runs never share one)
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Sequence

from marin_assets.datakit.decontaminate import DecontamConfig
from marin_assets.datakit.eval_sets import PACKAGED_EVAL_SETS, iter_eval_items
from marin_assets.datakit.fuzzy_dedup import FuzzyDedupConfig
from marin_assets.datakit.language import LanguageConfig
from marin_assets.datakit.quality import QualityScoreConfig, check_given_model
from marin_assets.datakit.quality_fasttext import check_label
from marin_assets.datakit.readers import ReaderConfig, list_input_files
from marin_assets.datakit.shard_index import ShardingConfig
from marin_assets.datakit.shards import basename, join
from marin_assets.datakit.tokenize import TokenizeConfig, TokenizerChoice, load_encoder
from marin_assets.numeric_checks import check_int

REMOVAL_REASONS = ("low_quality", "language", "exact_duplicate", "fuzzy_duplicate", "contaminated")
STORE_ENTRY = "store"
CACHE_ENTRY = "cache"
SUMMARY_FILE = "summary.json"
RUN_FILE = "run.json"
LEASE_ENTRY = ".datakit.lease"
OWNED = (STORE_ENTRY, CACHE_ENTRY, SUMMARY_FILE, RUN_FILE, LEASE_ENTRY)

# Each nested config: (field of RunSpec, library class). Their knobs are the run's knobs.
CONFIGS = {
    "tokenizer": TokenizerChoice,
    "sharding": ShardingConfig,
    "reader": ReaderConfig,
    "quality": QualityScoreConfig,
    "decontam": DecontamConfig,
    "tokenize": TokenizeConfig,
    "fuzzy": FuzzyDedupConfig,
    "language": LanguageConfig,
}


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One ``marin datakit run``, as the CLI hands it to the graph driver (JSON in one argv item)."""

    inputs: tuple[str, ...]
    evals: tuple[str, ...]
    prefix: str
    tokenizer: TokenizerChoice = TokenizerChoice()
    sharding: ShardingConfig = ShardingConfig()
    reader: ReaderConfig = ReaderConfig()
    quality: QualityScoreConfig = QualityScoreConfig()
    decontam: DecontamConfig = DecontamConfig()
    tokenize: TokenizeConfig = TokenizeConfig()
    fuzzy: FuzzyDedupConfig = FuzzyDedupConfig()
    language: LanguageConfig = LanguageConfig()
    quality_model: str | None = None  # a model dir or a fastText .bin; None trains one on the demo sources if threshold > 0
    quality_label: str | None = None  # the label a fastText .bin scores (None: __label__hq); only with a .bin
    source_cache_dir: str | None = None  # download cache of the demo sources' artifacts (that training)
    workers: int = 1  # local processes a range run computes its partitions on
    quiet: bool = False  # --json: no progress lines

    def __post_init__(self) -> None:
        check_int("workers", self.workers, 1)
        for name in ("quality_model", "source_cache_dir"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value or "\n" in value or "\x00" in value):
                raise ValueError(f"{name}: must be a path, got {value!r}")
        if self.quality_label is not None:
            check_label(self.quality_label, "quality_label")

    def to_json(self) -> str:
        return json.dumps({**dataclasses.asdict(self), "inputs": list(self.inputs), "evals": list(self.evals)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        raw = json.loads(text)
        nested = {name: kind(**raw[name]) for name, kind in CONFIGS.items()}
        return cls(**{**raw, **nested, "inputs": tuple(raw["inputs"]), "evals": tuple(raw["evals"])})


def dataset_names(inputs: Sequence[str]) -> list[str]:
    """A distinct, path-free source name per input (its base name, suffixed when repeated)."""
    names: list[str] = []
    for path in inputs:
        stem = basename(path).split(".")[0] or "input"
        stem = re.sub(r"[^A-Za-z0-9_]", "_", stem)
        name, i = stem, 1
        while name in names:
            i += 1
            name = f"{stem}_{i}"
        names.append(name)
    return names


def _fs_path(path: str) -> tuple:
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    local = (fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]) in ("file", "local")
    return fs, (os.path.realpath(root) if local else root.rstrip("/"))


def exists(path: str) -> bool:
    fs, root = _fs_path(path)
    return fs.exists(root)


def inside(path: str, directory: str) -> bool:
    """True when ``path`` is ``directory`` or lies under it (real paths for local files)."""
    fs_a, a = _fs_path(path)
    fs_b, b = _fs_path(directory)
    if type(fs_a) is not type(fs_b):
        return False
    return a == b or a.startswith(b.rstrip("/") + "/")


def check_run_inputs(spec: RunSpec) -> None:
    """Raise (FileNotFoundError / ValueError, naming the path) before any work is done."""
    prefix = spec.prefix
    if not spec.inputs:
        raise ValueError("marin datakit run needs at least one --input")
    if not isinstance(prefix, str) or not prefix.strip() or "\n" in prefix or "\x00" in prefix:
        raise ValueError(f"prefix must be a directory path, got {prefix!r}")
    if exists(prefix) and not _fs_path(prefix)[0].isdir(_fs_path(prefix)[1]):
        raise ValueError(f"prefix {prefix} exists and is not a directory")
    for path in spec.inputs:
        list_input_files(path)  # FileNotFoundError naming the path
        if inside(prefix, path):
            raise ValueError(f"prefix {prefix} is inside input {path}: a rerun would read this run's output as input")
    for item in spec.evals:
        if item not in PACKAGED_EVAL_SETS and not exists(item):
            raise FileNotFoundError(f"eval set {item!r} is neither a file nor a packaged set ({', '.join(PACKAGED_EVAL_SETS)})")
    encoder = load_encoder(spec.tokenizer.tokenizer)  # FileNotFoundError / ValueError naming it
    if encoder.eos_id is None:
        raise ValueError(f"tokenizer {spec.tokenizer.tokenizer} has no '<|endoftext|>' token (documents are separated by it)")
    if spec.quality_model is not None:
        check_given_model(spec.quality_model, spec.quality_label)  # a model dir, or a fastText file
    elif spec.quality_label is not None:
        raise ValueError(f"quality label {spec.quality_label!r} needs a fastText --quality-model to score with")
    owned = [join(prefix, entry) for entry in OWNED]
    given = [
        *(("input", p) for p in spec.inputs),
        *(("eval set", e) for e in spec.evals if e not in PACKAGED_EVAL_SETS),
        ("quality model", spec.quality_model),
        ("cache dir", spec.source_cache_dir),
    ]
    if spec.tokenizer.tokenizer not in ("olmo", "bytes"):
        given.append(("tokenizer", spec.tokenizer.tokenizer))
    for what, path in given:
        if path is not None and any(inside(path, d) for d in owned):
            raise ValueError(
                f"{what} {path} lies inside what this run writes under {prefix} ({', '.join(OWNED)}); "
                f"copy it elsewhere or use another --prefix"
            )


def check_eval_sets(evals: Sequence[str]) -> int:
    """Read every item of the eval sets (ValueError naming the file and line); return how many."""
    return sum(1 for _ in iter_eval_items(evals))


def display_path(path: str) -> str:
    """An absolute path for a local file (the summary's paths feed commands run elsewhere)."""
    return os.path.abspath(path) if "://" not in path else path
