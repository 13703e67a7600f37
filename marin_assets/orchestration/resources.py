"""Dagster resources and the IO manager that pass artifact references between assets.

Only references travel (a versioned path plus its manifest, as a small JSON pointer):
never pickled frames, so shards can be terabytes and live on gs:// or s3://.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property

import dagster as dg

from marin_assets.local_workers import env_count as _count
from marin_assets.local_workers import local_workers
from marin_assets.orchestration.training_backends import KubernetesTrainingBackend, LocalTrainingBackend, ProcessesTrainingBackend
from marin_assets.settings import artifact_prefix, setting
from marin_assets.store import ArtifactRef, ArtifactStore, LeaseConfig

_LEASE = LeaseConfig()


class ArtifactStoreResource(dg.ConfigurableResource):
    """Where content-versioned artifacts live: a local path or any fsspec URL; and how many
    local processes a range run computes them on (a driver such as `marin datakit run` hands
    its --workers here, so the count reaches the run's steps without the environment)."""

    prefix: str | None = None  # None: $MARIN_PREFIX at run time, else ./artifacts
    lease_heartbeat_s: float = _LEASE.heartbeat_s  # the store's own defaults (LeaseConfig), declared once
    lease_stale_after_s: float = _LEASE.stale_after_s
    local_workers: int | None = None  # None: $MARIN_LOCAL_WORKERS at run time, else the core count

    def range_workers(self) -> int:
        return self.local_workers or local_workers()

    @cached_property
    def store(self) -> ArtifactStore:
        return ArtifactStore(self.prefix or artifact_prefix(), LeaseConfig(self.lease_heartbeat_s, self.lease_stale_after_s))


class ArtifactIOManager(dg.ConfigurableIOManager):
    """Stores/loads ``ArtifactRef`` pointers (``LATEST.json``) next to the versions.

    A partitioned upstream always loads as ``{partition_key: ArtifactRef}`` (just the keys
    the step needs: one for a single-partition run); the versioned-asset wrapper hands each
    partition's body its own reference. A range run's output is ``{partition_key: ArtifactRef}``
    too: one pointer per partition.
    """

    artifact_store: ArtifactStoreResource

    def handle_output(self, context: dg.OutputContext, obj: ArtifactRef | Mapping[str, ArtifactRef]) -> None:
        store = self.artifact_store.store
        name = context.asset_key.to_user_string()
        if isinstance(obj, ArtifactRef):
            _point_to(store, obj)
            return
        if not isinstance(obj, Mapping):
            raise TypeError(
                f"{name} must return an ArtifactRef (or {{partition: ArtifactRef}} for a range), got {type(obj).__name__}"
            )
        expected = set(context.asset_partition_keys) if context.has_asset_partitions else set()
        if set(obj) != expected:
            missing, extra = sorted(expected - set(obj)), sorted(set(obj) - expected)
            raise ValueError(
                f"{name}: a range output must hold one ArtifactRef per partition of the run; "
                f"missing {missing[:5]}, unexpected {extra[:5]}"
            )
        for partition, ref in obj.items():
            if not isinstance(ref, ArtifactRef) or ref.partition != partition:
                raise TypeError(f"{name} partition {partition!r}: expected its ArtifactRef, got {ref!r:.200}")
            _point_to(store, ref)

    def load_input(self, context: dg.InputContext) -> ArtifactRef | dict[str, ArtifactRef]:
        check_run_partition(context)
        store = self.artifact_store.store
        key = "/".join(context.asset_key.path)
        if not context.has_asset_partitions:
            return _require(store.read_pointer(key, None), key, None)
        return {p: _require(store.read_pointer(key, p), key, p) for p in context.asset_partition_keys}


MAX_KNOWN_SHOWN = 20


def check_run_partition(context: dg.InputContext) -> None:
    """A step's partition must be one its definition holds. Dagster runs whatever partition a run's tags name
    (``dagster job execute -j train_phase --tags '{"dagster/partition": "nope"}'`` is not checked against a
    dynamic set), and the step then failed on something else (an unmaterialised input) without naming it: a
    step's first input is where it is refused, naming the partition and the known ones."""
    if not context.has_partition_key:
        return
    try:
        step = context.step_context
    except dg.DagsterInvariantViolationError:  # an InputContext built outside a run (build_input_context)
        return
    partitions, key = step.run_partitions_def, context.partition_key
    if isinstance(partitions, dg.DynamicPartitionsDefinition) and partitions.name is not None:
        if step.instance.has_dynamic_partition(partitions.name, key):  # one lookup, not the whole set
            return
        known = list(partitions.get_partition_keys(dynamic_partitions_store=step.instance))
    elif isinstance(partitions, dg.StaticPartitionsDefinition):
        known = list(partitions.get_partition_keys())
    else:  # time windows and multi-dimensional keys: a key's validity is not a list lookup
        return
    if key in known:
        return
    shown = f"{known[:MAX_KNOWN_SHOWN]}{' and more' if len(known) > MAX_KNOWN_SHOWN else ''}" if known else "none yet"
    name = getattr(partitions, "name", None) or type(partitions).__name__
    raise ValueError(f"step {step.step.key}: partition {key!r} is not a partition of {name}; known ({len(known)}): {shown}")


def _point_to(store: ArtifactStore, ref: ArtifactRef) -> None:
    """Make ``ref`` current; a cache hit that is already current costs a read, not an fsync'd
    write (a range rerun of 10,000 cached partitions)."""
    if store.read_pointer(ref.asset_key, ref.partition) != ref:
        store.write_pointer(ref)


def _require(ref: ArtifactRef | None, key: str, partition: str | None) -> ArtifactRef:
    if ref is None:
        where = f" partition {partition!r}" if partition else ""
        raise FileNotFoundError(f"upstream asset {key!r}{where} has not been materialised yet")
    return ref


# ---- which training backend a phase runs on ---------------------------------------------

TRAINING_BACKEND_ENV = "MARIN_TRAINING_BACKEND"  # local (default) | processes | kubernetes
TRAIN_PROCESSES_ENV = "MARIN_TRAIN_PROCESSES"  # processes: worker processes (default 2)
TRAIN_DEVICES_ENV = "MARIN_TRAIN_DEVICES_PER_PROCESS"  # processes: CPU devices per process (default: jax's)
FLEET_FILE_ENV = "MARIN_FLEET_FILE"  # kubernetes: the fleet the run's tags are checked against
TRAINING_BACKENDS = ("local", "processes", "kubernetes")


def training_backend_from_env(env: Mapping[str, str] | None = None):
    """The ``training_backend`` resource chosen by $MARIN_TRAINING_BACKEND (read when the code
    location loads, i.e. in the run worker's own environment); ValueError naming the variable."""
    kind = setting(TRAINING_BACKEND_ENV, env) or "local"
    if kind == "local":
        return LocalTrainingBackend()
    if kind == "processes":
        return ProcessesTrainingBackend(
            processes=_count(env, TRAIN_PROCESSES_ENV, None) or 2,  # a count is >= 1
            devices_per_process=_count(env, TRAIN_DEVICES_ENV, None),
        )
    if kind == "kubernetes":
        fleet = setting(FLEET_FILE_ENV, env)
        if not fleet:
            raise ValueError(
                f"{TRAINING_BACKEND_ENV}=kubernetes needs {FLEET_FILE_ENV} (the fleet YAML the run's "
                f"marin/accelerator and marin/chips tags are checked against)"
            )
        return KubernetesTrainingBackend(fleet_file=fleet)
    raise ValueError(f"{TRAINING_BACKEND_ENV}={kind[:40]!r} is not one of {', '.join(TRAINING_BACKENDS)}")
