"""Quality scores: a quality classifier's P(high) and a zlib compression ratio.

Two kinds of classifier, in a model dir with ``quality_model.json`` naming its "kind":
- ours ("hashed_logistic", the default of a dir without a kind): lowercased word (and
  punctuation) unigrams + bigrams, hashed into `num_features` buckets, log1p counts,
  L2-normalised rows, and a class-balanced L2-regularised logistic regression fitted with
  L-BFGS; two files (weights .npy + config .json);
- fastText ("fasttext", quality_fasttext.py), what Marin and DCLM use: a model.bin
  and the label whose probability is the score; one trained here or a user's ``.bin``.
`train_quality_model` fits both on the same split and keeps fastText unless ours is strictly
more accurate on the held-out documents; `load_quality_model` reads either.

The score attribute is co-partitioned with its shard: id, source_id, quality (P(high)),
compression_ratio (raw bytes / zlib bytes: boilerplate and repeated text compress well),
low_quality (quality < threshold; a threshold of 0 keeps everything).
"""

from __future__ import annotations

import json
import tempfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from marin_assets.datakit import quality_fasttext
from marin_assets.datakit.normalize import NormalizeConfig, normalize
from marin_assets.datakit.quality_fasttext import KIND as FASTTEXT
from marin_assets.datakit.quality_fasttext import TOKEN_RE, FastTextConfig, check_label, check_model_file, train_fasttext
from marin_assets.datakit.shards import basename, join, list_shards, read_table, reset_dir, write_json, write_table
from marin_assets.knobs import knob
from marin_assets.numeric_checks import check_float, check_int

WEIGHTS_FILE = "weights.npy"
CONFIG_FILE = "quality_model.json"
OURS = "hashed_logistic"  # the "kind" of our model (a dir written before kinds existed has none)


@dataclass(frozen=True)
class QualityModelConfig:
    num_features: int = 1 << 18
    max_chars: int = 20_000  # score the first max_chars characters: enough signal, bounded cost
    l2: float = 1e-4
    max_iter: int = 300
    holdout_fraction: float = knob(0.2, help="share of the labelled documents held out to measure the model")

    def __post_init__(self):
        check_int("QualityModelConfig.num_features", self.num_features, 16)
        check_int("QualityModelConfig.max_chars", self.max_chars, 1)
        check_int("QualityModelConfig.max_iter", self.max_iter, 1)
        check_float("QualityModelConfig.l2", self.l2, 0.0)
        check_float("QualityModelConfig.holdout_fraction", self.holdout_fraction, 0.0, 1.0, hi_open=True)


def featurize(texts: Sequence[str], config: QualityModelConfig):
    """CSR matrix [len(texts), num_features] of L2-normalised log1p hashed n-gram counts."""
    import numpy as np
    import scipy.sparse as sp
    import xxhash

    memo: dict[str, int] = {}
    indptr, indices, values = [0], [], []
    for text in texts:
        tokens = TOKEN_RE.findall(text[: config.max_chars].lower())
        # Hash each distinct token once; bigram hashes are mixed from unigram hashes in numpy,
        # which keeps the Python work per token to one dict lookup.
        for t in tokens:
            if t not in memo:
                memo[t] = xxhash.xxh64_intdigest(t.encode("utf-8")) & 0x7FFFFFFF
        uni = np.fromiter((memo[t] for t in tokens), dtype=np.int64, count=len(tokens))
        bi = (uni[:-1] * 1_000_003 + uni[1:] * 7 + 1) & 0x7FFFFFFFFFFF
        hashed = np.concatenate([uni, bi]) % config.num_features
        cols, counts = np.unique(hashed, return_counts=True)
        vals = np.log1p(counts.astype(np.float32))
        norm = np.linalg.norm(vals)
        indices.append(cols)
        values.append(vals / norm if norm > 0 else vals)
        indptr.append(indptr[-1] + len(cols))
    return sp.csr_matrix(
        (np.concatenate(values) if values else np.zeros(0, np.float32),
         np.concatenate(indices) if indices else np.zeros(0, np.int64), np.asarray(indptr)),
        shape=(len(texts), config.num_features),
    )  # fmt: skip


