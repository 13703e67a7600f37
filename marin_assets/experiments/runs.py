"""One screening run per (arm, budget, seed): its config, its content version, its execution.

A run trains the arm's config for the steps its FLOP budget buys (``model.flops``
convention: the arm's own FLOPs per token, so a cheaper architecture gets more steps), on
the screens' corpus (``data.py``: a DataKit dataset of standard-library sources, read in
place through its index, as ``marin train`` reads one), then scores the final checkpoint's
mean cross-entropy on the dataset's held-out split with the trained router bias. The model's
vocabulary is the dataset's where the record leaves ``model.vocab_size`` unset. With
``wandb: true`` in the arm's config (offline unless ``WANDB_MODE`` says otherwise) the run
also logs to W&B: its row then links the W&B run (``wandb``: run id, mode, folder) and the
artifact keeps the offline run folder for ``wandb sync``; without it the row has no ``wandb``
key. Runs are artifacts in the content-versioned store: the version hashes the full
TrainConfig, the evaluation settings and the corpus version (the digest of the dataset
index), so a rerun of the same arm/budget/seed is a cache hit, and any change to what the
run computes is a new version. Each run.json names the dataset it read (``corpus``: index
path and version) and keeps the stamp of the record it ran under (``lock.run_stamp``: the
frozen fields and their hashes), so the freeze of a started experiment lives in its runs,
not only in ``LOCK.json``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from marin_assets.experiments.data import CORPUS_KEY, Corpus
from marin_assets.experiments.lock import STAMP_KEY, check_lock, check_run_rows, lock_arm, run_stamp
from marin_assets.experiments.record import ExperimentRecord, validate_name
from marin_assets.experiments.speedup import RunLoss
from marin_assets.model import flops_per_token
from marin_assets.scaling.sweep import budget_label
from marin_assets.store import ArtifactRef, ArtifactStore, compute_version
from marin_assets.store.fsutil import filesystem, join, read_json
from marin_assets.train.config import config_to_dict, replace
from marin_assets.train.data.sources import open_sources

if TYPE_CHECKING:  # imports jax: only where a run is planned or executed (see record.RecordOutline)
    from marin_assets.train.config import TrainConfig

CODE_VERSION = "2"  # 2: the corpus is a DataKit dataset (index + held-out split), vocab from the dataset
RESERVED_NAMES = (CORPUS_KEY.split("/", 1)[1],)  # an experiment's folder would be the corpus's
MIN_STEPS = 10


def runs_key(experiment: str) -> str:
    if experiment in RESERVED_NAMES:
        raise ValueError(f"experiment name {experiment!r} is reserved")
    return f"experiments/{validate_name(experiment, 'experiment name')}/runs"


def partition_key(arm: str, budget: float, seed: int) -> str:
    """ "partial_rope", 2e10, 1 -> "partial_rope-C2e10-s1" (arm names have no "-")."""
    return f"{validate_name(arm, 'arm name')}-C{budget_label(budget)}-s{int(seed)}"


def parse_partition_key(key: str) -> tuple[str, float, int]:
    try:
        arm, c_part, s_part = key.split("-")
        if not (c_part.startswith("C") and s_part.startswith("s")):
            raise ValueError
        return validate_name(arm, "arm name"), float(c_part[1:]), int(s_part[1:])
    except ValueError:
        raise ValueError(
            f"experiment run key {key!r} is not of the form <arm>-C<budget>-s<seed>, e.g. partial_rope-C2e10-s1"
        ) from None


@dataclasses.dataclass(frozen=True)
class RunSpec:
    experiment: str
    arm: str
    budget: float
    seed: int
    config: TrainConfig  # with this run's steps, schedule and seeds
    flops_per_token: float

    @property
    def key(self) -> str:
        return partition_key(self.arm, self.budget, self.seed)

    @property
    def flops(self) -> float:
        return self.flops_per_token * self.config.num_steps * self.config.tokens_per_step


def run_spec(record: ExperimentRecord, arm: str, budget: float, seed: int, vocab_size: int) -> RunSpec:
    """The arm's config with the steps ``budget`` buys and a WSD schedule scaled to them;
    ``vocab_size`` (the corpus's) fills ``model.vocab_size`` where the record leaves it unset."""

    base = record.train_config(arm, vocab_size=vocab_size)
    if base.model.vocab_size < vocab_size:
        raise ValueError(
            f"{record.source}: arm {arm!r}: model.vocab_size {base.model.vocab_size} is below the corpus's "
            f"vocabulary {vocab_size}; leave it unset to take the corpus's"
        )
    fpt = flops_per_token(base.model, base.seq_len)
    steps = round(budget / (fpt * base.tokens_per_step))
    if steps < MIN_STEPS:
        raise ValueError(
            f"{record.source}: arm {arm!r} at budget {budget:.3g} gets {steps} steps "
            f"({fpt * base.tokens_per_step:.3g} FLOPs each); need >= {MIN_STEPS}: raise the budget"
        )
    frac = record.schedule
    schedule = {"total_steps": steps}
    if base.schedule.kind in ("wsd", "cosine"):
        schedule["warmup_steps"] = max(1, round(steps * frac.warmup_fraction))
    if base.schedule.kind == "wsd":
        schedule["decay_steps"] = max(1, round(steps * frac.decay_fraction))
    config = replace(
        base,
        num_steps=steps,
        seed=seed,
        data_seed=seed,
        schedule=schedule,
        checkpoint_every_steps=steps,
        checkpoint_every_seconds=1e9,
    )
    return RunSpec(record.name, arm, budget, seed, config, fpt)


def run_keys(record: ExperimentRecord) -> list[str]:
    """Every run's partition key, in plan order: arms in record order (baseline first), budgets, seeds."""
    labels = [budget_label(b) for b in record.budgets]
    if len(set(labels)) != len(labels):
        raise ValueError(f"{record.source}: budgets must differ at 2 significant digits, got {labels}")
    return [partition_key(arm.name, b, s) for arm in record.all_arms() for b in record.budgets for s in arm.seeds]


def plan_runs(record: ExperimentRecord, vocab_size: int) -> list[RunSpec]:
    """Every run of the record (``run_keys`` order), on a corpus of ``vocab_size`` ids."""
    run_keys(record)  # the budgets' labels are distinct
    return [run_spec(record, arm.name, b, s, vocab_size) for arm in record.all_arms() for b in record.budgets for s in arm.seeds]


def run_version(spec: RunSpec, record: ExperimentRecord, corpus_version: str) -> str:
    return compute_version(
        runs_key(spec.experiment),
        CODE_VERSION,
        {"train": config_to_dict(spec.config), "validation_windows": record.validation_windows},
        spec.key,
        {"corpus": corpus_version},
    )


# ---------------------------------------------------------------- execution


def validation_loss(checkpoint_dir: Path, dataset_index: str, seq_len: int, windows: int, batch_size: int = 32) -> float:
    """Mean next-token cross-entropy (nats) over the first ``windows`` non-overlapping
    ``seq_len`` windows of the dataset's held-out split (its shards' validation caches, in
    order, opened by the trainer's reader), with the run's own trained router bias (MoE
    routing as trained)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from marin_assets.model import loss_fn  # deferred (import cost): jax
    from marin_assets.train.restore import load_model_from_checkpoint  # deferred (import cost): jax, optax

    params, model_config, bias, _ = load_model_from_checkpoint(checkpoint_dir)
    cache = open_sources({"corpus": dataset_index})["corpus"].validation
    n = 0 if cache is None else min(cache.num_tokens // seq_len, windows)
    if cache is None or n < windows:
        raise ValueError(f"the held-out split of {dataset_index} holds {n} windows of {seq_len} tokens, fewer than {windows}")
    ce = jax.jit(lambda p, tokens: loss_fn(p, tokens, model_config, bias)[1]["ce_loss"])
    total = 0.0
    for lo in range(0, n, batch_size):
        starts = np.arange(lo, min(lo + batch_size, n)) * seq_len
        total += float(ce(params, jnp.asarray(cache.read(starts, seq_len), jnp.int32))) * len(starts)
    return total / n


# wandb names a run's folder "<offline-run|run>-<YYYYMMDD_HHMMSS>-<run id>" under <dir>/wandb.
_WANDB_RUN_DIR = re.compile(r"(offline-run|run)-\d{8}_\d{6}-([a-z0-9]+)")


def wandb_run_dir(train_out: Path) -> tuple[Path, str, str] | None:
    """(folder, run id, "offline" | "online") of the one W&B run under ``train_out``, or None."""
    found = [
        (d, m) for d in sorted((train_out / "wandb").glob("*run-*")) if d.is_dir() and (m := _WANDB_RUN_DIR.fullmatch(d.name))
    ]
    if len(found) > 1:
        raise RuntimeError(f"{train_out}: {len(found)} W&B runs where one run was trained: {[d.name for d, _ in found]}")
    if not found:
        return None
    folder, match = found[0]
    return folder, match.group(2), "offline" if match.group(1) == "offline-run" else "online"


def _keep_wandb_run(spec: RunSpec, train_out: Path, out_dir: str) -> dict:
    """The row's W&B link; the run folder is copied into the artifact (``wandb sync`` it later)."""
    found = wandb_run_dir(train_out)
    if found is None:
        raise RuntimeError(f"run {spec.key}: wandb is enabled but the training left no W&B run under {train_out}/wandb")
    folder, run_id, mode = found
    kept = join(out_dir, "wandb", folder.name)
    fs, _ = filesystem(kept)
    fs.put(str(folder), kept, recursive=True)
    return {"run_id": run_id, "mode": mode, "dir": kept}


def execute_run(
    spec: RunSpec, corpus: Corpus, validation_windows: int, out_dir: str, stamp: Mapping[str, Any] | None = None
) -> dict:
    """Train and score one run on ``corpus``; write run.json (the dataset it read under ``corpus``,
    ``stamp`` under STAMP_KEY if given) and metrics.jsonl."""
    import fsspec

    from marin_assets.train.loop import train  # deferred (import cost): jax, optax

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="experiment-run-") as scratch:
        result = train(spec.config, {"train": corpus.index}, scratch, resume=False)
        if result.final_step != spec.config.num_steps:
            raise RuntimeError(f"run {spec.key} stopped at step {result.final_step} of {spec.config.num_steps}")
        loss = validation_loss(result.checkpoint_dir, corpus.index, spec.config.seq_len, validation_windows)
        metrics = (Path(scratch) / "metrics.jsonl").read_bytes()
        link = _keep_wandb_run(spec, Path(scratch), out_dir) if spec.config.wandb else None
    row = {
        "arm": spec.arm,
        "budget": spec.budget,
        "seed": spec.seed,
        "flops": spec.flops,
        "steps": spec.config.num_steps,
        "tokens": result.tokens,
        "validation_loss": loss,
        "train_loss": result.last_loss,
        "counts": result.counts,
        "seconds": round(time.monotonic() - started, 2),
        "config": config_to_dict(spec.config),
        "corpus": {"index": corpus.index, "version": corpus.version},
    }
    if link is not None:
        row["wandb"] = link
    if stamp is not None:
        row[STAMP_KEY] = dict(stamp)
    with fsspec.open(join(out_dir, "metrics.jsonl"), "wb") as f:
        f.write(metrics)
    with fsspec.open(join(out_dir, "run.json"), "w") as f:
        json.dump(row, f, indent=1)
    return row


