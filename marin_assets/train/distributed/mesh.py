"""The training device mesh: ``("data", "sequence", "expert")``, one or many processes.

    setup = distributed.init_distributed()           # before anything touches a JAX backend
    mesh = train_mesh(config)                      # all global devices, the config's sequence axis
    ep = expert_parallel(mesh, config.model)       # the routed experts' shard_map transport
    state_sh = state_shardings(mesh, state)        # state: arrays or jax.eval_shape output
    step = jit_step(step_fn, mesh, state_sh)       # step(state, tokens, *scalars)
    tokens = shard_batch(mesh, local_rows, config.batch_size)  # rows = process_rows(...)

Layout (what is sharded where, and why):
- The batch is sharded over ``("data", "expert")`` together: the expert axis is also a
  data-parallel axis for everything except the routed experts (as in GShard/DeepSpeed-MoE).
  Sharding the batch over ``data`` alone would make every device of an expert group
  run the same attention on the same rows, and the EP exchange needs each device of the
  group to hold different tokens anyway.
- Routed-expert weights ``e_gate/e_up/e_down`` [L, E, ...] (and their optimizer state)
  are sharded on E over ``expert`` and replicated over ``data``.
- Everything else is replicated by default. At the sizes this lab trains the routed experts
  are most of the parameters and they are already split; replicating the rest keeps the
  step's collectives to the gradient all-reduce plus the EP all-to-alls, with no per-layer
  all-gather (and the losses bit-identical to what they were).
- FSDP (``fsdp=True``: ``TrainConfig.fsdp``, off by default): the params and
  the optimizer state are stored split over every device. A non-expert leaf splits one axis
  over ``("data", "expert")`` together (the expert axis is a data-parallel axis for it), else
  over ``data``; stacked layer weights [L, ...] never split L, so each scan iteration slices
  one layer and gathers only that layer. Routed-expert leaves keep E on ``expert`` and split
  one more axis over ``data``. With a sequence split, ``sequence`` joins ``data`` in both (its
  devices hold the same weights). The step stays a plain jit over these NamedShardings: XLA's
  SPMD partitioner inserts each weight's all-gather before its use and reduces its gradient
  back onto the shards (measured on the 2 x 2 tiny-MoE step: 31 of its 35 all-gathers are
  inside the layer scans' loop bodies, i.e. per layer). Replicated by
  design: the run's small values (``REPLICATED_FIELDS``: guard windows, router bias, step,
  RNG key), scalars (the optimizer's count) and any leaf no axis of which divides.
- Context parallelism (``sequence`` > 1: ``TrainConfig.sequence_parallel``): each row's
  positions are split over ``sequence`` in contiguous chunks, and attention runs through
  ``kernels.attention.SequenceParallel`` (each device's queries over the keys and values
  all-gathered along the axis). Every other op is per position, so XLA runs it on the chunk
  it holds; the weights are replicated over ``sequence`` (its devices are data-parallel for
  them: the gradient is summed over it like over ``data``). The EP layer takes the flattened
  tokens as split over ``("data", "expert", "sequence")``, the order a [B, S] batch split
  over rows and positions flattens to, so nothing moves before the exchange. A ``sequence``
  group may span processes: each of its processes reads the group's whole rows, and
  ``shard_batch`` hands each device its chunk of positions out of them. The axis sits between
  ``data`` and ``expert``, so the layer-by-layer all-gather of K and V stays on the devices
  nearest each other after the expert exchange's.
- One device is the degenerate 1 x 1 x 1 mesh of the same code: the same shard_map EP
  layer runs with an expert axis of size 1.

Processes: every process runs the same program on the same global batch order; each
reads only its own rows (``process_rows``) and ``shard_batch`` assembles the global array.
State leaves become host numpy through ``host_state`` (a collective: every process calls
it). Joining the job and the host-side syncs (``is_writer``, ``agree``, ``barrier``) are
``marin_assets/train/distributed/hosts.py``.

Environment:
  MARIN_EXPERT_PARALLEL      size of the expert axis (default: the largest divisor of the
      device count that divides n_routed_experts and fits in one EP domain)
  MARIN_EP_DOMAIN_CHIPS      devices of one EP domain, the expert axis's bound (default: one
      process's); the manifests set it from the fleet pool's ``ep_domain_chips``. The devices
      are laid out process by process, so an expert axis larger than a process's devices spans
      consecutive processes (the shard_map all-to-all then crosses them).
  MARIN_HOSTS_PER_DOMAIN     processes of one interconnect domain: no expert group straddles two
"""

