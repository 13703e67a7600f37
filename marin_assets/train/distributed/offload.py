"""Optimizer-state offload: the Adam moments live in host memory between steps (``TrainConfig.offload_optimizer``).

The moments are two parameter-sized trees that the step reads once and writes once, so
they are the first state to move off the accelerator when it is full: the seeds' main run
holds ~16 bytes of state per parameter, 8 of them the fp32 moments. We use JAX's memory
kinds (the "host offloading" pattern of the JAX docs): the moments' shardings carry
``memory_kind="pinned_host"``, so they are stored in pinned host memory; the jitted step
takes them in and out there, copies them to device memory at its start
(``jax.device_put`` to the same sharding's ``device`` kind) and back to the host at its end,
and XLA schedules those copies as part of the step.

Which backends can run it is measured, not listed: ``host_offload_problem`` compiles a
two-copy probe on the mesh's platform once. Measured with jax 0.7.2: XLA:CPU lowers it but
cannot compile it ("No registered implementation for untyped custom call to
annotate_device_placement for Host"), so on CPU the knob is refused with that reason before
training starts. On CPU it would save nothing anyway: "device" and "pinned_host" are both
the machine's RAM. GPU and TPU register the placement; no GPU was lent to measure it here.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from marin_assets.train.state import TrainState

HOST = "pinned_host"
DEVICE = "device"


@functools.cache
def _probe(platform: str) -> str | None:
    """None if a jitted host -> device -> host copy compiles on ``platform``, else XLA's reason."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    device = next(d for d in jax.devices() if d.platform == platform)
    mesh = Mesh([device], ("probe",))
    host, dev = NamedSharding(mesh, P(), memory_kind=HOST), NamedSharding(mesh, P(), memory_kind=DEVICE)

    def moment_update(m, g):
        return jax.device_put(0.9 * jax.device_put(m, dev) + g, host)

    try:
        moment, grad = (jax.ShapeDtypeStruct((8,), jnp.float32, sharding=s) for s in (host, dev))
        jax.jit(moment_update, in_shardings=(host, dev), out_shardings=host).lower(moment, grad).compile()
    except Exception as e:  # XLA reports an unsupported placement as a runtime error at compile time
        return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"
    return None


def host_offload_problem(mesh) -> str | None:
    """Why the optimizer state cannot live in host memory on ``mesh``'s devices, or None if it can."""
    platform = mesh.devices.flat[0].platform
    kinds = {m.kind for m in mesh.devices.flat[0].addressable_memories()}
    if HOST not in kinds:
        return f"the {platform} device has no {HOST!r} memory (its memories: {sorted(kinds)})"
    return _probe(platform)


def check_supported(mesh) -> None:
    """Raise a clear error when ``offload_optimizer`` cannot run on ``mesh``'s backend."""
    problem = host_offload_problem(mesh)
    if problem is not None:
        platform = mesh.devices.flat[0].platform
        raise ValueError(
            f"TrainConfig.offload_optimizer: the {platform} backend cannot keep the optimizer state in "
            f"host memory inside the jitted step ({problem}); train with offload_optimizer: false here"
        )


def with_kind(shardings: Any, kind: str) -> Any:
    """The same shardings with every leaf's memory kind set to ``kind``."""
    return jax.tree.map(lambda s: s.with_memory_kind(kind), shardings)


def offloaded(state_sh: TrainState) -> TrainState:
    """``state_sh`` with the optimizer state's shardings in host memory; the rest stays on device."""
    return state_sh.replace(opt_state=with_kind(state_sh.opt_state, HOST))


def to_device(opt_state: Any, host_shardings: Any) -> Any:
    """Inside the step: the host-resident optimizer state copied into device memory."""
    return jax.device_put(opt_state, with_kind(host_shardings, DEVICE))


def to_host(opt_state: Any, host_shardings: Any) -> Any:
    """Inside the step: the updated optimizer state copied back to its host shardings."""
    return jax.device_put(opt_state, host_shardings)