def materialize_run(
    store: ArtifactStore, record: ExperimentRecord, spec: RunSpec, corpus: Corpus, log: Callable[[str], None] = print
) -> tuple[dict, bool]:
    """(the run's row, cache_hit). Refuses an edited started record, cache hit or not.

    The stamp does not enter the version: an edit to a frozen field that leaves the config
    alone (the hypothesis, the criterion) must be refused, not recomputed under the new text.
    """

    # The lock files now; every committed run's stamp before a run is trained (lock_arm), and this
    # run's own stamp below: a rerun of cache hits reads no other run.
    check_lock(store, record, scan_runs=False)
    version = run_version(spec, record, corpus.version)

    def compute(out: str) -> dict:
        lock_arm(store, record, spec.arm)
        log(f"{record.name} {spec.key}: {spec.config.num_steps} steps, {spec.flops:.3g} FLOPs")
        row = execute_run(spec, corpus, record.validation_windows, out, stamp=run_stamp(record, spec.arm))
        log(f"{record.name} {spec.key}: validation loss {row['validation_loss']:.4f} in {row['seconds']}s")
        return {"validation_loss": row["validation_loss"], "steps": row["steps"]}

    done = store.materialize(
        runs_key(record.name),
        spec.key,
        version,
        compute,
        {
            "config": {"train": config_to_dict(spec.config)},
            "upstream": {"corpus": corpus.version},
            "corpus": {"index": corpus.index},
        },
    )
    row = read_run(done.ref)
    check_run_rows(record, [row])  # a cache hit may be a version the pointers no longer name
    store.write_pointer(done.ref)
    return row, done.cache_hit