class QualityModel:
    def __init__(self, weights, bias: float, config: QualityModelConfig):
        self.weights, self.bias, self.config = weights, float(bias), config

    def predict(self, texts: Sequence[str]):
        """P(high quality) for each text, as a float32 array."""
        import numpy as np

        if not len(texts):
            return np.zeros(0, np.float32)
        return self.predict_features(featurize(texts, self.config))

    def predict_features(self, x):
        """P(high quality) for each row of ``featurize``'s matrix."""
        import numpy as np

        return (1.0 / (1.0 + np.exp(-(x @ self.weights + self.bias)))).astype(np.float32)

    def save(self, out_dir: str) -> None:
        import fsspec
        import numpy as np

        fs, root = fsspec.core.url_to_fs(out_dir)
        fs.makedirs(root, exist_ok=True)
        with fs.open(join(root, WEIGHTS_FILE), "wb") as f:
            np.save(f, self.weights.astype(np.float32))
        write_json({"kind": OURS, "bias": self.bias, "config": asdict(self.config)}, join(out_dir, CONFIG_FILE))

    @staticmethod
    def load(model_dir: str) -> QualityModel:
        import fsspec
        import numpy as np

        fs, root = fsspec.core.url_to_fs(model_dir)
        meta = json.loads(fs.cat_file(join(root, CONFIG_FILE)))
        with fs.open(join(root, WEIGHTS_FILE), "rb") as f:
            weights = np.load(f)
        return QualityModel(weights, meta["bias"], QualityModelConfig(**meta["config"]))


def load_quality_model(model_dir: str):
    """The classifier in ``model_dir``, of either kind: an object whose ``predict(texts)`` is a float32
    array of P(high quality) (for a fastText model, P(its label))."""
    import fsspec

    fs, config_path = fsspec.core.url_to_fs(join(model_dir, CONFIG_FILE))
    with fs.open(config_path, "r") as f:
        meta = json.load(f)
    kind = meta.get("kind", OURS)
    if kind == OURS:
        return QualityModel.load(model_dir)
    if kind == quality_fasttext.KIND:
        return quality_fasttext.FastTextQualityModel.load(model_dir, meta)
    raise ValueError(
        f"quality model {model_dir}: unknown kind {kind!r} in {CONFIG_FILE} (known: {OURS}, {quality_fasttext.KIND})"
    )


