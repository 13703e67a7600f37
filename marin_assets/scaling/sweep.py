"""One IsoFLOP sweep point, trained on the DataKit's datasets and scored on their held-out splits (no Dagster).

The assets in ``assets/scaling.py`` call these; ``config`` is any object with the sweep
settings as attributes (the asset layer passes its ``SweepConfig``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from marin_assets.scaling.planner import FamilyShape, SweepCandidate, active_params, plan_sweep, training_flops_per_token
from marin_assets.scaling.recipes import V1, Recipe
from marin_assets.store.artifact_files import write_file
from marin_assets.store.names import validate_segment
from marin_assets.telemetry import TelemetryWriter
from marin_assets.telemetry import default_root as default_telemetry_root
from marin_assets.train.config import GuardConfig, ScheduleConfig, TrainConfig
from marin_assets.train.data.token_caches import as_stream, open_source

DENSE = FamilyShape()  # the default family shape: the demo's tiny dense 1-layer models


# ---------------------------------------------------------------- partition keys


def budget_label(budget: float) -> str:
    """1e11 -> "1e11", 2.5e11 -> "2.5e11" (two significant digits, path-safe)."""
    if not (budget > 0 and math.isfinite(budget)):
        raise ValueError(f"budget must be finite and > 0, got {budget}")
    return f"{budget:.2g}".replace("e+", "e")


# fullmatch, not match + "$": "$" also matches before a trailing newline.
_PARTITION_KEY_RE = re.compile(r"C([0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]{1,3})?)-d([1-9][0-9]{0,8})(?:-s([1-9][0-9]{0,5}))?")


def partition_key(budget: float, width: int, seed: int = 0) -> str:
    """ "C2e11-d48" for seed 0 (the key of a one-seed ladder), "C2e11-d48-s1" for seed 1."""
    return f"C{budget_label(budget)}-d{int(width)}" + (f"-s{int(seed)}" if seed else "")


def parse_partition_key(key: str) -> tuple[float, int]:
    """ "C2e11-d48" (or "C2e11-d48-s1") -> (2e11, 48); anything else (a trailing newline too) is a clear error."""
    budget, width, _ = parse_seeded_key(key)
    return budget, width


def parse_seeded_key(key: str) -> tuple[float, int, int]:
    """ "C2e11-d48-s1" -> (2e11, 48, 1); no "-s" suffix is seed 0."""
    match = _PARTITION_KEY_RE.fullmatch(key) if isinstance(key, str) else None
    if match is None:
        raise ValueError(f"sweep partition key {key!r} is not of the form C<budget>-d<width>[-s<seed>], e.g. C1e11-d32")
    budget, width, seed = float(match.group(1)), int(match.group(2)), int(match.group(3) or 0)
    if not (budget > 0 and math.isfinite(budget)):
        raise ValueError(f"sweep partition key {key!r}: budget and width must be positive")
    return budget, width, seed


# ---------------------------------------------------------------- one sweep run


def sweep_family(width: int, config, recipe: Recipe = V1, shape: FamilyShape = DENSE):
    """The one-width ModelFamily a sweep run of ``width`` is planned in (``config``: the SweepSettings)."""
    return shape.family(
        (width,),
        vocab_size=config.vocab_size,
        seq_len=config.seq_len,
        batch_sizes=tuple(config.batch_sizes),
        min_steps=config.min_steps,
        recipe=recipe,
    )


def plan_run(budget: float, width: int, config, recipe: Recipe = V1, shape: FamilyShape = DENSE, batch_size: int | None = None):
    """The planner's candidate for (budget, width), or a ValueError saying why there is none.
    ``batch_size`` pins the batch (a target that copies a run's batch); else the planner picks."""
    family = sweep_family(width, config, recipe, shape)
    if batch_size is not None:
        family = dataclasses.replace(family, batch_sizes=(batch_size,))
    plan = plan_sweep([budget], family, tolerance=config.tolerance)
    if not plan.candidates:
        raise ValueError(f"no sweep run for budget {budget:.3g} at width {width}: {plan.skipped[0]['reason']}")
    return plan.candidates[0]


def reference_run(config, recipe: Recipe, shape: FamilyShape, learning_rate: float):
    """A run at the recipe's reference shape (lr_ref_width for lr_ref_steps steps, the widest
    batch) at ``learning_rate``: what the lr_sweep asset trains. Its budget is what it spends."""
    return pinned_run(
        config, recipe, shape, recipe.lr_ref_width, max(config.batch_sizes), recipe.lr_ref_steps, learning_rate=learning_rate
    )


def pinned_run(
    config, recipe: Recipe, shape: FamilyShape, width: int, batch_size: int, steps: int, learning_rate: float | None = None
):
    """The run of ``width`` for exactly ``steps`` steps of ``batch_size`` (no budget bucket): its
    budget is what it spends; its LR the recipe's for (width, steps) unless given."""
    family = sweep_family(width, config, recipe, shape)
    width, depth, heads = family.shape(width)
    model = family.build_config(width, depth, heads)
    tokens = batch_size * config.seq_len * steps
    flops = training_flops_per_token(model, config.seq_len) * tokens
    lr = family.learning_rate(width, steps) if learning_rate is None else learning_rate
    return SweepCandidate(
        budget=flops,
        width=width,
        depth=depth,
        heads=heads,
        batch_size=batch_size,
        steps=steps,
        learning_rate=lr,
        tokens=tokens,
        flops=flops,
        params=active_params(model),
        config=model,
        recipe=recipe.name,
        optimizer=recipe.optimizer_config(),
    )


def validation_loss(
    params, model_config, caches: Mapping[str, str], seq_len: int, max_windows: int, batch_size: int = 32
) -> dict[str, float]:
    """Mean next-token cross-entropy (nats) over the first ``max_windows`` non-overlapping
    ``seq_len`` windows of each source's held-out tokens (``caches``: {source: a TokenStream or
    one validation split's path}; ``held_out_streams`` opens a mixture's), plus the unweighted
    mean over sources (the training mixture is uniform over sources, so each source counts the same)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from marin_assets.model import init_router_bias, loss_fn  # deferred (import cost): jax

    bias = init_router_bias(model_config)

    @jax.jit
    def ce(p, tokens):
        return loss_fn(p, tokens, model_config, bias)[1]["ce_loss"]

    out = {}
    for name, path in sorted(caches.items()):
        cache = as_stream(path)
        n = min(cache.num_tokens // seq_len, max_windows)
        if n < 1:
            raise ValueError(
                f"held-out data {cache.path} of source {name!r} has {cache.num_tokens} tokens, fewer than one window of {seq_len}"
            )
        total = 0.0
        for lo in range(0, n, batch_size):
            starts = np.arange(lo, min(lo + batch_size, n)) * seq_len
            total += float(ce(params, jnp.asarray(cache.read(starts, seq_len), jnp.int32))) * len(starts)
        out[name] = total / n
    out["mean"] = sum(out.values()) / len(out)
    return out


def score_trained_run(
    checkpoint_dir: str, config, validation_caches: Mapping[str, str], tokens: int, out_dir: str, *, record: Mapping | None = None
) -> dict:
    """A run the ladder did not train (a main run's newest phase), scored as its own runs are: the
    validation losses of its checkpoint on the same held-out windows, its active N and the FLOPs of
    ``tokens`` trained tokens. Writes run.json (with ``record``, e.g. a prediction's stamp); returns
    the counts the comparison reads."""
    from marin_assets.train.restore import load_model_from_checkpoint  # deferred (import cost): jax, optax

    params, model_config, _, meta = load_model_from_checkpoint(checkpoint_dir)
    val = validation_loss(params, model_config, validation_caches, config.seq_len, config.validation_windows)
    flops = training_flops_per_token(model_config, config.seq_len) * tokens
    run = {
        "checkpoint": str(checkpoint_dir),
        "step": meta.get("step"),
        "tokens": tokens,
        "flops": flops,
        "validation_loss": val,
        **(record or {}),
    }
    write_file(out_dir, "run.json", json.dumps(run, indent=1, default=str))
    return {
        "width": model_config.d_model,
        "depth": model_config.n_layers,
        "params": active_params(model_config),
        "vocab_size": model_config.vocab_size,
        "tokens": int(tokens),
        "flops": flops,
        "step": meta.get("step"),
        "validation_loss": float(val["mean"]),
    }


def held_out_streams(datasets: Mapping[str, str]) -> dict:
    """{source: its held-out TokenStream} of {source: dataset index path}; a source without
    held-out tokens is an error naming it (its loss could not be measured)."""
    out = {}
    for name, path in sorted(datasets.items()):
        source = open_source(path)
        if source.validation is None:
            raise ValueError(f"source {name!r} ({path}) has no held-out tokens: raise TokenizeConfig.validation_fraction")
        out[name] = source.validation
    return out


def run_sweep_point(
    budget: float,
    width: int,
    config,
    train_caches: Mapping[str, str],
    validation_caches: Mapping[str, str],
    out_dir: str,
    log=print,
    *,
    recipe: Recipe = V1,
    shape: FamilyShape = DENSE,
    seed: int = 0,
    run_prefix: str = "sweep",
) -> dict:
    """Train the planned model for (budget, width) to its budget, score it on validation.

    ``recipe`` gives the optimizer, init and LR (its base already re-tuned where it is tuned);
    ``seed`` is added to ``config.seed`` (a ladder's seeds). Writes ``run.json`` (plan,
    training result, validation losses) plus the training loop's metrics.jsonl and
    loss_curve.png under ``out_dir``; returns the counts."""
    cand = plan_run(budget, width, config, recipe, shape)
    key = partition_key(budget, width, seed)
    counts = train_candidate(
        cand,
        config,
        train_caches,
        validation_caches,
        out_dir,
        log=log,
        seed=config.seed + seed,
        run_name=f"{run_prefix}-{key}",
        record={"partition": key},
    )
    return counts | {"lr_base": recipe.lr_base}


def train_candidate(
    cand,
    config,
    train_caches: Mapping[str, str],
    validation_caches: Mapping[str, str],
    out_dir: str,
    *,
    run_name: str,
    seed: int,
    log=print,
    record: Mapping | None = None,
) -> dict:
    """Train a planned candidate (model, batch, steps, LR, optimizer) and score it on validation.

    ``run_name`` names its telemetry run; ``record`` is merged into run.json (e.g. a target's
    pre-registration stamp). Returns the counts every ladder run reports."""
    from marin_assets.train.loop import train  # deferred (import cost): jax, optax
    from marin_assets.train.restore import load_model_from_checkpoint  # deferred (import cost): jax, optax

    validate_segment(run_name, "telemetry run name")
    for source in validation_caches:  # checked before training, not after
        validate_segment(f"validation_loss.{source}", "telemetry metric name (from a validation source)")
    steps = cand.steps
    schedule = ScheduleConfig(
        kind="wsd",
        peak_lr=cand.learning_rate,
        warmup_steps=max(1, steps // 20),
        total_steps=steps,
        decay_steps=max(1, int(steps * config.decay_fraction)),
    )
    train_config = TrainConfig(
        model=cand.config,
        optimizer=cand.optimizer,
        schedule=schedule,
        seq_len=config.seq_len,
        batch_size=cand.batch_size,
        num_steps=steps,
        seed=seed,
        guards=GuardConfig(skip_sigma=config.skip_sigma),
        data_seed=seed,
        checkpoint_every_steps=steps,
        checkpoint_every_seconds=1e9,
    )
    log(
        f"{run_name}: {cand.params:.3g} params, batch {cand.batch_size} x {steps} steps = {cand.tokens} tokens, "
        f"{cand.recipe} ({train_config.optimizer.name}) lr {cand.learning_rate:.3g}"
    )
    started = time.monotonic()
    # The loop writes checkpoints with local file I/O, so train in a local scratch dir and
    # copy the small outputs over: out_dir may be any fsspec URL.
    with tempfile.TemporaryDirectory(prefix="sweep-") as scratch:
        result = train(train_config, dict(train_caches), scratch, resume=False, telemetry_run=run_name)
        train_s = time.monotonic() - started
        if result.final_step != steps or result.last_loss is None:
            raise RuntimeError(f"{run_name} stopped at step {result.final_step} of {steps}")
        last_loss = float(result.last_loss)
        params, model_config, _, _ = load_model_from_checkpoint(result.checkpoint_dir)
        val = validation_loss(params, model_config, validation_caches, config.seq_len, config.validation_windows)
        spent = training_flops_per_token(cand.config, config.seq_len) * result.tokens
        run = {
            "plan": cand.as_dict(),
            "model": {
                k: getattr(cand.config, k)
                for k in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "n_routed_experts", "top_k", "init_std")
            },
            "optimizer": dataclasses.asdict(train_config.optimizer),
            "train": {
                "final_step": result.final_step,
                "tokens": result.tokens,
                "last_loss": last_loss,
                "counts": result.counts,
                "seconds": round(train_s, 2),
            },
            "flops": spent,
            "validation_loss": val,
            **(record or {}),
        }
        _upload(Path(scratch), out_dir, ["metrics.jsonl", "loss_curve.png"])
    with TelemetryWriter(default_telemetry_root(), run_name) as writer:
        writer.log(
            result.final_step,
            {
                "validation_loss": val["mean"],
                "flops": spent,
                **{f"validation_loss.{k}": v for k, v in val.items() if k != "mean"},
            },
            phase=train_config.phase,
        )
    write_file(out_dir, "run.json", json.dumps(run, indent=1))
    log(f"{run_name}: train loss {last_loss:.4f}, validation {val['mean']:.4f} in {train_s:.1f}s")
    return {
        "budget": cand.budget,
        "width": cand.width,
        "depth": cand.depth,
        "params": cand.params,
        "vocab_size": config.vocab_size,
        "seed": seed,
        "tokens": int(result.tokens),
        "flops": spent,
        "steps": steps,
        "batch_size": cand.batch_size,
        "learning_rate": cand.learning_rate,
        "recipe": cand.recipe,
        "optimizer": train_config.optimizer.name,
        "train_loss": last_loss,
        "validation_loss": float(val["mean"]),
        "seconds": round(time.monotonic() - started, 2),
    }


def _upload(local: Path, root: str, names: Sequence[str]) -> None:
    for name in names:
        if (local / name).exists():
            write_file(root, name, (local / name).read_bytes())
