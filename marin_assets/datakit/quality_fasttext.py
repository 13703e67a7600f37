"""fastText quality classifiers: train one on labelled documents, import a user's ``.bin``, score with either.

A fastText model dir holds ``model.bin`` and ``quality_model.json``:
{"kind": "fasttext", "label": "__label__hq", "preprocess": ..., "max_chars": ...}. Its score is
P(label) as the model predicts it, so any supervised fastText classifier (DCLM's, say)
can stand in for ours, given the label that means "keep".

Training runs in a child process, with one thread: fastText's DenseMatrix::uniform initialises
only thread/10 of the input matrix (facebookresearch/fastText#1061) and leaves the rest as malloc
hands it over. Measured in one process with thread=1: the first trainings got fresh zero pages and
agreed byte for byte, later ones reused a freed model's memory (values up to 1e20, a "NaN" loss,
different predictions). A child with a fixed mmap threshold gets fresh zero pages for every large
allocation, and one thread avoids hogwild's races, so the model is a function of its training
file and seed. The training file is shuffled by that seed: SGD with a decaying step over "all
high, then all low" would end up leaning towards the last class.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass

import marin_assets
from marin_assets.datakit.shards import basename, copy_file, join, local_path, write_json
from marin_assets.numeric_checks import check_float, check_int

KIND = "fasttext"
MODEL_FILE = "model.bin"
CONFIG_FILE = "quality_model.json"
HIGH_LABEL, LOW_LABEL = "__label__hq", "__label__lq"
# How a text becomes fastText's one line. "tokens": the tokens ours hashes, lowercased (what the
# models trained here saw). "one_line": newlines to spaces only, for a user's model, whose own
# preprocessing we do not know (fastText splits on whitespace itself; its predict refuses "\n").
TOKENS, ONE_LINE = "tokens", "one_line"
TOKEN_RE = re.compile(r"\w+|[^\w\s]")  # the tokens ours hashes (quality.py), and "tokens" lines
FASTTEXT_MAGIC, FASTTEXT_VERSION = 793712314, 12  # the int32s a fastText model file starts with
# Fixed (so glibc never raises it): every allocation from 64 KiB up, the input matrix among them
# (bucket x dim x 4 bytes: 16 MiB by default), is a fresh mmap, whose pages are zeros.
CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}


@dataclass(frozen=True)
class FastTextConfig:
    """Measured on the demo's labelled sources (310 high, 6,046 low documents): lr 0.1 underfits
    (held-out accuracy 0.986 at 5 epochs); lr 0.5, 10 epochs, dim 16 reaches ours (0.998)."""

    dim: int = 16
    epoch: int = 10
    lr: float = 0.5
    word_ngrams: int = 2
    bucket: int = 1 << 18
    seed: int = 0
    max_chars: int = 20_000  # as ours: the first max_chars characters carry enough signal

    def __post_init__(self):
        for name in ("dim", "epoch", "word_ngrams", "bucket", "max_chars"):
            check_int(f"FastTextConfig.{name}", getattr(self, name), 1)
        check_int("FastTextConfig.seed", self.seed, 0)
        check_float("FastTextConfig.lr", self.lr, 0.0, lo_open=True)


def fasttext_line(text: str, preprocess: str, max_chars: int | None) -> str:
    """The one line fastText sees for ``text``."""
    text = text[:max_chars] if max_chars else text
    if preprocess == TOKENS:
        return " ".join(TOKEN_RE.findall(text.lower()))
    return text.replace("\n", " ")


class FastTextQualityModel:
    """P(label) of a fastText classifier, as a quality score."""

    def __init__(self, model, label: str, preprocess: str, max_chars: int | None, model_file: str):
        self.model, self.label, self.preprocess, self.max_chars = model, label, preprocess, max_chars
        self.model_file = model_file  # where the .bin came from (kept to save a copy)

    def predict(self, texts: Sequence[str]):
        """P(label) for each text, as a float32 array."""
        import numpy as np

        if not len(texts):
            return np.zeros(0, np.float32)
        labels, probs = self.model.predict([fasttext_line(t, self.preprocess, self.max_chars) for t in texts], k=-1)
        scores = [_probability_of(self.label, ls, ps) for ls, ps in zip(labels, probs, strict=True)]
        # fastText reports exp(log(p + 1e-5)): a sure prediction comes back a hair above 1.
        return np.clip(np.asarray(scores, np.float32), 0.0, 1.0)

    def meta(self) -> dict:
        return {"kind": KIND, "label": self.label, "preprocess": self.preprocess, "max_chars": self.max_chars}

    def save(self, out_dir: str, **extra) -> None:
        copy_file(self.model_file, join(out_dir, MODEL_FILE))
        write_json({**self.meta(), **extra}, join(out_dir, CONFIG_FILE))

    @staticmethod
    def load(model_dir: str, meta: dict) -> FastTextQualityModel:
        path = join(model_dir, MODEL_FILE)
        with _local_copy(path) as local:
            model = _load_fasttext(local, path)  # fastText reads the whole file: the copy can go
        return FastTextQualityModel(model, meta["label"], meta.get("preprocess", ONE_LINE), meta.get("max_chars"), path)


def _probability_of(label: str, labels: Sequence[str], probs: Sequence[float]) -> float:
    for name, p in zip(labels, probs, strict=True):
        if name == label:
            return float(p)
    return 0.0  # k=-1 returns every label; one missing here had no probability at all


def check_label(label: str, what: str = "label") -> str:
    """A fastText label is one whitespace-free token (fastText splits lines on whitespace)."""
    if not isinstance(label, str) or not label or any(c.isspace() or c == "\x00" for c in label):
        raise ValueError(f"{what}: a fastText label is one token without whitespace, got {label!r}")
    return label


def check_model_file(path: str) -> None:
    """ValueError unless ``path`` starts like a fastText model file (cheap: 8 bytes, not the model)."""
    import fsspec
    import numpy as np

    fs, local = fsspec.core.url_to_fs(path)
    with fs.open(local, "rb") as f:
        head = np.frombuffer(f.read(8).ljust(8, b"\x00"), "<i4")
    if int(head[0]) != FASTTEXT_MAGIC or int(head[1]) != FASTTEXT_VERSION:
        raise ValueError(f"quality model {path} is not a fastText model file (it does not start with fastText's header)")


def _load_fasttext(local: str, shown: str):
    import fasttext

    check_model_file(local)  # fastText "loads" a truncated file; the header at least must be one
    try:
        return fasttext.load_model(local)
    except ValueError as e:
        raise ValueError(f"quality model {shown}: fastText cannot load it ({e})") from None


def import_fasttext_model(bin_path: str, label: str, out_dir: str) -> dict:
    """Copy a user's fastText classifier into ``out_dir`` as a quality model scoring P(label).

    ValueError (naming the file, the label and the labels it has) unless ``label`` is one of its labels.
    """
    check_label(label)
    with _local_copy(bin_path) as local:
        model = _load_fasttext(local, bin_path)
        labels = _classifier_labels(model, bin_path)
        if label not in labels:
            shown = ", ".join(labels[:20]) + (f", ... ({len(labels)} in all)" if len(labels) > 20 else "")
            raise ValueError(f"fastText model {bin_path} has no label {label!r}; its labels: {shown}")
        imported = FastTextQualityModel(model, label, ONE_LINE, None, local)
        imported.save(out_dir, labels=labels, source=basename(bin_path))
    return {"model": "given", "kind": KIND, "label": label, "labels": len(labels)}


def _classifier_labels(model, shown: str) -> list[str]:
    # A word-vector model's .labels are its words: ask which kind it is first.
    if model.f.getArgs().model.name != "supervised":
        raise ValueError(f"fastText model {shown} is a word-vector model, not a classifier (it has no labels)")
    return list(model.labels)


def train_fasttext(texts: Sequence[str], is_high: Sequence[bool], work_dir: str, config: FastTextConfig) -> FastTextQualityModel:
    """A fastText classifier of high (``HIGH_LABEL``) vs low documents, trained in a child process.

    ``work_dir`` is a local directory that holds the training file and model.bin while the model is used.
    """
    import numpy as np

    train_file, model_file = os.path.join(work_dir, "train.txt"), os.path.join(work_dir, MODEL_FILE)
    order = np.random.RandomState(config.seed).permutation(len(texts))
    with open(train_file, "w", encoding="utf-8") as f:
        for i in order:
            f.write(f"{HIGH_LABEL if is_high[int(i)] else LOW_LABEL} {fasttext_line(texts[int(i)], TOKENS, config.max_chars)}\n")
    train_fasttext_file(train_file, model_file, config)
    return FastTextQualityModel(_load_fasttext(model_file, model_file), HIGH_LABEL, TOKENS, config.max_chars, model_file)


def train_fasttext_file(train_file: str, model_file: str, config: FastTextConfig) -> None:
    """Train a fastText classifier on a fastText training file ("__label__x text" lines) into
    ``model_file``: in a child process, with one thread (deterministic: see the module's docstring)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(marin_assets.__file__)))
    env = {**os.environ, **CHILD_ENV, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    argv = [sys.executable, "-m", __name__, train_file, model_file, json.dumps(asdict(config))]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"fastText training failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")


def _train(train_file: str, model_file: str, config: FastTextConfig) -> None:
    """The child's work: train, refuse a model with non-finite weights, save."""
    import fasttext
    import numpy as np

    model = fasttext.train_supervised(
        input=train_file, lr=config.lr, dim=config.dim, epoch=config.epoch, wordNgrams=config.word_ngrams,
        bucket=config.bucket, minCount=1, loss="softmax", thread=1, seed=config.seed, verbose=0,
    )  # fmt: skip
    for name, matrix in (("input", model.get_input_matrix()), ("output", model.get_output_matrix())):
        if not np.isfinite(matrix).all():
            raise RuntimeError(f"fastText trained a non-finite {name} matrix")
    model.save_model(model_file)


@contextlib.contextmanager
def _local_copy(path: str) -> Iterator[str]:
    """An OS path of ``path``'s bytes: the file itself when local, else a temporary copy (fastText reads OS paths)."""
    local = local_path(path)
    if local is not None:
        yield local
        return
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, MODEL_FILE)
        copy_file(path, copy)
        yield copy


if __name__ == "__main__":
    _train(sys.argv[1], sys.argv[2], FastTextConfig(**json.loads(sys.argv[3])))