def check_given_model(path: str, label: str | None) -> None:
    """FileNotFoundError / ValueError (naming ``path``) unless it is a model dir (with quality_model.json)
    or a fastText model file; a ``label`` only goes with a fastText file (a dir's json names its own)."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    if fs.isfile(root):
        check_model_file(path)
        if label is not None:
            check_label(label)
    elif not fs.exists(join(root, CONFIG_FILE)):
        raise FileNotFoundError(f"quality model {path} is neither a fastText model file nor a dir with {CONFIG_FILE}")
    elif label is not None:
        raise ValueError(
            f"a quality label ({label!r}) goes with a fastText model file; {path} is a model dir, "
            f"whose {CONFIG_FILE} names its own"
        )


def fit_logistic(x, y, config: QualityModelConfig):
    """Class-balanced L2 logistic regression; returns (weights, bias)."""
    import numpy as np
    from scipy.optimize import minimize

    y = np.asarray(y, dtype=np.float64)
    n_pos, n_neg = y.sum(), len(y) - y.sum()
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"quality model needs both classes, got {int(n_pos)} high and {int(n_neg)} low documents")
    sample_w = np.where(y == 1, 0.5 / n_pos, 0.5 / n_neg)  # each class carries half the loss

    def loss_grad(params):
        w, b = params[:-1], params[-1]
        z = x @ w + b
        p = 1.0 / (1.0 + np.exp(-z))
        # log(1 + e^z) - y z, computed stably
        loss = np.sum(sample_w * (np.logaddexp(0.0, z) - y * z)) + config.l2 * w @ w
        r = sample_w * (p - y)
        grad = np.concatenate([x.T @ r + 2 * config.l2 * w, [r.sum()]])
        return loss, grad

    result = minimize(loss_grad, np.zeros(x.shape[1] + 1), jac=True, method="L-BFGS-B", options={"maxiter": config.max_iter})
    return result.x[:-1].astype(np.float32), float(result.x[-1])


def _texts_and_ids(shard_paths: Sequence[str]) -> tuple[list[str], list[str]]:
    texts, ids = [], []
    for path in shard_paths:
        table = read_table(path, columns=["id", "text"])
        ids += table.column("id").to_pylist()
        texts += table.column("text").to_pylist()
    return texts, ids


def _is_holdout(doc_id: str, fraction: float) -> bool:
    return int(doc_id[-8:], 16) / 0xFFFFFFFF < fraction


def _labelled(high_paths: Sequence[str], low_paths: Sequence[str], holdout_fraction: float):
    """(texts, y: 1 high / 0 low, the held-out mask) of the documents, high ones first."""
    import numpy as np

    high, high_ids = _texts_and_ids(high_paths)
    low, low_ids = _texts_and_ids(low_paths)
    y = np.array([1] * len(high) + [0] * len(low))
    hold = np.array([_is_holdout(i, holdout_fraction) for i in high_ids + low_ids], dtype=bool)
    return high + low, y, hold


def train_quality_model(
    high_paths: Sequence[str],
    low_paths: Sequence[str],
    out_dir: str,
    config: QualityModelConfig = QualityModelConfig(),
    fasttext: FastTextConfig | None = None,
) -> dict:
    """Fit ours and a fastText classifier on normalized shards of high- vs low-quality sources;
    save the better one to out_dir; return counts that report both.

    A deterministic slice of documents (by id) is held out to measure them honestly. fastText is
    what the field uses, so ours is kept only if strictly more accurate there; a tie, or no held-out
    documents, keeps fastText. The keys train_accuracy / holdout_accuracy are the kept model's.
    """
    texts, y, hold = _labelled(high_paths, low_paths, config.holdout_fraction)
    x = featurize(texts, config)
    ours = QualityModel(*fit_logistic(x[~hold], y[~hold], config), config)
    with tempfile.TemporaryDirectory() as work_dir:  # the fastText model lives here until it is saved
        train_texts = [t for t, held in zip(texts, hold, strict=True) if not held]
        theirs = train_fasttext(train_texts, y[~hold] == 1, work_dir, fasttext or FastTextConfig())
        measured = {"ours": _measure(ours.predict_features(x), y, hold), "fasttext": _measure(theirs.predict(texts), y, hold)}
        keep_ours = _strictly_better(measured["ours"], measured["fasttext"])
        (ours if keep_ours else theirs).save(out_dir)
    counts = {
        "high_docs": int(y.sum()),
        "low_docs": int((y == 0).sum()),
        "train_docs": int((~hold).sum()),
        "holdout_docs": int(hold.sum()),
        "kind": OURS if keep_ours else FASTTEXT,
        **measured["ours" if keep_ours else "fasttext"],
        **{f"{model}_{name}": value for model, numbers in measured.items() for name, value in numbers.items()},
    }
    write_json(counts, join(out_dir, "_counts.json"))
    return counts


def _strictly_better(a: dict, b: dict) -> bool:
    """a's held-out accuracy beats b's (False when there is nothing held out to compare on)."""
    if a["holdout_accuracy"] is None or b["holdout_accuracy"] is None:
        return False
    return a["holdout_accuracy"] > b["holdout_accuracy"]


def _measure(p, y, hold) -> dict:
    """Accuracy at 0.5 on the training and held-out documents, and held-out AUC (None where undefined)."""
    return {
        "train_accuracy": _accuracy(p[~hold], y[~hold]),
        "holdout_accuracy": _accuracy(p[hold], y[hold]),
        "holdout_auc": _auc(p[hold], y[hold]),
    }


def _accuracy(p, y) -> float | None:
    return float(((p >= 0.5) == (y == 1)).mean()) if len(y) else None


def _auc(p, y) -> float | None:
    """P(a random high document outscores a random low one), ties counting half (Mann-Whitney)."""
    from scipy.stats import rankdata

    n_high = int(y.sum())
    n_low = len(y) - n_high
    if not n_high or not n_low:
        return None
    return float((rankdata(p)[y == 1].sum() - n_high * (n_high + 1) / 2) / (n_high * n_low))


def train_on_labelled_sources(
    raw: Mapping[str, tuple[str, str]],
    out_dir: str,
    scratch_dir: str,
    config: QualityModelConfig = QualityModelConfig(),
    fasttext: FastTextConfig | None = None,
) -> dict:
    """Train on raw sources labelled "high" or "low" ({name: (raw files dir, label)}): each is
    normalized into ``scratch_dir`` by the same ``normalize`` the shards run, then fitted."""
    shards: dict[str, list[str]] = {"high": [], "low": []}
    for name, (raw_dir, label) in sorted(raw.items()):
        if label not in shards:
            raise ValueError(f"source {name!r}: quality label must be 'high' or 'low', got {label!r}")
        normalized = join(scratch_dir, "normalized", name)
        normalize([raw_dir], normalized, NormalizeConfig(source=name))
        shards[label].extend(list_shards(normalized))
    if not shards["high"] or not shards["low"]:
        raise ValueError(
            f"a quality model needs high- and low-quality sources, got {sorted(raw)} labelled "
            f"{sorted({label for _, label in raw.values()})}"
        )
    return train_quality_model(shards["high"], shards["low"], out_dir, config, fasttext)


@dataclass(frozen=True)
class QualityScoreConfig:
    threshold: float = knob(0.0, help="documents whose quality score is below this are removed as low_quality (0 keeps all)")
    batch_docs: int = 1024

    def __post_init__(self):
        check_float("QualityScoreConfig.threshold", self.threshold, 0.0, 1.0)
        check_int("QualityScoreConfig.batch_docs", self.batch_docs, 1)


def compression_ratio(text: str) -> float:
    raw = text.encode("utf-8")
    return len(raw) / len(zlib.compress(raw, 6)) if raw else 0.0


def score_quality(shard_paths: Sequence[str], model_dir: str | None, out_dir: str, config: QualityScoreConfig) -> dict:
    """Write co-partitioned quality attributes for each shard; return counts.

    With model_dir None only the compression ratio is computed (quality is NaN); that is
    only allowed with threshold 0, where no document is filtered.
    """
    import numpy as np
    import pyarrow as pa

    if model_dir is None and config.threshold > 0:
        raise ValueError(f"quality threshold {config.threshold} needs a trained quality model (model_dir is None)")
    model = load_quality_model(model_dir) if model_dir is not None else None
    reset_dir(out_dir)
    docs = low = 0
    score_sum = 0.0
    for path in shard_paths:
        table = read_table(path, columns=["id", "source_id", "text"])
        texts = table.column("text").to_pylist()
        if model is not None:
            parts = [model.predict(texts[i : i + config.batch_docs]) for i in range(0, len(texts), config.batch_docs)]
            quality = np.concatenate(parts) if parts else np.zeros(0, np.float32)
        else:
            quality = np.full(len(texts), np.nan, np.float32)
        ratios = np.array([compression_ratio(t) for t in texts], dtype=np.float32)
        is_low = quality < config.threshold if model is not None else np.zeros(len(texts), bool)
        attrs = pa.table(
            {
                "id": table.column("id"),
                "source_id": table.column("source_id"),
                "quality": pa.array(quality),
                "compression_ratio": pa.array(ratios),
                "low_quality": pa.array(is_low),
            }
        )
        write_table(attrs, join(out_dir, basename(path)))
        docs += len(texts)
        low += int(is_low.sum())
        score_sum += float(np.nansum(quality))
    counts = {"docs": docs, "low_quality": low, "mean_quality": score_sum / docs if docs and model else None}
    write_json(counts, join(out_dir, "_counts.json"))
    return counts
