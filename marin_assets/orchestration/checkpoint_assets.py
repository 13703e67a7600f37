"""A run's checkpoints as assets: one partition per committed checkpoint, reported by the phase that wrote it.

A checkpoint's partition key is ``<phase>.<step, 9 digits>`` (``kestrel.000000048``): one store-safe
segment (store/names.py), sorted by step within a phase. Its version chains: sha256 over its parent's
version (the phase's previous checkpoint; for a phase's first, the final checkpoint of the phase it
warm-starts from; "" for none), the phase's own config version, the versions of the data it trains on and
the phase's code version. It is reported to Dagster as an ``AssetMaterialization`` of the checkpoint asset
with that version as its data version, once its COMMITTED marker is written, never before.

The phase keeps what it reported in ``checkpoint_versions.json`` in its work dir (which becomes its
artifact): a resumed attempt of the same phase version reports only the checkpoints not in it, so no
checkpoint is reported twice with different versions, and a later phase reads its warm start's final
checkpoint version from there.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg

from marin_assets.orchestration import compat
from marin_assets.store.fsutil import child, filesystem, join, read_json, write_json_atomic
from marin_assets.store.names import validate_segment
from marin_assets.store.versioning import canonical_json, compute_version
from marin_assets.train.checkpoints.retention import apply_retention, plan_retention
from marin_assets.train.metrics import read_metrics

log = logging.getLogger(__name__)
LEDGER = "checkpoint_versions.json"  # {partition key: {step, version, parent, path, tokens, kind}} in the work dir
STEP_DIGITS = 9  # checkpoint folders are step-NNNNNNNNN (train/checkpoints/checkpoint.py)


def checkpoint_key(phase: str, step: int) -> str:
    """The partition key of ``phase``'s checkpoint at ``step``: ``<phase>.<step:09d>``."""
    return validate_segment(f"{phase}.{step:0{STEP_DIGITS}d}", "checkpoint partition key")


def split_checkpoint_key(key: str) -> tuple[str, int]:
    """(phase, step) of a checkpoint partition key; ValueError for any other key."""
    phase, _, step = key.rpartition(".")
    if not phase or len(step) != STEP_DIGITS or not step.isdigit():
        raise ValueError(f"{key!r} is not a checkpoint partition key <phase>.<{STEP_DIGITS}-digit step>")
    return phase, int(step)


def config_version(fields: Mapping[str, Any]) -> str:
    """sha256 of a phase's versioned config fields (canonical JSON)."""
    return hashlib.sha256(canonical_json(dict(fields)).encode("utf-8")).hexdigest()


def read_ledger(work_dir: str | os.PathLike) -> dict[str, dict]:
    """What a phase work dir (or artifact) reported: {partition key: entry}; {} when none."""
    fs, path = filesystem(os.fspath(child(work_dir, LEDGER)))
    found = read_json(fs, path)
    return dict(found) if isinstance(found, Mapping) else {}


def final_checkpoint(work_dir: str | os.PathLike) -> tuple[str, dict] | None:
    """(key, entry) of the newest checkpoint a phase reported (the one a warm start from it reads), or None."""
    return _newest(read_ledger(work_dir))


def _newest(ledger: Mapping[str, dict]) -> tuple[str, dict] | None:
    """(key, entry) of a ledger's highest-step checkpoint, or None for an empty ledger."""
    return max(ledger.items(), key=lambda item: item[1]["step"]) if ledger else None


@dataclass(frozen=True)
class CheckpointLineage:
    """What every checkpoint of one phase version is made of, beside its parent."""

    asset_key: str  # e.g. "checkpoints/demo"
    partitions: str  # its DynamicPartitionsDefinition's name
    phase: str
    code_version: str
    config_version: str
    data_versions: Mapping[str, str]  # {label: version} of what the phase trains on
    first_parent: str = ""  # the warm start's final checkpoint version ("" for a fresh phase)

    def version(self, key: str, parent: str) -> str:
        upstream = {"parent": parent, **{f"data:{label}": v for label, v in self.data_versions.items()}}
        return compute_version(self.asset_key, self.code_version, {"phase_config": self.config_version}, key, upstream)


