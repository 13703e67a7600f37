"""One IsoFLOP sweep point, trained on the DataKit's datasets and scored on their held-out splits (no Dagster).

The assets in ``assets/scaling.py`` call these; ``config`` is any object with the sweep
settings as attributes (the asset layer passes its ``SweepConfig``).
"""

from __future__ import annotations

import json
import math
import re
import tempfile
import time
from pathlib import Path
from typing import Mapping, Sequence

from marin_assets.telemetry import default_root as default_telemetry_root
from marin_assets.store.names import validate_segment
from marin_assets.telemetry import TelemetryWriter


# ---------------------------------------------------------------- partition keys


def budget_label(budget: float) -> str:
    """1e11 -> "1e11", 2.5e11 -> "2.5e11" (two significant digits, path-safe)."""
    if not (budget > 0 and math.isfinite(budget)):
        raise ValueError(f"budget must be finite and > 0, got {budget}")
    return f"{budget:.2g}".replace("e+", "e")


# fullmatch, not match + "$": "$" also matches before a trailing newline.
_PARTITION_KEY_RE = re.compile(r"C([0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]{1,3})?)-d([1-9][0-9]{0,8})")


def partition_key(budget: float, width: int) -> str:
    return f"C{budget_label(budget)}-d{int(width)}"


def parse_partition_key(key: str) -> tuple[float, int]:
    """"C2e11-d48" -> (2e11, 48); anything else (a trailing newline too) is a clear error."""
    match = _PARTITION_KEY_RE.fullmatch(key) if isinstance(key, str) else None
    if match is None:
        raise ValueError(f"sweep partition key {key!r} is not of the form C<budget>-d<width>, e.g. C1e11-d32")
    budget, width = float(match.group(1)), int(match.group(2))
    if not (budget > 0 and math.isfinite(budget)):
        raise ValueError(f"sweep partition key {key!r}: budget and width must be positive")
    return budget, width


# ---------------------------------------------------------------- one sweep run


def sweep_family(width: int, config):
    from marin_assets.scaling.planner import ModelFamily

    return ModelFamily(
        widths=(width,), vocab_size=config.vocab_size, seq_len=config.seq_len, head_dim=config.head_dim,
        aspect_ratio=config.aspect_ratio, batch_sizes=tuple(config.batch_sizes), min_steps=config.min_steps,
        lr_base=config.lr_base, lr_ref_width=config.lr_ref_width,
    )


def plan_run(budget: float, width: int, config):
    """The planner's candidate for (budget, width), or a ValueError saying why there is none."""
    from marin_assets.scaling.planner import plan_sweep

    plan = plan_sweep([budget], sweep_family(width, config), tolerance=config.tolerance)
    if not plan.candidates:
        raise ValueError(f"no sweep run for budget {budget:.3g} at width {width}: {plan.skipped[0]['reason']}")
    return plan.candidates[0]