def committed_runs(store: ArtifactStore, experiment: str) -> list[tuple[str, dict]]:
    """(partition key, run.json row) of each run of ``experiment`` in the store: its LATEST pointer's version."""
    key = runs_key(experiment)
    root = join(store.root, *key.split("/"))  # <prefix>/<asset key>/<partition>/ (README: content versioning)
    if not store.fs.exists(root):
        return []
    out = []
    for entry in sorted(store.fs.ls(root, detail=True), key=lambda e: e["name"]):
        partition = entry["name"].rstrip("/").rsplit("/", 1)[-1]
        if entry["type"] != "directory" or not _is_partition_key(partition):
            continue  # not a run's folder
        ref = store.read_pointer(key, partition)
        if ref is not None:
            out.append((partition, read_run(ref)))
    return out


def _is_partition_key(name: str) -> bool:
    try:
        parse_partition_key(name)
    except ValueError:
        return False
    return True


def read_run(ref: ArtifactRef) -> dict:
    fs, _ = filesystem(ref.data_path)
    row = read_json(fs, join(ref.data_path, "run.json"))
    if row is None:
        raise FileNotFoundError(f"{ref.path}: run.json is missing")
    return row


def run_loss(row: Mapping) -> RunLoss:
    return RunLoss(
        arm=row["arm"],
        budget=float(row["budget"]),
        seed=int(row["seed"]),
        flops=float(row["flops"]),
        loss=float(row["validation_loss"]),
    )
