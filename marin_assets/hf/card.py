"""The model card (README.md) of an HF export, and the lineage dict the export asset passes in.

``lineage`` (every key optional; an unknown key or a value of the wrong kind is refused in one line)::

    run          str    the run (or phase partition) the checkpoint belongs to
    phase        str    the phase that wrote it
    code_version str    the code version of the phase that trained it
    datasets     list of {"name": str, "version": str, "tokens": int}: the data it trained on, each
                 dataset's content version and the tokens taken from it
    tokens       int    tokens trained on in all (the checkpoint's own count is used when absent)
    evals        {name: number}: eval results of this checkpoint (bits-per-byte, task accuracy, ...)
    prediction   {"metric": str, "predicted": number, "interval": [lo, hi], "frozen_at": str,
                  "lock": str, "outcome": number}: the frozen prediction for this run and what it
                 measured ("interval", "frozen_at", "lock" (the record that froze it), "outcome"
                 optional; a prediction without an outcome is rendered as pending)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

_LINEAGE = {"run": str, "phase": str, "code_version": str, "datasets": list, "tokens": int, "evals": dict, "prediction": dict}
_DATASET = {"name": str, "version": str, "tokens": int}
_PREDICTION = {"metric": str, "predicted": float, "interval": list, "frozen_at": str, "lock": str, "outcome": float}


def _check_fields(value: Any, schema: Mapping[str, type], where: str, required: tuple[str, ...] = ()) -> None:
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must be a mapping, got {type(value).__name__}")
    for key, item in value.items():
        kind = schema.get(key)
        if kind is None:
            raise ValueError(f"{where} has unknown key {key!r} (known: {', '.join(schema)})")
        _check_kind(item, kind, f"{where}.{key}")
    missing = [k for k in required if k not in value]
    if missing:
        raise ValueError(f"{where} lacks {missing[0]!r}")


def _check_kind(item: Any, kind: type, where: str) -> None:
    if kind is float:
        if isinstance(item, bool) or not isinstance(item, (int, float)) or not math.isfinite(item):
            raise ValueError(f"{where} must be a finite number, got {item!r}")
    elif kind is int:
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise ValueError(f"{where} must be an int >= 0, got {item!r}")
    elif not isinstance(item, kind):
        raise ValueError(f"{where} must be a {kind.__name__}, got {item!r}")


def check_lineage(lineage: Mapping[str, Any] | None) -> None:
    """Refuse a lineage dict that does not follow the schema above, naming the key."""
    if lineage is None:
        return
    _check_fields(lineage, _LINEAGE, "lineage")
    for i, ds in enumerate(lineage.get("datasets", [])):
        _check_fields(ds, _DATASET, f"lineage.datasets[{i}]", required=("name", "version"))
    for name, score in (lineage.get("evals") or {}).items():
        _check_kind(score, float, f"lineage.evals[{name!r}]")
    if "prediction" in lineage:
        pred = lineage["prediction"]
        _check_fields(pred, _PREDICTION, "lineage.prediction", required=("metric", "predicted"))
        interval = pred.get("interval")
        if interval is not None:
            if len(interval) != 2:
                raise ValueError(f"lineage.prediction.interval must be [lo, hi], got {interval!r}")
            for bound in interval:
                _check_kind(bound, float, "lineage.prediction.interval")


def render(
    *, layout: str, model: Mapping[str, Any], checkpoint: Mapping[str, Any], tokenizer: str, lineage: Mapping[str, Any] | None
) -> str:
    """README.md: what the model is, where it came from, how it scored, and what was predicted of it."""
    lineage = lineage or {}
    lines = [
        "---",
        "library_name: transformers",
        "tags: [marin-assets]",
        "---",
        "",
        f"# {lineage.get('run') or 'marin-assets model'}",
        "",
        f"Exported by marin-assets (`marin export hf`) in the Hugging Face `{layout}` layout, fp32 weights. "
        "The export is exact: a loader of this layout gives the logits of the trained model.",
        "",
        "## Model",
        "",
    ]
    lines += [f"- {k}: {v}" for k, v in model.items()]
    lines += ["", "## Checkpoint", ""]
    lines += [f"- {k}: {v}" for k, v in checkpoint.items() if v is not None]
    for key in ("phase", "code_version"):
        if lineage.get(key) and checkpoint.get(key) is None:  # the checkpoint's own field is listed already
            lines.append(f"- {key}: {lineage[key]}")
    lines += ["", "## Tokenizer", "", tokenizer, "", "## Data", ""]
    datasets = lineage.get("datasets") or []
    if datasets:
        lines += ["| dataset | version | tokens |", "|---|---|---|"]
        lines += [f"| {d['name']} | {d['version']} | {d.get('tokens', 'unknown')} |" for d in datasets]
    else:
        lines.append("No dataset lineage was given to this export.")
    tokens = lineage.get("tokens", checkpoint.get("tokens"))
    lines += ["", f"Tokens trained on: {tokens if tokens is not None else 'unknown'}", "", "## Evaluation", ""]
    evals = lineage.get("evals") or {}
    lines += [f"- {name}: {score:.6g}" for name, score in sorted(evals.items())] or ["No eval results were given to this export."]
    lines += ["", "## Frozen prediction", ""]
    lines += _prediction_lines(lineage.get("prediction"))
    return "\n".join(lines) + "\n"


def _prediction_lines(pred: Mapping[str, Any] | None) -> list[str]:
    if not pred:
        return ["No prediction was frozen for this run."]
    lines = [f"- metric: {pred['metric']}", f"- predicted: {pred['predicted']:.6g}"]
    if pred.get("interval"):
        lo, hi = pred["interval"]
        lines.append(f"- interval: [{lo:.6g}, {hi:.6g}]")
    if pred.get("frozen_at"):
        lines.append(f"- frozen at: {pred['frozen_at']}")
    if pred.get("lock"):
        lines.append(f"- frozen by: {pred['lock']}")
    if "outcome" not in pred:
        lines.append("- outcome: pending")
        return lines
    outcome = pred["outcome"]
    lines.append(f"- outcome: {outcome:.6g} (error {outcome - pred['predicted']:+.6g})")
    if pred.get("interval"):
        lo, hi = pred["interval"]
        lines.append(f"- within the interval: {'yes' if lo <= outcome <= hi else 'no'}")
    return lines
