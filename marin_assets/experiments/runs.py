"""One screening run per (arm, budget, seed): its config, its content version, its execution.

A run trains the arm's config for the steps its FLOP budget buys (``model.flops``
convention: the arm's own FLOPs per token, so a cheaper architecture gets more steps), on
the standard-library byte corpus (``data.py``), then scores the final checkpoint's mean
cross-entropy on the validation split with the trained router bias. With ``wandb: true`` in
the arm's config (offline unless ``WANDB_MODE`` says otherwise) the run also logs to W&B:
its row then links the W&B run (``wandb``: run id, mode, folder) and the artifact keeps the
offline run folder for ``wandb sync``; without it the row has no ``wandb`` key. Runs are artifacts in
the content-versioned store: the version hashes the full TrainConfig, the evaluation
settings and the corpus version, so a rerun of the same arm/budget/seed is a cache hit,
and any change to what the run computes is a new version. Each run.json also keeps the
stamp of the record it ran under (``lock.run_stamp``: the frozen fields and their hashes),
so the freeze of a started experiment lives in its runs, not only in ``LOCK.json``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from marin_assets.experiments import data as corpus
from marin_assets.experiments.lock import STAMP_KEY, check_lock, check_run_rows, lock_arm, run_stamp
from marin_assets.experiments.record import ExperimentRecord, validate_name
from marin_assets.experiments.speedup import RunLoss
from marin_assets.scaling.sweep import budget_label
from marin_assets.store import ArtifactRef, ArtifactStore, compute_version
from marin_assets.store.fsutil import join, read_json, write_json_atomic

if TYPE_CHECKING:  # imports jax: only where a run is planned or executed (see record.RecordOutline)
    from marin_assets.train.config import TrainConfig

CODE_VERSION = "1"
CORPUS_KEY = "experiments/stdlib_bytes"
RESERVED_NAMES = ("stdlib_bytes",)  # experiment names that would collide with CORPUS_KEY
MIN_STEPS = 10


def runs_key(experiment: str) -> str:
    if experiment in RESERVED_NAMES:
        raise ValueError(f"experiment name {experiment!r} is reserved")
    return f"experiments/{validate_name(experiment, 'experiment name')}/runs"


def partition_key(arm: str, budget: float, seed: int) -> str:
    """"partial_rope", 2e10, 1 -> "partial_rope-C2e10-s1" (arm names have no "-")."""
    return f"{validate_name(arm, 'arm name')}-C{budget_label(budget)}-s{int(seed)}"


def parse_partition_key(key: str) -> tuple[str, float, int]:
    try:
        arm, c_part, s_part = key.split("-")
        if not (c_part.startswith("C") and s_part.startswith("s")):
            raise ValueError
        return validate_name(arm, "arm name"), float(c_part[1:]), int(s_part[1:])
    except ValueError:
        raise ValueError(f"experiment run key {key!r} is not of the form <arm>-C<budget>-s<seed>, "
                         "e.g. partial_rope-C2e10-s1") from None


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


def run_spec(record: ExperimentRecord, arm: str, budget: float, seed: int) -> RunSpec:
    """The arm's config with the steps ``budget`` buys and a WSD schedule scaled to them."""
    from marin_assets.model import flops_per_token
    from marin_assets.train.config import replace

    base = record.train_config(arm)
    if base.model.vocab_size != corpus.VOCAB_SIZE:
        raise ValueError(f"{record.source}: arm {arm!r}: model.vocab_size must be {corpus.VOCAB_SIZE} "
                         f"(the byte-level corpus), got {base.model.vocab_size}")
    fpt = flops_per_token(base.model, base.seq_len)
    steps = round(budget / (fpt * base.tokens_per_step))
    if steps < MIN_STEPS:
        raise ValueError(f"{record.source}: arm {arm!r} at budget {budget:.3g} gets {steps} steps "
                         f"({fpt * base.tokens_per_step:.3g} FLOPs each); need >= {MIN_STEPS}: raise the budget")
    frac = record.schedule
    schedule = {"total_steps": steps}
    if base.schedule.kind in ("wsd", "cosine"):
        schedule["warmup_steps"] = max(1, round(steps * frac.warmup_fraction))
    if base.schedule.kind == "wsd":
        schedule["decay_steps"] = max(1, round(steps * frac.decay_fraction))
    config = replace(base, num_steps=steps, seed=seed, data_seed=seed, schedule=schedule,
                     checkpoint_every_steps=steps, checkpoint_every_seconds=1e9)
    return RunSpec(record.name, arm, budget, seed, config, fpt)