from __future__ import annotations

import itertools
import logging
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from kernels.expert_parallel import ExpertParallel
from marin_assets.train.data.batches import MaskedRows
from marin_assets.train.distributed.hosts import barrier, positive_env

log = logging.getLogger(__name__)

AXES = ("data", "sequence", "expert")
BATCH_AXES = ("data", "expert")  # the batch's rows are split over both (see the module docstring)
SEQUENCE_AXIS = "sequence"  # each row's positions are split over it (context parallelism)
TOKEN_AXES = (*BATCH_AXES, SEQUENCE_AXIS)  # the flattened [B * S] tokens' split (the EP layer's)
EXPERT_WEIGHTS = ("e_gate", "e_up", "e_down")  # [L, E, ...]: sharded on axis 1
# Top-level state fields FSDP leaves replicated: small, and read whole by every device each step.
REPLICATED_FIELDS = ("guard", "router_bias", "step", "rng")


# -- the mesh ---------------------------------------------------------------------------


def default_expert_size(model_config, n_devices: int, ep_domain: int, domain_devices: int | None = None) -> int:
    """Largest e dividing the device count and the expert count, within one EP domain (``ep_domain``
    devices: one process's, or the fleet's ``ep_domain_chips``, so the EP all-to-all stays on the
    fastest links) and, on a job of several interconnect domains of ``domain_devices`` each,
    dividing one (no expert group straddles two domains); 1 for a dense model."""
    experts = getattr(model_config, "n_routed_experts", 0)
    if experts <= 0:
        return 1
    per_domain = domain_devices or n_devices
    return max(
        e for e in range(1, min(n_devices, ep_domain) + 1) if n_devices % e == 0 and experts % e == 0 and per_domain % e == 0
    )


def expert_axis_size(model_config, n_devices: int, per_process: int, env: Mapping[str, str]) -> int:
    """The expert axis size a job's environment asks for (pure: no JAX): MARIN_EXPERT_PARALLEL,
    else ``default_expert_size`` within an EP domain of MARIN_EP_DOMAIN_CHIPS devices (the fleet
    pool's ``ep_domain_chips``, which the manifests put in every pod's env), else of one process.
    Raises a ValueError naming the variable when an explicit size leaves its EP domain."""
    ep_domain = positive_env(env, "MARIN_EP_DOMAIN_CHIPS", None)
    expert = positive_env(env, "MARIN_EXPERT_PARALLEL", None)
    if expert is not None:
        if ep_domain is not None and expert > ep_domain:
            raise ValueError(f"MARIN_EXPERT_PARALLEL={expert} is larger than the EP domain (MARIN_EP_DOMAIN_CHIPS={ep_domain})")
        return expert
    hosts = positive_env(env, "MARIN_HOSTS_PER_DOMAIN", None)
    # Only a mesh over whole domains has domains to keep groups inside (not a subset of the devices).
    domain_devices = hosts * per_process if hosts is not None and n_devices % (hosts * per_process) == 0 else None
    return default_expert_size(model_config, n_devices, ep_domain or per_process, domain_devices)


def ep_device_order(devices: list) -> list:
    """Devices process by process (then by id): a row of the mesh's expert axis is then a run of
    whole, consecutive processes (an EP domain), or part of one process."""
    return sorted(devices, key=lambda d: (d.process_index, d.id))