class CheckpointReporter:
    """Reports a phase's committed checkpoints (``committed`` live, ``scan`` from the work dir) on the
    thread that owns the Dagster context, each once per phase version."""

    def __init__(self, context: dg.AssetExecutionContext, lineage: CheckpointLineage, work_dir: str) -> None:
        self.context, self.lineage, self.work_dir = context, lineage, work_dir
        self.ledger = read_ledger(work_dir)
        self._losses: dict[int, float] = {}

    def committed(self, folder: Path | str, step: int) -> None:
        """A checkpoint the trainer just committed (``TrainingBackend.run_announcing``): its writer has
        verified it, so only the marker's presence is checked here, not every shard's digest again."""
        from marin_assets.train.checkpoints.checkpoint import MARKER  # deferred (import cost): jax

        fs, path = filesystem(os.fspath(folder))
        if not fs.exists(join(path, MARKER)):
            log.warning("not reporting %s: it has no %s marker", folder, MARKER)
            return
        self._report(folder, step)

    def scan(self) -> list[str]:
        """Report every valid checkpoint of the work dir not reported yet, in step order (what a backend
        could not announce, or an earlier attempt did not live to); returns their keys."""
        from marin_assets.train.checkpoints import checkpoint as ckpt  # deferred (import cost): jax

        reported = []
        for folder in ckpt.list_checkpoints(child(self.work_dir, "checkpoints")):
            step = int(os.fspath(folder).rstrip("/").rsplit("-", 1)[-1])
            if checkpoint_key(self.lineage.phase, step) in self.ledger:
                continue
            problem = ckpt.marker_problem(folder)
            if problem is not None:  # never committed (a kill mid-save) or damaged: not a checkpoint
                log.warning("not reporting %s: %s", folder, problem)
                continue
            reported.append(self._report(folder, step))
        return reported

    def retain(self, keep_last: int) -> list[str]:
        """The retention policy (train/checkpoints/retention.py) on the work dir before it becomes the phase's artifact:
        keep the newest ``keep_last`` valid checkpoints and the phase's final one, delete the other committed
        ones (0 keeps every one). Nothing else has read this phase's checkpoints yet, and every reader in the
        graph (a warm start, a branch, eval/<run>, export/<run>) reads a phase's final one, so no other
        checkpoint is pinned. A deleted checkpoint stays in the ledger, marked ``deleted``; returns their keys."""
        if keep_last == 0 or not self.ledger:
            return []
        deleted = apply_retention(self.work_dir, plan_retention(self.work_dir, keep_last))
        keys = []
        for gone in deleted:
            key = checkpoint_key(self.lineage.phase, gone["step"])
            if key in self.ledger:
                self.ledger[key]["deleted"] = True
            keys.append(key)
            self.context.log.info(f"retention: deleted checkpoint {key} ({gone['bytes']:,} bytes; keeping the last {keep_last})")
        self._write_ledger()
        return keys

    def final(self) -> tuple[str, dict] | None:
        """(key, entry) of the newest checkpoint reported for this phase, or None."""
        return _newest(self.ledger)

    def _write_ledger(self) -> None:
        fs, path = filesystem(os.fspath(child(self.work_dir, LEDGER)))
        write_json_atomic(fs, path, self.ledger)

    def _parent(self, step: int) -> tuple[str | None, str]:
        """(key, version) of the checkpoint before ``step`` in this phase, else the warm start's."""
        before = [(entry["step"], key) for key, entry in self.ledger.items() if entry["step"] < step]
        if not before:
            return None, self.lineage.first_parent
        key = max(before)[1]
        return key, self.ledger[key]["version"]

    def _report(self, folder: Path | str, step: int) -> str:
        key = checkpoint_key(self.lineage.phase, step)
        if key in self.ledger:  # an earlier attempt of this version reported it, with this very version
            return key
        parent_key, parent = self._parent(step)
        entry = {
            "step": step,
            "version": self.lineage.version(key, parent),
            "parent": parent,
            "path": f"checkpoints/{os.fspath(folder).rstrip('/').rsplit('/', 1)[-1]}",
            **self._meta(folder),
        }
        self.context.instance.add_dynamic_partitions(self.lineage.partitions, [key])
        self.context.log_event(
            dg.AssetMaterialization(
                asset_key=dg.AssetKey(self.lineage.asset_key.split("/")),
                partition=key,
                metadata=self._metadata(entry, parent_key),
                tags={compat.DATA_VERSION_TAG: entry["version"]},
            )
        )
        # After the event: a kill between the two re-reports the key next attempt, with the same version.
        self.ledger[key] = entry
        self._write_ledger()
        return key

    def _metadata(self, entry: dict, parent_key: str | None) -> dict[str, Any]:
        loss = self._loss(entry["step"])
        return {
            "phase": self.lineage.phase,
            "step": entry["step"],
            "path": entry["path"],
            "tokens": entry["tokens"],
            "kind": entry["kind"],
            "version": entry["version"],
            "parent_checkpoint": parent_key or "",
            **({"loss": loss} if loss is not None else {}),
        }

    @staticmethod
    def _meta(folder: Path | str) -> dict[str, Any]:
        """Tokens trained at the checkpoint and its kind (a temporary one is pruned when the next commits)."""
        fs, path = filesystem(os.fspath(folder))
        meta = read_json(fs, join(path, "meta.json")) or {}
        tokens = meta.get("tokens")
        return {"tokens": tokens if isinstance(tokens, int) else None, "kind": str(meta.get("kind", ""))}

    def _loss(self, step: int) -> float | None:
        """The step's loss from metrics.jsonl (the trainer syncs it before each checkpoint), if logged."""
        if step not in self._losses:
            rows = read_metrics(child(self.work_dir, "metrics.jsonl"))
            self._losses = {r["step"]: float(r["loss"]) for r in rows if isinstance(r.get("loss"), (int, float))}
        return self._losses.get(step)