def plan_runs(record: ExperimentRecord) -> list[RunSpec]:
    """Every run of the record: arms in record order (baseline first), budgets, seeds."""
    labels = [budget_label(b) for b in record.budgets]
    if len(set(labels)) != len(labels):
        raise ValueError(f"{record.source}: budgets must differ at 2 significant digits, got {labels}")
    return [run_spec(record, arm.name, b, s) for arm in record.all_arms() for b in record.budgets for s in arm.seeds]


def run_version(spec: RunSpec, record: ExperimentRecord, corpus_version: str) -> str:
    from marin_assets.train.config import config_to_dict

    return compute_version(runs_key(spec.experiment), CODE_VERSION,
                           {"train": config_to_dict(spec.config), "validation_windows": record.validation_windows},
                           spec.key, {"corpus": corpus_version})


# ---------------------------------------------------------------- execution


def materialize_corpus(store: ArtifactStore, n_files: int, log: Callable[[str], None] = print) -> ArtifactRef:
    version = compute_version(CORPUS_KEY, CODE_VERSION, {"files": n_files, "content": corpus.fingerprint(n_files)})

    def build(out: str) -> dict:
        log(f"building the byte-level corpus ({n_files} standard-library files)")
        stats = corpus.build_caches(out, n_files)
        write_json_atomic(store.fs, join(out, "stats.json"), stats)
        return {split: s["tokens"] for split, s in stats.items()}

    return store.materialize(CORPUS_KEY, None, version, build, {"config": {"files": n_files}}).ref


def validation_loss(checkpoint_dir: Path, validation_cache: str, seq_len: int, windows: int,
                    batch_size: int = 32) -> float:
    """Mean next-token cross-entropy (nats) over the first ``windows`` non-overlapping
    ``seq_len`` windows, with the run's own trained router bias (MoE routing as trained)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from marin_assets.evaluation.run import load_model_from_checkpoint
    from marin_assets.model import loss_fn
    from marin_assets.train.data import TokenCache

    params, model_config, bias, _ = load_model_from_checkpoint(checkpoint_dir)
    cache = TokenCache(validation_cache)
    n = min(cache.num_tokens // seq_len, windows)
    if n < windows:
        raise ValueError(f"validation cache {validation_cache} holds {n} windows of {seq_len}, fewer than {windows}")
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
    found = [(d, m) for d in sorted((train_out / "wandb").glob("*run-*"))
             if d.is_dir() and (m := _WANDB_RUN_DIR.fullmatch(d.name))]
    if len(found) > 1:
        raise RuntimeError(f"{train_out}: {len(found)} W&B runs where one run was trained: {[d.name for d, _ in found]}")
    if not found:
        return None
    folder, match = found[0]
    return folder, match.group(2), "offline" if match.group(1) == "offline-run" else "online"


def _keep_wandb_run(spec: RunSpec, train_out: Path, out_dir: str) -> dict:
    """The row's W&B link; the run folder is copied into the artifact (``wandb sync`` it later)."""
    from marin_assets.store.fsutil import filesystem

    found = wandb_run_dir(train_out)
    if found is None:
        raise RuntimeError(f"run {spec.key}: wandb is enabled but the training left no W&B run under {train_out}/wandb")
    folder, run_id, mode = found
    kept = join(out_dir, "wandb", folder.name)
    fs, _ = filesystem(kept)
    fs.put(str(folder), kept, recursive=True)
    return {"run_id": run_id, "mode": mode, "dir": kept}