def make_mesh(
    model_config=None, expert: int | None = None, devices=None, env: Mapping[str, str] | None = None, sequence: int = 1
):
    """A ``("data", "sequence", "expert")`` mesh over ``devices`` (default: every global device).

    expert: the expert axis size; None: ``expert_axis_size`` of the environment (module docstring),
    chosen among the devices one sequence chunk leaves. sequence: the context-parallel axis size.
    ``sequence`` and ``expert`` are the minor axes over ``ep_device_order``, so either may span
    processes (the processes of a sequence group read the same rows: ``process_rows``).
    """
    import jax
    from jax.sharding import Mesh

    env = os.environ if env is None else env
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    if not isinstance(sequence, int) or sequence < 1 or n % sequence:
        raise ValueError(f"sequence axis size {sequence!r} (TrainConfig.sequence_parallel) does not divide the {n} devices")
    if expert is None:
        expert = expert_axis_size(model_config, n // sequence, max(jax.local_device_count() // sequence, 1), env)
    if expert < 1 or n % (sequence * expert):
        raise ValueError(
            f"expert axis size {expert} does not divide the {n // sequence} devices a sequence axis of {sequence} leaves"
        )
    experts = getattr(model_config, "n_routed_experts", 0)
    if experts and experts % expert:
        raise ValueError(f"expert axis size {expert} does not divide n_routed_experts={experts}")
    shape = (n // (sequence * expert), sequence, expert)
    if devices == list(jax.devices()) and devices[0].platform == "tpu":
        mesh = jax.make_mesh(shape, AXES)  # the slice's topology-aware order
    else:
        mesh = Mesh(np.asarray(ep_device_order(devices)).reshape(shape), AXES)
    return mesh


def train_mesh(config):
    """The mesh a TrainConfig trains on: every global device, the expert axis the environment asks for,
    the sequence axis ``config.sequence_parallel``."""
    return make_mesh(config.model, sequence=config.sequence_parallel)


def expert_parallel(mesh, model_config):
    """The routed-expert layer for ``loss_fn(..., ep=...)``; None for a dense model."""
    if not model_config.is_moe:
        return None
    return ExpertParallel(
        mesh,
        axis="expert",
        token_axes=TOKEN_AXES,
        transport=model_config.ep_transport,
        capacity_factor_send=model_config.capacity_factor_send,
        capacity_factor_recv=model_config.capacity_factor_recv,
        grouped_matmul=model_config.grouped_matmul,
    )


def context_parallel(mesh, batch_axes: tuple[str, ...] = BATCH_AXES):
    """The attention of a mesh whose sequence axis splits each row (``loss_fn(..., sp=...)``); None when it
    does not (size 1). ``batch_axes``: the axes the rows are split over (``()``: every device holds every
    row, as the held-out loss places them)."""
    from kernels.attention import SequenceParallel  # deferred (import cost): jax

    return SequenceParallel(mesh, SEQUENCE_AXIS, batch_axes) if mesh.shape[SEQUENCE_AXIS] > 1 else None


def check_fits(mesh, model_config, batch_size: int, seq_len: int, microbatches: int = 1, sequence: int = 1) -> None:
    """What would otherwise fail inside the first step. ``microbatches`` (``TrainConfig.microbatches``):
    each microbatch is split over the batch shards too (train/accumulate.py). ``sequence``
    (``TrainConfig.sequence_parallel``): the sequence axis the mesh must have, which splits seq_len."""
    shards = math.prod(mesh.shape[a] for a in BATCH_AXES)
    if mesh.shape[SEQUENCE_AXIS] != sequence:
        raise ValueError(
            f"TrainConfig.sequence_parallel is {sequence} but mesh {dict(mesh.shape)} has a sequence axis of "
            f"{mesh.shape[SEQUENCE_AXIS]}"
        )
    if seq_len % sequence:
        raise ValueError(
            f"seq_len {seq_len} does not split into the {sequence} chunks of the sequence axis (TrainConfig.sequence_parallel)"
        )
    if batch_size % shards:
        raise ValueError(f"batch_size {batch_size} is not divisible by the {shards} batch shards of mesh {dict(mesh.shape)}")
    if (batch_size // microbatches) % shards:
        raise ValueError(
            f"TrainConfig.microbatches ({microbatches}): a microbatch of batch_size {batch_size} / {microbatches} = "
            f"{batch_size // microbatches} rows is not divisible by the {shards} batch shards of mesh "
            f"{dict(mesh.shape)}"
        )
    if model_config.is_moe and model_config.n_routed_experts % mesh.shape["expert"]:
        raise ValueError(
            f"n_routed_experts {model_config.n_routed_experts} is not divisible by the expert axis ({mesh.shape['expert']})"
        )


# -- shardings ----------------------------------------------------------------------------


def _key_names(path) -> list[str]:
    return [str(getattr(k, "key", getattr(k, "name", ""))) for k in path]


def _largest_divisible_axis(shape, axes, size: int) -> int | None:
    """The largest of ``axes`` of ``shape`` that splits evenly into ``size`` non-empty parts."""
    fits = [a for a in axes if shape[a] >= size and shape[a] % size == 0]
    return max(fits, key=lambda a: shape[a], default=None)


def _spec_with(ndim: int, axis: int, entry, base=()):
    from jax.sharding import PartitionSpec as P

    entries = list(base) + [None] * (ndim - len(base))
    entries[axis] = entry
    return P(*entries)


def _weight_data_axes(mesh) -> tuple[str, ...]:
    """The axes whose devices are data-parallel for every weight: ``data``, and ``sequence`` when it splits the
    rows' positions (named only then, so a mesh without a split keeps the specs it always had)."""
    return ("data", SEQUENCE_AXIS) if mesh.shape[SEQUENCE_AXIS] > 1 else ("data",)


def _fsdp_spec(names: list[str], shape, mesh, expert_weight: bool):
    """The FSDP layout of one params/optimizer leaf (see the module docstring)."""
    from jax.sharding import PartitionSpec as P

    dp_axes = _weight_data_axes(mesh)
    dp = dp_axes if len(dp_axes) > 1 else "data"  # one axis is named bare, as FSDP always named it
    ndim, data = len(shape), math.prod(mesh.shape[a] for a in dp_axes)
    everyone = data * mesh.shape["expert"]
    if expert_weight:
        axis = _largest_divisible_axis(shape, range(2, ndim), data)
        return P(None, "expert") if axis is None or data == 1 else _spec_with(ndim, axis, dp, (None, "expert"))
    first = 1 if "layers" in names and ndim > 1 else 0  # stacked [L, ...]: a scan step reads one layer
    axes = range(first, ndim)
    for entry, size in (((*dp_axes, "expert"), everyone), (dp, data)):
        axis = _largest_divisible_axis(shape, axes, size)
        if axis is not None and size > 1:
            return _spec_with(ndim, axis, entry)
    return P()


def param_spec(path, leaf, mesh=None, fsdp: bool = False):
    """PartitionSpec of one state leaf. Default: expert weights (and their optimizer moments,
    which share their names and shapes) split on E over ``expert``, everything else replicated;
    ``fsdp`` (needs ``mesh``): ``_fsdp_spec`` for every leaf outside ``REPLICATED_FIELDS``."""
    from jax.sharding import PartitionSpec as P

    names = _key_names(path)
    expert_weight = np.ndim(leaf) == 4 and any(name in EXPERT_WEIGHTS for name in names)
    if fsdp and np.ndim(leaf) > 0 and not (names and names[0] in REPLICATED_FIELDS):
        return _fsdp_spec(names, np.shape(leaf), mesh, expert_weight)
    return P(None, "expert") if expert_weight else P()


def state_shardings(mesh, state, fsdp: bool = False) -> Any:
    """A NamedSharding per leaf of ``state`` (arrays or ShapeDtypeStructs; any pytree,
    dict or dataclass). fsdp: the FSDP layout (module docstring; ``TrainConfig.fsdp``)."""
    import jax
    from jax.sharding import NamedSharding

    def one(path, leaf):
        spec = param_spec(path, leaf, mesh, fsdp)
        for axis, entry in enumerate(spec):
            parts = math.prod(mesh.shape[a] for a in ((entry,) if isinstance(entry, str) else entry or ()))
            if leaf.shape[axis] % parts:
                raise ValueError(
                    f"state leaf {jax.tree_util.keystr(path)} {leaf.shape}: axis {axis} is not "
                    f"divisible by the {entry} axis ({parts})"
                )
        return NamedSharding(mesh, spec)

    return jax.tree_util.tree_map_with_path(one, state)


def per_device_bytes(state, shardings) -> int:
    """Bytes of ``state`` (arrays or ShapeDtypeStructs) one device holds under ``shardings``
    (the largest shard of each leaf, summed)."""
    import jax

    def one(leaf, sharding) -> int:
        return math.prod(sharding.shard_shape(leaf.shape)) * np.dtype(leaf.dtype).itemsize

    return sum(jax.tree.leaves(jax.tree.map(one, state, shardings)))


def replicated(mesh):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    return NamedSharding(mesh, P())


def positions_sharding(mesh):
    """[B, S] arrays with every row on every device and the positions over "sequence" (the held-out loss)."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    return NamedSharding(mesh, P(None, SEQUENCE_AXIS))


def batch_sharding(mesh):
    """[B, S] tokens: rows over ("data", "expert"), positions over "sequence"."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    return NamedSharding(mesh, P(BATCH_AXES, SEQUENCE_AXIS))


def process_rows(mesh, global_batch: int) -> slice:
    """The rows of each global batch this process holds (and so should read): whole rows, even where a
    sequence group spans processes and this process's devices hold only some of their positions."""
    sharding = batch_sharding(mesh)
    starts, stops = [], []
    for index in sharding.addressable_devices_indices_map((global_batch, mesh.shape[SEQUENCE_AXIS])).values():
        rows = index[0]
        starts.append(rows.start or 0)
        stops.append(global_batch if rows.stop is None else rows.stop)
    lo, hi = min(starts), max(stops)
    covered = sum(b - a for a, b in set(zip(starts, stops, strict=True)))
    if covered != hi - lo:
        raise ValueError(f"this process's batch rows are not contiguous on mesh {dict(mesh.shape)}")
    return slice(lo, hi)


def shard_batch(mesh, local_rows, global_batch: int):
    """This process's rows (``process_rows``) -> the global [B, S] array on the mesh; a ``MaskedRows``
    (tokens, loss mask, segment ids or None) -> the same of global arrays. The rows come whole: where
    the positions are split over devices of several processes, each device takes its chunk from them
    (``jax.make_array_from_process_local_data`` looks up a dimension given whole)."""
    import jax

    if isinstance(local_rows, MaskedRows):
        return local_rows._make(None if part is None else shard_batch(mesh, part, global_batch) for part in local_rows)
    rows = process_rows(mesh, global_batch)
    if local_rows.shape[0] != rows.stop - rows.start:
        raise ValueError(
            f"shard_batch: got {local_rows.shape[0]} rows, this process holds rows [{rows.start}, {rows.stop}) of {global_batch}"
        )
    return jax.make_array_from_process_local_data(
        batch_sharding(mesh), np.asarray(local_rows), (global_batch,) + tuple(local_rows.shape[1:])
    )


def place_state(host_state, shardings):
    """Host arrays (the same on every process, e.g. a loaded checkpoint) -> global arrays."""
    import jax

    def put(x, sharding):
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    return jax.tree.map(put, host_state, shardings)


def host_state(state):
    """Global arrays -> numpy (every leaf whole). A collective: every process must call it."""
    import jax
    from jax.experimental import multihost_utils

    def get(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return np.asarray(jax.device_get(x))
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    return jax.tree.map(get, state)


# -- the step -------------------------------------------------------------------------------


def jit_step(step: Callable, mesh, state_sh, n_scalars: int = 2, donate: bool = True) -> Callable:
    """jit ``step(state, tokens, *scalars) -> (state, metrics)`` with the mesh's layout.

    state in/out: ``state_sh``; tokens: ``batch_sharding``; the ``n_scalars`` host scalars
    (e.g. batch_ok, phase_start) and every metric: replicated.
    """
    import jax

    rep = replicated(mesh)
    jitted = jax.jit(
        step,
        in_shardings=(state_sh, batch_sharding(mesh)) + (rep,) * n_scalars,
        out_shardings=(state_sh, rep),
        donate_argnums=(0,) if donate else (),
    )
    if jax.process_count() == 1:
        return jitted
    return _compile_then_meet(jitted)


_COMPILED_STEPS = itertools.count()


def _compile_then_meet(jitted: Callable) -> Callable:
    """Compile on the first call, then wait for every process before running: peers compile
    at different speeds, and the step's first collective must not wait on a slow compile."""
    compiled = None
    name = f"step-compiled-{next(_COMPILED_STEPS)}"  # the same sequence on every process

    def run(*args):
        nonlocal compiled
        if compiled is None:
            compiled = jitted.lower(*args).compile()
            barrier(name)
        return compiled(*args)

    return run


def init_sharded(init: Callable[[], Any], mesh, fsdp: bool = False) -> Any:
    """Run ``init()`` (deterministic, e.g. from a seed) straight into the mesh's layout
    (``state_shardings``), so no process ever holds an unsharded copy on device."""
    import jax

    shape = jax.eval_shape(init)
    return jax.jit(init, out_shardings=state_shardings(mesh, shape, fsdp))()