def validation_loss(params, model_config, caches: Mapping[str, str], seq_len: int, max_windows: int,
                    batch_size: int = 32) -> dict[str, float]:
    """Mean next-token cross-entropy (nats) over the first ``max_windows`` non-overlapping
    ``seq_len`` windows of each source's held-out tokens (``caches``: {source: a TokenStream or
    one validation split's path}; ``held_out_streams`` opens a mixture's), plus the unweighted
    mean over sources (the training mixture is uniform over sources, so each source counts the same)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from marin_assets.model import init_router_bias, loss_fn
    from marin_assets.train.data import as_stream

    bias = init_router_bias(model_config)

    @jax.jit
    def ce(p, tokens):
        return loss_fn(p, tokens, model_config, bias)[1]["ce_loss"]

    out = {}
    for name, path in sorted(caches.items()):
        cache = as_stream(path)
        n = min(cache.num_tokens // seq_len, max_windows)
        if n < 1:
            raise ValueError(f"held-out data {cache.path} of source {name!r} has {cache.num_tokens} tokens, "
                             f"fewer than one window of {seq_len}")
        total = 0.0
        for lo in range(0, n, batch_size):
            starts = np.arange(lo, min(lo + batch_size, n)) * seq_len
            total += float(ce(params, jnp.asarray(cache.read(starts, seq_len), jnp.int32))) * len(starts)
        out[name] = total / n
    out["mean"] = sum(out.values()) / len(out)
    return out


def held_out_streams(datasets: Mapping[str, str]) -> dict:
    """{source: its held-out TokenStream} of {source: dataset index path}; a source without
    held-out tokens is an error naming it (its loss could not be measured)."""
    from marin_assets.train.data import open_source

    out = {}
    for name, path in sorted(datasets.items()):
        source = open_source(path)
        if source.validation is None:
            raise ValueError(f"source {name!r} ({path}) has no held-out tokens: raise TokenizeConfig.validation_fraction")
        out[name] = source.validation
    return out


def run_sweep_point(budget: float, width: int, config, train_caches: Mapping[str, str],
                    validation_caches: Mapping[str, str], out_dir: str, log=print) -> dict:
    """Train the planned model for (budget, width) to its budget, score it on validation.

    Writes ``run.json`` (plan, training result, validation losses) plus the training loop's
    metrics.jsonl and loss_curve.png under ``out_dir``; returns the counts."""
    from marin_assets.evaluation.run import load_model_from_checkpoint
    from marin_assets.model import flops_per_token
    from marin_assets.train.config import TrainConfig
    from marin_assets.train.guards import GuardConfig
    from marin_assets.train.loop import train
    from marin_assets.train.schedules import ScheduleConfig

    cand = plan_run(budget, width, config)
    run_name = f"sweep-{partition_key(budget, width)}"  # its steps and its validation loss in the telemetry store
    for source in validation_caches:  # checked before training, not after
        validate_segment(f"validation_loss.{source}", "telemetry metric name (from a validation source)")
    steps = cand.steps
    schedule = ScheduleConfig(kind="wsd", peak_lr=cand.learning_rate, warmup_steps=max(1, steps // 20),
                              total_steps=steps, decay_steps=max(1, int(steps * config.decay_fraction)))
    train_config = TrainConfig(model=cand.config, schedule=schedule, seq_len=config.seq_len,
                               batch_size=cand.batch_size, num_steps=steps, seed=config.seed,
                               guards=GuardConfig(skip_sigma=config.skip_sigma),
                               data_seed=config.seed, checkpoint_every_steps=steps,
                               checkpoint_every_seconds=1e9)
    log(f"sweep C={cand.budget:.3g} {cand.name}: {cand.params:.3g} params, batch {cand.batch_size} x "
        f"{steps} steps = {cand.tokens} tokens, lr {cand.learning_rate:.3g}")
    started = time.monotonic()
    # The loop writes checkpoints with local file I/O, so train in a local scratch dir and
    # copy the small outputs over: out_dir may be any fsspec URL.
    with tempfile.TemporaryDirectory(prefix="sweep-") as scratch:
        result = train(train_config, dict(train_caches), scratch, resume=False, telemetry_run=run_name)
        train_s = time.monotonic() - started
        if result.final_step != steps:
            raise RuntimeError(f"sweep {cand.name} at C={cand.budget:.3g} stopped at step {result.final_step} of {steps}")
        params, model_config, _, _ = load_model_from_checkpoint(result.checkpoint_dir)
        val = validation_loss(params, model_config, validation_caches, config.seq_len, config.validation_windows)
        spent = flops_per_token(cand.config, config.seq_len) * result.tokens
        record = {
            "partition": partition_key(budget, width),
            "plan": cand.as_dict(),
            "model": {k: getattr(cand.config, k) for k in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff")},
            "train": {"final_step": result.final_step, "tokens": result.tokens, "last_loss": result.last_loss,
                      "counts": result.counts, "seconds": round(train_s, 2)},
            "flops": spent,
            "validation_loss": val,
        }
        _upload(Path(scratch), out_dir, ["metrics.jsonl", "loss_curve.png"])
    with TelemetryWriter(default_telemetry_root(), run_name) as writer:
        writer.log(result.final_step, {"validation_loss": val["mean"], "flops": spent,
                                       **{f"validation_loss.{k}": v for k, v in val.items() if k != "mean"}},
                   phase=train_config.phase)
    _write_text(out_dir, "run.json", json.dumps(record, indent=1))
    log(f"sweep {cand.name} at C={cand.budget:.3g}: train loss {result.last_loss:.4f}, "
        f"validation {val['mean']:.4f} in {train_s:.1f}s")
    return {
        "budget": cand.budget, "width": cand.width, "depth": cand.depth, "params": cand.params,
        "vocab_size": config.vocab_size,
        "tokens": int(result.tokens), "flops": spent, "steps": steps, "batch_size": cand.batch_size,
        "learning_rate": cand.learning_rate, "train_loss": float(result.last_loss),
        "validation_loss": float(val["mean"]), "seconds": round(time.monotonic() - started, 2),
    }


def _write_text(root: str, name: str, text: str) -> None:
    import fsspec

    with fsspec.open(f"{root.rstrip('/')}/{name}", "w") as f:
        f.write(text)


def _write_bytes(root: str, name: str, data: bytes) -> None:
    import fsspec

    with fsspec.open(f"{root.rstrip('/')}/{name}", "wb") as f:
        f.write(data)


def _upload(local: Path, root: str, names: Sequence[str]) -> None:
    for name in names:
        if (local / name).exists():
            _write_bytes(root, name, (local / name).read_bytes())