def execute_run(spec: RunSpec, corpus_ref: ArtifactRef, validation_windows: int, out_dir: str,
                stamp: Mapping[str, Any] | None = None) -> dict:
    """Train and score one run; write run.json (with ``stamp`` under STAMP_KEY if given) and metrics.jsonl."""
    import fsspec

    from marin_assets.train.config import config_to_dict
    from marin_assets.train.loop import train

    caches = {"train": join(corpus_ref.data_path, "train")}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="experiment-run-") as scratch:
        result = train(spec.config, caches, scratch, resume=False)
        if result.final_step != spec.config.num_steps:
            raise RuntimeError(f"run {spec.key} stopped at step {result.final_step} of {spec.config.num_steps}")
        loss = validation_loss(result.checkpoint_dir, join(corpus_ref.data_path, "validation"),
                               spec.config.seq_len, validation_windows)
        metrics = (Path(scratch) / "metrics.jsonl").read_bytes()
        link = _keep_wandb_run(spec, Path(scratch), out_dir) if spec.config.wandb else None
    row = {"arm": spec.arm, "budget": spec.budget, "seed": spec.seed, "flops": spec.flops,
           "steps": spec.config.num_steps, "tokens": result.tokens, "validation_loss": loss,
           "train_loss": result.last_loss, "counts": result.counts, "seconds": round(time.monotonic() - started, 2),
           "config": config_to_dict(spec.config)}
    if link is not None:
        row["wandb"] = link
    if stamp is not None:
        row[STAMP_KEY] = dict(stamp)
    with fsspec.open(join(out_dir, "metrics.jsonl"), "wb") as f:
        f.write(metrics)
    with fsspec.open(join(out_dir, "run.json"), "w") as f:
        json.dump(row, f, indent=1)
    return row


def materialize_run(store: ArtifactStore, record: ExperimentRecord, spec: RunSpec, corpus_ref: ArtifactRef,
                    log: Callable[[str], None] = print) -> tuple[dict, bool]:
    """(the run's row, cache_hit). Refuses an edited started record, cache hit or not.

    The stamp does not enter the version: an edit to a frozen field that leaves the config
    alone (the hypothesis, the criterion) must be refused, not recomputed under the new text.
    """
    from marin_assets.train.config import config_to_dict

    # The lock files now; every committed run's stamp before a run is trained (lock_arm), and this
    # run's own stamp below: a rerun of cache hits reads no other run.
    check_lock(store, record, scan_runs=False)
    version = run_version(spec, record, corpus_ref.version)

    def compute(out: str) -> dict:
        lock_arm(store, record, spec.arm)
        log(f"{record.name} {spec.key}: {spec.config.num_steps} steps, {spec.flops:.3g} FLOPs")
        row = execute_run(spec, corpus_ref, record.validation_windows, out, stamp=run_stamp(record, spec.arm))
        log(f"{record.name} {spec.key}: validation loss {row['validation_loss']:.4f} in {row['seconds']}s")
        return {"validation_loss": row["validation_loss"], "steps": row["steps"]}

    done = store.materialize(runs_key(record.name), spec.key, version, compute,
                             {"config": {"train": config_to_dict(spec.config)}, "upstream": {"corpus": corpus_ref.version}})
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
    from marin_assets.store.fsutil import filesystem

    fs, _ = filesystem(ref.data_path)
    row = read_json(fs, join(ref.data_path, "run.json"))
    if row is None:
        raise FileNotFoundError(f"{ref.path}: run.json is missing")
    return row


def run_loss(row: Mapping) -> RunLoss:
    return RunLoss(arm=row["arm"], budget=float(row["budget"]), seed=int(row["seed"]), flops=float(row["flops"]),
                   loss=float(row["validation_loss"]))
